// Epilogue activations CUTLASS does not ship, written as CUTLASS's own functors
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

// x * sigmoid(1.702 x): OpenAI CLIP's quick_gelu (transformers' QuickGELUActivation)
template <typename T>
struct QuickGELU {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& x) const {
    const float v = float(x);
    return T(v * (1.f / (1.f + expf(-1.702f * v))));
  }
};

template <typename T, int N>
struct HardSigmoid<cutlass::Array<T, N>> {
  static const bool kIsHeavy = false;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& value) const {
    cutlass::Array<T, N> y;
    HardSigmoid<T> op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      y[i] = op(value[i]);
    }
    return y;
  }
};

template <typename T, int N>
struct QuickGELU<cutlass::Array<T, N>> {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& value) const {
    cutlass::Array<T, N> y;
    QuickGELU<T> op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      y[i] = op(value[i]);
    }
    return y;
  }
};

}  // namespace co_act
#endif  // CO_ACTIVATIONS_H
