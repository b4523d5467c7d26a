// Host emulation of co_im2col::pack (emit/templates/im2col.cuh): every thread of the
// grid run in a loop on the CPU against a direct im2col, on random conv geometries
// (odd C, C a multiple of 8, padding, stride, dilation, row chunks, a grid smaller
// than the work).
// Compiled and run by test_im2col_emulation.py with IM2COL_HEADER defined.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
struct Dim { unsigned x = 0, y = 0, z = 0; };
static Dim blockIdx, threadIdx, blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
static uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
#define __global__
#define __launch_bounds__(x)
#define __restrict__
#include IM2COL_HEADER
int main(int argc, char** argv) {
  std::mt19937 rng(1);
  int fails = 0;
  for (int trial = 0; trial < 300; ++trial) {
    co_im2col::Geometry g{};
    auto U = [&](int lo, int hi) { return lo + int(rng() % (hi - lo + 1)); };
    // C % 8 == 0 in a quarter of the trials: the pack's 16-byte path
    g.n = U(1, 3); g.c = trial % 4 == 3 ? 8 * U(1, 3) : U(1, 7); g.h = U(1, 12); g.w = U(1, 12); g.k = 8 * U(1, 3);
    g.r = U(1, 5); g.s = U(1, 5); g.pad_h = U(0, 3); g.pad_w = U(0, 3);
    g.stride_h = U(1, 3); g.stride_w = U(1, 3); g.dilation_h = U(1, 2); g.dilation_w = U(1, 2);
    int64_t pad_b = U(0, 3), pad_r = U(0, 3);
    g.p = (g.h + g.pad_h + pad_b - g.dilation_h * (g.r - 1) - 1) / g.stride_h + 1;
    g.q = (g.w + g.pad_w + pad_r - g.dilation_w * (g.s - 1) - 1) / g.stride_w + 1;
    if (g.p < 1 || g.q < 1) continue;
    g.kp = (g.r * g.s * g.c + 7) / 8 * 8;
    int64_t m = g.n * g.p * g.q;
    g.row0 = U(0, int(m - 1)); g.rows = m - g.row0; g.b_rows = g.row0 == 0 ? g.k : 0;
    if (trial % 3 == 0) { g.row0 = 0; g.rows = m; g.b_rows = g.k; }
    std::vector<uint16_t> x(g.n * g.h * g.w * g.c), f(g.k * g.r * g.s * g.c);
    for (auto& v : x) v = uint16_t(1 + rng() % 60000);
    for (auto& v : f) v = uint16_t(1 + rng() % 60000);
    std::vector<uint16_t> a(g.rows * g.kp, 0xFFFF), b(g.k * g.kp, 0xFFFF);
    int chunks = g.kp / 8, pairs = (chunks + 1) / 2;
    int64_t threads = (g.rows + g.b_rows) * pairs * 2;
    blockDim.x = 256; gridDim.x = unsigned((threads + 255) / 256);
    if (trial % 2) gridDim.x = gridDim.x > 3 ? 3 : gridDim.x;   // grid-stride path too
    for (unsigned bx = 0; bx < gridDim.x; ++bx)
      for (unsigned tx = 0; tx < 256; ++tx) {
        blockIdx.x = bx; threadIdx.x = tx;
        co_im2col::pack<uint16_t>(x.data(), f.data(), a.data(), b.data(), g);
      }
    for (int64_t i = 0; i < g.rows; ++i) {
      int64_t pix = g.row0 + i, n = pix / (g.p * g.q), rest = pix % (g.p * g.q), p = rest / g.q, q = rest % g.q;
      for (int64_t j = 0; j < g.kp; ++j) {
        uint16_t want = 0;
        if (j < g.r * g.s * g.c) {
          int64_t r = j / (g.s * g.c), s = (j / g.c) % g.s, c = j % g.c;
          int64_t hh = p * g.stride_h - g.pad_h + r * g.dilation_h, ww = q * g.stride_w - g.pad_w + s * g.dilation_w;
          if (hh >= 0 && hh < g.h && ww >= 0 && ww < g.w) want = x[((n * g.h + hh) * g.w + ww) * g.c + c];
        }
        if (a[i * g.kp + j] != want) { if (fails++ < 5) printf("A mismatch trial %d row %ld col %ld\n", trial, (long)i, (long)j); }
      }
    }
    if (g.b_rows)
      for (int64_t k = 0; k < g.k; ++k)
        for (int64_t j = 0; j < g.kp; ++j) {
          uint16_t want = j < g.r * g.s * g.c ? f[k * g.r * g.s * g.c + j] : 0;
          if (b[k * g.kp + j] != want) { if (fails++ < 5) printf("B mismatch trial %d\n", trial); }
        }
  }
  printf("fails %d\n", fails);
  return fails != 0;
}
