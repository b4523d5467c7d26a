// Epilogue activations CUTLASS does not ship, or ships slower (GELU, SiLU, sigmoid:
// below), written as CUTLASS's own functors
// (cutlass/epilogue/thread/activation.h): a scalar operator() in float and an
// Array specialization, so both the sm90 EVT's Sm90Compute and the 2.x
// LinearCombinationGeneric can apply them. NaN stays NaN and infinities follow
// PyTorch's own formula (checked in tests/gpu/test_numerics.py). Inlined by
// emit_unit before the TU's includes (emit/activations.py), hence the guard.
#ifndef CO_ACTIVATIONS_H
#define CO_ACTIVATIONS_H
#include <cmath>
#include <cutlass/array.h>

namespace co_act {

// torch.nn.functional.hardsigmoid: min(max(x + 3, 0), 6) / 6
template <typename T>
struct HardSigmoid {
  static const bool kIsHeavy = false;
  CUTLASS_HOST_DEVICE T operator()(T const& x) const {
    const float v = float(x);
    return T(v != v ? v : fminf(fmaxf(v + 3.f, 0.f), 6.f) / 6.f);
  }
};

// 1 / (1 + e^-x) from ex2.approx and rcp.approx: two MUFU instructions and two
// FMA-pipe ones. CUTLASS's Sigmoid / SiLu divide in IEEE precision (a dozen
// instructions and a slow path per element); in a skinny GEMM's epilogue, where one
// CTA's 256 consumer threads per SM do little else, that cost more than the GEMM:
// EfficientNet's 401408x96x16 GEMM took 32.6 us plain and 92.4 us with bias + SiLU on
// the H200 (session 28, benchmarks/gemm_tune.py --shapes effnet). Relative error
// about 2^-20 for |x| <= 8 (each approximation within 2 ulp), growing to about 2^-17
// near x = -88 as x log2(e) is rounded to fp32: far below fp16 / bf16 rounding. The
// non-ftz forms keep subnormal inputs and results, so for x near -87 bf16 gets
// PyTorch's tiny value, not 0. sigmoid(-inf) = rcp(inf) = 0, sigmoid(inf) = 1, NaN stays NaN.
CUTLASS_HOST_DEVICE float sigmoid_f32(float x) {
#if defined(__CUDA_ARCH__)
  float e, r;
  asm("ex2.approx.f32 %0, %1;" : "=f"(e) : "f"(x * -1.4426950408889634f));
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return r;
#else
  return 1.f / (1.f + expf(-x));
#endif
}

// torch.sigmoid
template <typename T>
struct Sigmoid {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& x) const { return T(sigmoid_f32(float(x))); }
};

// torch.nn.functional.silu: x * sigmoid(x); silu(-inf) = -inf * 0 = NaN as in PyTorch
template <typename T>
struct SiLU {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& x) const {
    const float v = float(x);
    return T(v * sigmoid_f32(v));
  }
};

// x * sigmoid(1.702 x): OpenAI CLIP's quick_gelu (transformers' QuickGELUActivation)
template <typename T>
struct QuickGELU {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& x) const {
    const float v = float(x);
    return T(v * sigmoid_f32(1.702f * v));
  }
};

// torch.nn.functional.gelu (approximate="none"): x * Phi(x), Phi the normal CDF.
// CUTLASS's GELU calls erff: 32 sm_90a SASS instructions per element (its two
// branches' polynomials selected lane by lane), and a cooperative kernel's
// epilogue runs after its mainloop, so each one shows. Here Phi(x) = 1 - h for
// x >= 0 and h for x < 0, h = erfc(|x| / sqrt(2)) / 2 by Numerical Recipes'
// erfcc (Press et al., Numerical Recipes in C, 2nd ed., 6.2: erfc(z) = t exp(-z^2
// + P(t)), t = 1 / (1 + z / 2), fractional error < 1.2e-7 everywhere), as
// h = t 2^(Q(t) - x^2 log2(e) / 2) with Q = P log2(e) - 1: 20 instructions, two of
// them MUFU (rcp, ex2). Measured on the H200 (session 26, same run): whisper's
// 6000x3072x768 fc1 + bias + GELU 64.4 -> 59.0 us, convnext-tiny's four GELU
// GEMMs 8-16% faster. Error against float64 (tests/build/test_activation_numerics.py):
// under 2.5e-7 absolute for |x| <= 4 and 2.5e-6 relative, where PyTorch's own
// float32 formula is off by up to 1.2e-6 absolute and, 1 + erf cancelling for
// x < -3, by far more relative. gelu(-inf) is NaN (-inf * 0), gelu(inf) inf, NaN
// stays NaN: PyTorch's CUDA pattern.
template <typename T>
struct GELU {
  static const bool kIsHeavy = true;
  static constexpr double kLog2e = 1.4426950408889634;
  CUTLASS_HOST_DEVICE static float rcp(float v) {
#if defined(__CUDA_ARCH__)
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
#else
    return 1.f / v;
#endif
  }
  CUTLASS_HOST_DEVICE static float exp2(float v) {
#if defined(__CUDA_ARCH__)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    return r;
#else
    return exp2f(v);
#endif
  }
  CUTLASS_HOST_DEVICE T operator()(T const& x_) const {
    const float x = float(x_);
    const float t = rcp(fmaf(fabsf(x), float(0.5 * 0.70710678118654752), 1.f));
    float q = float(0.17087277 * kLog2e);
    q = fmaf(q, t, float(-0.82215223 * kLog2e));
    q = fmaf(q, t, float(1.48851587 * kLog2e));
    q = fmaf(q, t, float(-1.13520398 * kLog2e));
    q = fmaf(q, t, float(0.27886807 * kLog2e));
    q = fmaf(q, t, float(-0.18628806 * kLog2e));
    q = fmaf(q, t, float(0.09678418 * kLog2e));
    q = fmaf(q, t, float(0.37409196 * kLog2e));
    q = fmaf(q, t, float(1.00002368 * kLog2e));
    q = fmaf(q, t, float(-1.26551223 * kLog2e - 1.0));
    const float h = t * exp2(fmaf(x * x, float(-0.5 * kLog2e), q));
    return T(x * (x < 0.f ? h : 1.f - h));
  }
};

// The Array form CUTLASS's epilogues call: the scalar functor on each element.
template <template <typename> class Op, typename T, int N>
struct ElementWise {
  static const bool kIsHeavy = Op<T>::kIsHeavy;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& value) const {
    cutlass::Array<T, N> y;
    Op<T> op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      y[i] = op(value[i]);
    }
    return y;
  }
};

template <typename T, int N>
struct GELU<cutlass::Array<T, N>> : ElementWise<GELU, T, N> {};
template <typename T, int N>
struct HardSigmoid<cutlass::Array<T, N>> : ElementWise<HardSigmoid, T, N> {};
template <typename T, int N>
struct QuickGELU<cutlass::Array<T, N>> : ElementWise<QuickGELU, T, N> {};
template <typename T, int N>
struct Sigmoid<cutlass::Array<T, N>> : ElementWise<Sigmoid, T, N> {};
template <typename T, int N>
struct SiLU<cutlass::Array<T, N>> : ElementWise<SiLU, T, N> {};

}  // namespace co_act
#endif  // CO_ACTIVATIONS_H
