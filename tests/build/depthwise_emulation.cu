// Host emulation of the depthwise kernel's per-thread work (emit/templates/depthwise.cuh):
// co_depthwise::accumulate and ::finish called for every (n, p, q tile, channel
// vector) a grid would cover, and the tiled form's tile staging (plan_tiling,
// tile_origin, tile_source, tile_offset) and accumulate_tile for every block and
// thread of its grid, on the CPU, against a direct depthwise conv in double
// rounded once to fp16, on random geometries (padding, vertical stride, ragged Q
// tiles) and every epilogue form. Compiled by nvcc as host code (no GPU needed) and
// run by test_depthwise_emulation.py with the header paths defined.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include <cutlass/cutlass.h>
#include <cutlass/array.h>
#include <cutlass/numeric_types.h>
#include PRELUDE_HEADER
#include ACTIVATIONS_HEADER     // the unit's preamble (emit/depthwise.py)
#include DEPTHWISE_HEADER
#include DEPTHWISE_TILED_HEADER

using T = cutlass::half_t;
using namespace co_depthwise;

struct HostTaps {
  const T* filter;   // (C, R, S)
  int c0, rs;
  void operator()(int tap, float (&w)[kVec]) const {
    for (int e = 0; e < kVec; ++e) w[e] = float(filter[(c0 + e) * rs + tap]);
  }
};

static double act(int a, double v) {
  switch (a) {
    case kRelu: return v > 0 ? v : 0;
    case kGeluErf: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case kGeluTanh: return 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case kSilu: return v / (1 + std::exp(-v));
    case kSigmoid: return 1 / (1 + std::exp(-v));
    case kHardSwish: return v * std::min(std::max(v + 3, 0.0), 6.0) / 6;
    case kHardSigmoid: return std::min(std::max(v + 3, 0.0), 6.0) / 6;
    case kQuickGelu: return v / (1 + std::exp(-1.702 * v));
    default: return v;
  }
}

// y against a direct depthwise conv in double, rounded once: the count of outputs off.
template <int S, int SW, int Act, int Res, bool Bc, int Post>
static int compare(const Geometry& g, const std::vector<T>& x, const std::vector<T>& f,
                   const std::vector<T>& b, const std::vector<T>& res, const std::vector<T>& y,
                   bool bias_on) {
  int fails = 0;
  for (int n = 0; n < g.n; ++n)
    for (int p = 0; p < g.p; ++p)
      for (int q = 0; q < g.q; ++q)
        for (int c = 0; c < g.c; ++c) {
          double s = 0;
          for (int r = 0; r < g.r; ++r)
            for (int k = 0; k < S; ++k) {
              const int hh = p * g.stride_h - g.pad_h + r, ww = q * SW - g.pad_w + k;
              if (hh < 0 || hh >= g.h || ww < 0 || ww >= g.w) continue;
              s += double(float(x[((size_t(n) * g.h + hh) * g.w + ww) * g.c + c])) *
                   double(float(f[(size_t(c) * g.r + r) * S + k]));
            }
          const size_t at = ((size_t(n) * g.p + p) * g.q + q) * g.c + c;
          double v = act(Act, s + (bias_on ? double(float(b[c])) : 0.0));
          const double rv = Res == kNone ? 0.0 : double(float(res[Bc ? c : at]));
          if (Res == kAdd) v += rv;
          if (Res == kMul) v *= rv;
          if (Post == kRelu) v = v > 0 ? v : 0;
          const double got = double(float(y[at]));
          // one fp16 rounding of the fp32 result (2^-11 relative) plus fp32 and the
          // transcendental's error
          if (!(std::fabs(got - v) <= 1e-3 * std::fabs(v) + 2e-3)) {
            if (fails++ < 5)
              std::printf("S=%d SW=%d act=%d res=%d at (%d,%d,%d,%d): got %g want %g\n", S, SW, Act, Res,
                          n, p, q, c, got, v);
          }
        }
  return fails;
}

// Random operands of a problem of geometry g (values k / 8, k in -8..8, exact in fp16):
// x, the (C, R, S) filter, a bias, the residual (full or per channel) and y poisoned.
struct Operands {
  std::vector<T> x, f, b, res, y;
};

template <int S, bool Bc>
static Operands random_operands(std::mt19937& rng, const Geometry& g) {
  auto R = [&] { return T(float(int(rng() % 17) - 8) / 8.f); };
  Operands o;
  o.x.resize(size_t(g.n) * g.h * g.w * g.c);
  o.f.resize(size_t(g.c) * g.r * S);
  o.b.resize(g.c);
  for (auto* v : {&o.x, &o.f, &o.b})
    for (auto& e : *v) e = R();
  const size_t out_n = size_t(g.n) * g.p * g.q * g.c;
  o.res.resize(Bc ? size_t(g.c) : out_n);
  for (auto& e : o.res) e = R();
  o.y.assign(out_n, T(-77.f));
  return o;
}

template <int S, int SW, int QT, int Act, int Res, bool Bc, int Post>
static int trial(std::mt19937& rng, bool bias_on) {
  auto U = [&](int lo, int hi) { return lo + int(rng() % unsigned(hi - lo + 1)); };
  Geometry g{};
  g.n = U(1, 2); g.c = 8 * U(1, 3); g.h = U(1, 11); g.w = U(1, 13); g.r = U(1, 7);
  g.pad_h = U(0, 3); g.pad_w = U(0, 3); g.stride_h = U(1, 3);
  const int pad_b = U(0, 3), pad_r = U(0, 3);
  g.p = (g.h + g.pad_h + pad_b - g.r) / g.stride_h + 1;
  g.q = (g.w + g.pad_w + pad_r - S) / SW + 1;
  if (g.p < 1 || g.q < 1) return 0;
  g.q_tiles = (g.q + QT - 1) / QT;
  Operands o = random_operands<S, Bc>(rng, g);
  auto &x = o.x, &f = o.f, &b = o.b, &res = o.res, &y = o.y;
  for (int n = 0; n < g.n; ++n)
    for (int p = 0; p < g.p; ++p)
      for (int qt = 0; qt < g.q_tiles; ++qt)
        for (int c0 = 0; c0 < g.c; c0 += kVec) {
          float acc[QT][kVec];
          accumulate<T, S, SW, QT>(x.data(), g, n, p, qt * QT, c0, HostTaps{f.data(), c0, g.r * S}, acc);
          for (int t = 0; t < QT && qt * QT + t < g.q; ++t) {
            const size_t at = ((size_t(n) * g.p + p) * g.q + qt * QT + t) * g.c + c0;
            finish<T, Act, Res, Post>(acc[t], bias_on ? b.data() + c0 : nullptr,
                                      Res == kNone ? nullptr : (Bc ? res.data() + c0 : res.data() + at),
                                      y.data() + at);
          }
        }
  return compare<S, SW, Act, Res, Bc, Post>(g, x, f, b, res, y, bias_on);
}


// The tiled form (templates/depthwise_tiled.cuh) on a random square-filter problem:
// every block's tile staged as the kernel stages it, every thread's outputs.
template <int S, int SW, int PT, int QT, int Act, int Res, bool Bc, int Post>
static int trial_tiled(std::mt19937& rng, bool bias_on) {
  auto U = [&](int lo, int hi) { return lo + int(rng() % unsigned(hi - lo + 1)); };
  Geometry g{};
  g.n = U(1, 2); g.c = 8 * U(1, 12); g.h = U(1, 23); g.w = U(1, 37); g.r = S;
  g.pad_h = U(0, S / 2 + 1); g.pad_w = U(0, S / 2 + 1); g.stride_h = SW;
  g.p = (g.h + 2 * g.pad_h - S) / SW + 1;
  g.q = (g.w + 2 * g.pad_w - S) / SW + 1;
  if (g.p < 1 || g.q < 1) return 0;
  Tiling t;
  if (!plan_tiling<T, S, SW, PT, QT>(g, t)) return 0;
  Operands o = random_operands<S, Bc>(rng, g);
  auto &x = o.x, &f = o.f, &b = o.b, &res = o.res, &y = o.y;
  std::vector<T> tile(size_t(t.ih) * t.iw * t.m * kVec);
  for (int block = 0; block < g.n * t.tiles_p * t.tiles_q; ++block) {
    const TileOrigin o = tile_origin<SW, PT, QT>(g, t, block);
    for (int c_base = 0; c_base < g.c; c_base += t.cv * kVec) {
      std::fill(tile.begin(), tile.end(), T(-99.f));        // a cell never staged shows
      for (int row = 0; row < t.ih; ++row)
        for (int col = 0; col < t.iw; ++col)
          for (int v = 0; v < t.cv; ++v) {
            const int64_t from = tile_source(g, o, row, col, c_base + v * kVec);
            for (int e = 0; e < kVec; ++e)
              tile[tile_offset(t, row, col, v) + e] = from < 0 ? T(0.f) : x[from + e];
          }
      for (int pgi = 0; pgi < t.tp; ++pgi)
        for (int qg = 0; qg < t.tq; ++qg)
          for (int v = 0; v < t.cv; ++v) {
            const int c0 = c_base + v * kVec;
            float acc[PT][QT][kVec];
            accumulate_tile<T, S, SW, PT, QT>(tile.data(), t, pgi * PT * SW, qg * QT * SW, v,
                                              HostTaps{f.data(), c0, S * S}, acc);
            for (int pt = 0; pt < PT; ++pt)
              for (int qt = 0; qt < QT; ++qt) {
                const int p = o.p0 + pgi * PT + pt, q = o.q0 + qg * QT + qt;
                if (p >= g.p || q >= g.q) continue;
                const size_t at = ((size_t(o.n) * g.p + p) * g.q + q) * g.c + c0;
                finish<T, Act, Res, Post>(acc[pt][qt], bias_on ? b.data() + c0 : nullptr,
                                          Res == kNone ? nullptr : (Bc ? res.data() + c0 : res.data() + at),
                                          y.data() + at);
              }
          }
    }
  }
  return compare<S, SW, Act, Res, Bc, Post>(g, x, f, b, res, y, bias_on);
}

int main() {
  std::mt19937 rng(7);
  int fails = 0, runs = 0;
  for (int i = 0; i < 40; ++i) {
    const bool bias = i % 3 != 0;
    fails += trial<7, 1, 4, kIdentity, kNone, false, kIdentity>(rng, bias);
    fails += trial<3, 1, 2, kSilu, kNone, false, kIdentity>(rng, bias);
    fails += trial<3, 2, 4, kRelu, kAdd, false, kRelu>(rng, bias);
    fails += trial<5, 2, 2, kGeluErf, kMul, true, kIdentity>(rng, bias);
    fails += trial<5, 1, 4, kSigmoid, kAdd, true, kRelu>(rng, bias);
    fails += trial<1, 1, 2, kGeluTanh, kNone, false, kIdentity>(rng, bias);
    fails += trial<9, 2, 4, kIdentity, kMul, false, kIdentity>(rng, bias);
    fails += trial<3, 1, 4, kHardSwish, kAdd, false, kIdentity>(rng, bias);
    fails += trial<3, 2, 2, kHardSigmoid, kNone, false, kIdentity>(rng, bias);
    fails += trial<7, 1, 4, kQuickGelu, kMul, true, kIdentity>(rng, bias);
    fails += trial_tiled<7, 1, 2, 2, kIdentity, kNone, false, kIdentity>(rng, bias);
    fails += trial_tiled<3, 1, 2, 2, kSilu, kAdd, false, kIdentity>(rng, bias);
    fails += trial_tiled<3, 2, 4, 2, kRelu, kMul, true, kRelu>(rng, bias);
    fails += trial_tiled<5, 1, 1, 4, kSilu, kNone, false, kIdentity>(rng, bias);
    fails += trial_tiled<5, 2, 2, 4, kGeluErf, kAdd, false, kIdentity>(rng, bias);
    fails += trial_tiled<3, 1, 4, 1, kIdentity, kNone, false, kIdentity>(rng, bias);
    runs += 16;
  }
  std::printf("trials %d fails %d\n", runs, fails);
  return fails != 0;
}
