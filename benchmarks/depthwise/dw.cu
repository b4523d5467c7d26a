// Standalone check of CUTLASS's 2.x depthwise direct conv (fixed stride/dilation), fp16 NHWC,
// fp32 accumulation, bias + identity epilogue: correctness and speed against cuDNN.
#include "cutlass/cutlass.h"
#include "cutlass/conv/kernel/default_depthwise_fprop.h"
#include "cutlass/conv/device/direct_convolution.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"
#include "cutlass/epilogue/thread/activation.h"

using Element = cutlass::half_t;
using Layout = cutlass::layout::TensorNHWC;

template <int R, int Str, int G, int OH, int OW, int WM, int Stages>
struct Dw {
  using OutShape = cutlass::conv::TensorNHWCShape<1, OH, OW, G>;
  using Filter = cutlass::MatrixShape<R, R>;
  using TB = cutlass::gemm::GemmShape<OutShape::kNHW, G, Filter::kCount>;
  using Warp = cutlass::gemm::GemmShape<WM, G, Filter::kCount>;
  using Swz = cutlass::conv::threadblock::DepthwiseDirect2dConvIdentityThreadblockSwizzle<1, OutShape::kN, OutShape::kH, OutShape::kW>;
  using EpilogueOp = cutlass::epilogue::thread::LinearCombinationGeneric<
      cutlass::epilogue::thread::Identity, Element, 8, float, float,
      cutlass::epilogue::thread::ScaleType::NoBetaScaling>;
  using K = typename cutlass::conv::kernel::DefaultDepthwiseDirect2dConvFprop<
      Element, Layout, Element, Layout, Element, Layout, float,
      cutlass::arch::OpClassSimt, cutlass::arch::Sm80, TB, OutShape, Filter, Warp,
      cutlass::gemm::GemmShape<1, 1, 1>, EpilogueOp, Swz, Stages, cutlass::arch::OpMultiplyAdd,
      cutlass::conv::IteratorAlgorithm::kFixedStrideDilation, cutlass::conv::StrideSupport::kFixed,
      cutlass::MatrixShape<Str, Str>, cutlass::MatrixShape<1, 1>>::Kernel;
  using Conv = cutlass::conv::device::DirectConvolution<K>;

  static int run(const void* x, const void* w, const void* bias, void* y, void* wr,
                 int n, int h, int ww, int c, cudaStream_t s) {
    int pad = R / 2;
    int p = (h + 2 * pad - R) / Str + 1, q = (ww + 2 * pad - R) / Str + 1;
    cutlass::conv::Conv2dProblemSize ps(n, h, ww, c, c, R, R, p, q, pad, pad, Str, Str, 1, 1,
        cutlass::conv::Mode::kCrossCorrelation, 1, c);
    Layout bl{typename Layout::Stride(0)};
    typename Conv::Arguments args(ps,
        {(Element*)x, Layout::packed(ps.activation_extent())},
        {(Element*)w, Layout::packed(ps.filter_extent())},
        {(Element*)bias, bl},
        {(Element*)y, Layout::packed(ps.output_extent())},
        typename EpilogueOp::Params(1.f, 1.f),
        {(Element*)wr, Layout::packed(ps.filter_extent())});
    Conv conv;
    if (Conv::can_implement(args) != cutlass::Status::kSuccess) return 1;
    if (conv.initialize(args, nullptr, s) != cutlass::Status::kSuccess) return 2;
    return conv.run(s) == cutlass::Status::kSuccess ? 0 : 3;
  }
};

extern "C" int dw_run(int variant, const void* x, const void* w, const void* bias, void* y, void* wr,
                      int n, int h, int ww, int c, void* s) {
  cudaStream_t st = (cudaStream_t)s;
  switch (variant) {
    case 0: return Dw<7, 1, 64, 8, 8, 16, 3>::run(x, w, bias, y, wr, n, h, ww, c, st);
    case 1: return Dw<7, 1, 32, 8, 8, 16, 3>::run(x, w, bias, y, wr, n, h, ww, c, st);
    case 2: return Dw<3, 1, 32, 8, 8, 16, 3>::run(x, w, bias, y, wr, n, h, ww, c, st);
    case 3: return Dw<3, 2, 32, 8, 8, 16, 3>::run(x, w, bias, y, wr, n, h, ww, c, st);
    case 4: return Dw<5, 1, 32, 8, 8, 16, 3>::run(x, w, bias, y, wr, n, h, ww, c, st);
    case 5: return Dw<5, 2, 32, 8, 8, 16, 3>::run(x, w, bias, y, wr, n, h, ww, c, st);
    case 6: return Dw<7, 1, 64, 4, 4, 4, 4>::run(x, w, bias, y, wr, n, h, ww, c, st);
    case 7: return Dw<3, 1, 16, 8, 8, 16, 3>::run(x, w, bias, y, wr, n, h, ww, c, st);
    case 8: return Dw<3, 1, 64, 8, 8, 16, 3>::run(x, w, bias, y, wr, n, h, ww, c, st);
  }
  return -1;
}
