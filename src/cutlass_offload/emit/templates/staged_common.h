// What the epilogues that stage their output in shared memory share
// (templates/glu_epilogue.h, staged_epilogue.h, staged_tma_epilogue.h): their
// arguments, their host side (no workspace), the operand checks, the accumulator
// layout they read, the named barrier around the staged tile and its row pitch.
//
// Spliced into a unit's code before either, once per unit (the guard).
#ifndef CO_STAGED_COMMON_H
#define CO_STAGED_COMMON_H

namespace co_epi {

// The shape of CUTLASS's DefaultEpilogue arguments, so the kernel's Arguments are
// written alike (emit/gemm_sm90.py, conv_sm90.py make_arguments). Stride: C's and
// D's, (ld, 1, batch) for a GEMM's row-major (M, N, L); ((k, q*k, p*q*k), 1, 0) for a
// conv's packed NPQK seen as ((q, p, n), k, batch).
template <class ElementD, class ElementBias, class Stride = cute::Stride<int64_t, cute::_1, int64_t>>
struct Arguments {
  struct Thread {
    ElementBias const* bias = nullptr;   // per output column; null without a bias
  };
  Thread thread{};
  void const* ptr_C = nullptr;           // the residual's source; null without one
  Stride dC{};
  ElementD* ptr_D = nullptr;
  Stride dD{};
};

// The distance between rows m and m + 1 of a C / D stride: its first mode's, or that
// mode's first sub-mode's where M is hierarchical (a conv's (q, p, n)).
template <class Stride>
CUTLASS_HOST_DEVICE int64_t row_stride(Stride const& stride) {
  if constexpr (cute::is_tuple<cute::remove_cvref_t<decltype(cute::get<0>(stride))>>::value) {
    return int64_t(cute::get<0, 0>(stride));
  } else {
    return int64_t(cute::get<0>(stride));
  }
}

// Whether a hierarchical M mode (shape (q, p, n), stride (s0, s1, s2)) is packed, so
// that row m of the linearized M lies at m * s0: s1 = s0 * q, s2 = s1 * p. A flat M
// mode always is.
template <class ShapeM, class StrideM>
CUTLASS_HOST_DEVICE bool packed_rows(ShapeM const& shape, StrideM const& stride) {
  if constexpr (cute::is_tuple<StrideM>::value) {
    bool ok = true;
    cute::for_each(cute::make_int_sequence<cute::rank_v<StrideM> - 1>{}, [&](auto i) {
      constexpr int I = decltype(i)::value;
      ok = ok && int64_t(cute::get<I + 1>(stride)) == int64_t(cute::get<I>(stride)) * int64_t(cute::get<I>(shape));
    });
    return ok;
  } else {
    return true;
  }
}

// Whether a C / D operand can be read or written in 16-byte chunks of Vec elements:
// every row and (with several batches) batch start 16-byte aligned, rows at a constant
// distance (packed_rows: a conv's NPQK).
template <int Vec, class Stride, class ShapeM>
bool rows_ok(void const* ptr, Stride const& stride, ShapeM const& shape_m, int batches) {
  return ptr != nullptr && reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && row_stride(stride) % Vec == 0 &&
         (batches <= 1 || int64_t(cute::get<2>(stride)) % Vec == 0) && packed_rows(shape_m, cute::get<0>(stride));
}

// The accumulator layout the staged epilogues read, a warp group's wgmma C layout
// ((column pair, row + 8, column groups of 8), MMA_M, MMA_N) with one wgmma across the
// tile's TileN / 8 column groups (MMA_N = 1), and a static CTA tile of TileM x TileN
// (compile-time checks only).
template <class FrgLayout, class BlockShapeMNK, int TileM, int TileN>
CUTLASS_DEVICE constexpr void check_accumulator_layout() {
  using namespace cute;
  static_assert(is_static<BlockShapeMNK>::value, "the CTA tile shape must be static");
  static_assert(is_static<FrgLayout>::value, "the accumulator layout must be static");
  static_assert(size<0>(BlockShapeMNK{}) == TileM && size<1>(BlockShapeMNK{}) == TileN,
                "the staged tile is sized for TileShape");
  static_assert(rank(FrgLayout{}) == 3 && rank<0>(FrgLayout{}) == 3, "unexpected accumulator layout");
  static_assert(size<0, 0>(FrgLayout{}) == 2 && size<0, 1>(FrgLayout{}) == 2, "unexpected accumulator layout");
  static_assert(size<0, 2>(FrgLayout{}) == TileN / 8 && size<2>(FrgLayout{}) == 1,
                "one wgmma spans the tile's width (MMA_N = 1)");
}

// The host side of an epilogue whose Params are its Arguments and which needs no
// workspace (the Sm90TmaWarpSpecializedAdapter calls these).
template <class Args>
struct NoWorkspace {
  using Arguments = Args;
  using Params = Args;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
};

// The type names CUTLASS's kernels and its Sm90TmaWarpSpecializedAdapter read from
// an epilogue, for the epilogues here (no thread op runs in them).
template <class ElementD, class EpilogueSchedule_>
struct AdapterTypes {
  using EpilogueSchedule = EpilogueSchedule_;
  using DispatchPolicy = EpilogueSchedule_;
  using ThreadEpilogueOp = cutlass::epilogue::thread::LinearCombination<ElementD, 1, float, float>;
  using ElementOutput = ElementD;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
};

// The operand type names CUTLASS's kernels and adapter read from the elementwise staged
// epilogues (staged_epilogue.h, staged_tma_epilogue.h), their residual and tile sizes:
// C (void without a residual) and D with one stride type, the bias's element.
template <class ElementC_, class ElementD_, class ElementBias_, class Stride_, bool HasBias_, int Residual_,
          class TileShape_>
struct StagedTypes {
  using ElementC = ElementC_;
  using ElementD = ElementD_;
  using ElementBias = ElementBias_;
  using StrideC = Stride_;
  using StrideD = Stride_;
  using GmemElementC = cute::conditional_t<cute::is_void_v<ElementC_>, ElementD_, ElementC_>;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  static constexpr bool HasBias = HasBias_;
  static constexpr int Residual = Residual_;     // 0 none, 1 add, 2 multiply
  static constexpr int TileM = cute::size<0>(TileShape_{});
  static constexpr int TileN = cute::size<1>(TileShape_{});
  static_assert(sizeof(ElementD_) == 2 && sizeof(GmemElementC) == 2, "16-bit C and D only");
  static_assert(Residual_ == 0 || !cute::is_void_v<ElementC_>, "a residual needs ElementC");
};

// A staged tile's row pitch in elements for rows of `cols` 16-bit elements: an odd
// multiple of 16 bytes, so the 8 rows of a warp's 4-byte writes (4 threads per row,
// the wgmma accumulator layout) start 16 bytes apart modulo the 128-byte bank cycle
// and fall in 32 distinct banks; a 16-byte pad where the row is a multiple of 32 bytes.
template <class Element>
constexpr int staged_pitch(int cols) {
  return cols + ((cols * int(sizeof(Element))) % 32 == 0 ? 16 / int(sizeof(Element)) : 0);
}

// The named barrier around a staged tile, for the `Threads` threads of the epilogue:
// one barrier per warp group in the ping-pong kernel (one group of 128 threads at a
// time; CUTLASS's math_wg_order_barrier orders the two groups' epilogues, so they
// share the one tile), one for both groups in the cooperative one (256). Ids count
// from CUTLASS's first non-reserved one (NamedBarrier::sync adds the offset).
template <int Threads>
CUTLASS_DEVICE void sync_staged_tile() {
  static_assert(Threads == 128 || Threads == 256, "one or two consumer warp groups");
  uint32_t id = Threads == 128 ? uint32_t(cutlass::canonical_warp_group_idx() & 1) : 0u;
  cutlass::arch::NamedBarrier::sync(Threads, id);
}

// Calls f(i, trow, tcol) for each 16-byte chunk of a staged tile (Rows rows of
// ChunksPerRow chunks of Vec elements) that thread `thread_idx` of `Threads` copies
// out: chunk i * Threads + thread_idx, so a warp takes 32 consecutive chunks of a row
// (512 contiguous bytes where the row is that long). i: the thread's iteration, a
// compile-time cute::Int (a caller's addresses may step by it); trow: the tile's row;
// tcol: the chunk's first column in it.
template <int Threads, int Rows, int ChunksPerRow, int Vec, class F>
CUTLASS_DEVICE void for_each_staged_chunk(int thread_idx, F&& f) {
  constexpr int Chunks = Rows * ChunksPerRow;
  cute::for_each(cute::make_int_sequence<(Chunks + Threads - 1) / Threads>{}, [&](auto i) {
    int ch = int(decltype(i)::value) * Threads + thread_idx;
    if (Chunks % Threads == 0 || ch < Chunks) {
      f(i, ch / ChunksPerRow, (ch % ChunksPerRow) * Vec);
    }
  });
}

}  // namespace co_epi

#endif  // CO_STAGED_COMMON_H
