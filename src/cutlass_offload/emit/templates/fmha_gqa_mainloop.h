// Grouped-query attention on the Hopper FMHA (examples/88_hopper_fmha) with K and V read
// in place: query head h reads K/V head h / G, without the G-fold copies of K and V that
// transformers' repeat_kv makes.
//
// The example's mainloop (FmhaMainloopTmaWarpSpecialized) builds its TMA tensors from
// the problem shape (B, H, Q, K, D) as (seq, head dim, (B, H)) and slices them with the
// tile's (b, h). Given the problem with H as (G, H / G) and strides whose head mode is
// hierarchical, Q ((sh, G * sh): the same addresses as a flat head stride sh) and K / V
// ((_0, sh_kv): a static 0, so cute leaves that mode out of the TMA descriptor,
// copy_traits_sm90_tma.hpp "size-1 or stride-0, then don't append"), the flat query head
// h that the tile carries is split colexicographically by cute into (h % G, h / G), and
// K / V take h / G. Only the mainloop sees the grouped shape: the tile scheduler, the
// fusion (masks read the sequence lengths) and the epilogue (O and the log-sum-exp
// rows per query head) keep the flat one.
//
// GqaMainloop<Base, G> is the example's mainloop Base (instantiated with those strides)
// with the problem shape regrouped where Base takes it: can_implement,
// to_underlying_arguments (the TMA descriptors) and the two load entry points.
//
// Included with the kernel's code (after the TU's includes).
#ifndef CO_FMHA_GQA_MAINLOOP_H
#define CO_FMHA_GQA_MAINLOOP_H
#include <cute/tensor.hpp>

namespace co_fmha {

template <class Base, int kGroup>
struct GqaMainloop : Base {
  static_assert(kGroup > 1, "one K/V head per query head needs no regrouping");

  using Arguments = typename Base::Arguments;
  using Params = typename Base::Params;

  // (B, H, Q, K, D) -> (B, (G, H / G), Q, K, D)
  template <class ProblemShape>
  CUTLASS_HOST_DEVICE static auto grouped(ProblemShape const& problem) {
    return cute::make_shape(cute::get<0>(problem),
                            cute::make_shape(kGroup, cute::get<1>(problem) / kGroup),
                            cute::get<2>(problem), cute::get<3>(problem), cute::get<4>(problem));
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem, Arguments const& args) {
    return cute::get<1>(problem) % kGroup == 0 && Base::can_implement(grouped(problem), args);
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem, Arguments const& args,
                                        void* workspace) {
    return Base::to_underlying_arguments(grouped(problem), args, workspace);
  }

  template <bool kLoadQ, class BlkCoord, class ProblemShape, class... Rest>
  CUTLASS_DEVICE void load_kv_maybe_q(int block_rank_in_cluster, BlkCoord const& blk_coord,
                                      Params const& params, ProblemShape const& problem,
                                      Rest&&... rest) {
    Base::template load_kv_maybe_q<kLoadQ>(block_rank_in_cluster, blk_coord, params,
                                           grouped(problem), static_cast<Rest&&>(rest)...);
  }

  template <class BlkCoord, class ProblemShape, class... Rest>
  CUTLASS_DEVICE void load_maybe_q(BlkCoord const& blk_coord, Params const& params,
                                   ProblemShape const& problem, Rest&&... rest) {
    Base::load_maybe_q(blk_coord, params, grouped(problem), static_cast<Rest&&>(rest)...);
  }
};

}  // namespace co_fmha
#endif  // CO_FMHA_GQA_MAINLOOP_H
