// What the epilogues that stage their output in shared memory share
// (templates/glu_epilogue.h, templates/staged_epilogue.h): their arguments, their
// host side (no workspace), the named barrier around the staged tile and its row pitch.
//
// Spliced into a unit's code before either, once per unit (the guard).
#ifndef CO_STAGED_COMMON_H
#define CO_STAGED_COMMON_H

namespace co_epi {

// The shape of CUTLASS's DefaultEpilogue arguments, so the GEMM's Arguments are
// written alike (emit/gemm_sm90.py make_arguments): D and C row-major (M, N, L)
// with strides (ld, 1, batch).
template <class ElementD, class ElementBias>
struct Arguments {
  struct Thread {
    ElementBias const* bias = nullptr;   // per output column; null without a bias
  };
  Thread thread{};
  void const* ptr_C = nullptr;           // the residual's source; null without one
  cute::Stride<int64_t, cute::_1, int64_t> dC{};
  ElementD* ptr_D = nullptr;
  cute::Stride<int64_t, cute::_1, int64_t> dD{};
};

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

}  // namespace co_epi

#endif  // CO_STAGED_COMMON_H
