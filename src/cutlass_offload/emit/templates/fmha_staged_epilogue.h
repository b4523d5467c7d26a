// The Hopper FMHA's output epilogue without CUTLASS's TMA epilogue: O staged in shared
// memory and stored in 16-byte row chunks (emit/attention_sm90.py, switched by
// STAGED_EPILOGUE). A stand-in for the example's cutlass::fmha::collective::
// FmhaFwdEpilogue (examples/88_hopper_fmha/collective/fmha_epilogue.hpp) with its
// interface: the same Arguments, the per-row log-sum-exp written as it writes it.
//
// Why: FmhaFwdEpilogue stores O through the sm90 TMA epilogue collective, whose
// instantiation is 15.3 of the 21.6 s cicc's front end spends on the whole kernel
// (session 38, nvcc -fdevice-time-trace, head tile 64; benchmarks/compile_profile.py
// shows the same for GEMMs). The attention unit is the critical path of a cold
// sd-unet build. O is stored once per query tile, after the whole key loop, so its
// store is a small part of the kernel's time.
//
// How: each consumer warp group (64 queries x the head tile) stages half the head tile
// at a time: the threads write their rounded pairs (4 bytes) to a 64 x Pitch tile, a
// named barrier of the group's own, then every thread copies whole 16-byte row chunks
// to O (rows past seq_q and columns past head_dim left out; head_dim % 8 == 0), a
// barrier before the next half. The tile is at most one warp group's Q stage: where
// the kernel keeps the epilogue's storage in a union with the mainloop's (the
// non-persistent kernel), group i's storage then lies inside Q stages 0..i, which the
// groups before it, ordered by the kernel's math barrier, have finished with, as the
// example's own epilogue storage does.
//
// Spliced into a unit's code after templates/staged_common.h, once per unit (the guard).
#ifndef CO_FMHA_STAGED_EPILOGUE_H
#define CO_FMHA_STAGED_EPILOGUE_H

namespace co_fmha {

template <class Element, class ElementAccumulator, class TileShape_WG>
struct StagedFwdEpilogue {
  static constexpr int TileM = cute::size<0>(TileShape_WG{});     // a warp group's queries
  static constexpr int TileD = cute::size<1>(TileShape_WG{});     // the head tile
  static constexpr int EpiN = TileD / 2;                          // columns staged at once
  static constexpr int Vec = 16 / int(sizeof(Element));
  static constexpr int Pitch = co_epi::staged_pitch<Element>(EpiN);
  static constexpr int Threads = cutlass::NumThreadsPerWarpGroup;
  static_assert(sizeof(Element) == 2, "16-bit O only");
  static_assert(TileM == 64 && TileD % 16 == 0, "64 queries per warp group, a head tile of 16s");
  static_assert(Pitch <= TileD, "the staged tile fits in the warp group's Q stage");

  // the example's epilogue Arguments, field for field (emit/attention_sm90.py fills them)
  struct Arguments {
    Element* ptr_O;
    cute::tuple<int, cute::_1, cute::tuple<int, int>> dO;
    ElementAccumulator* ptr_LSE;
    cute::tuple<cute::_1, cute::tuple<int, int>> dLSE;
  };
  using Params = Arguments;

  struct TensorStorage {
    alignas(128) Element tile[TileM * Pitch];
  };
  // the kernel builds an epilogue load pipeline; nothing is loaded through it here
  using LoadPipeline = cutlass::PipelineTransactionAsync<1>;
  using PipelineStorage = typename LoadPipeline::SharedStorage;
  static constexpr int TmaTransactionBytes = 0;

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void* = nullptr) {
    return args;
  }

  template <class TileShape, class BlkCoord, class ResultTuple, class TiledMma, class ProblemShape>
  CUTLASS_DEVICE void operator()(TileShape const& tile_shape, BlkCoord const& blk_coord, ResultTuple const& result,
                                 TiledMma const& tiled_mma, ProblemShape const& problem_size, Params const& params,
                                 LoadPipeline, TensorStorage& storage) {
    using namespace cute;
    using X = Underscore;
    auto const& acc = get<0>(result);
    auto const& lse = get<1>(result);
    static_assert(size<0>(TileShape{}) == TileM && size<1>(TileShape{}) == TileD, "the staged tile's shape");
    // ((column pair, row + 8, column groups of 8), MMA_M, MMA_N): the wgmma C layout; a
    // head tile no one wgmma spans (80, 160) takes several along N (MMA_N > 1)
    using AccLayout = decltype(acc.layout());
    constexpr int AtomGroups = size<0, 2>(AccLayout{});     // 8-column groups of one wgmma
    constexpr int MmaN = size<2>(AccLayout{});
    static_assert(rank(AccLayout{}) == 3 && rank<0>(AccLayout{}) == 3 && size<0, 0>(AccLayout{}) == 2 &&
                      size<0, 1>(AccLayout{}) == 2 && AtomGroups * MmaN == TileD / 8 && size<1>(AccLayout{}) == 1,
                  "unexpected accumulator layout");

    // as the example's threads are sliced (the thread layout repeats every warp group)
    auto thr_mma = tiled_mma.get_thread_slice(threadIdx.x);
    int const seqlen_q = get<2>(problem_size);
    int const head_dim = get<4>(problem_size);
    int const num_batch = get<0>(problem_size);
    int const num_heads = get<1>(problem_size);

    // the log-sum-exp, as FmhaFwdEpilogue writes it
    Tensor mLSE = make_tensor(make_gmem_ptr(params.ptr_LSE),
                              make_shape(seqlen_q, get<1>(tile_shape), make_shape(num_batch, num_heads)),
                              make_stride(_1{}, _0{}, get<1>(params.dLSE)));
    Tensor gLSE_full = local_tile(mLSE, tile_shape, make_coord(_, _, _), Step<_1, _1, X>{});
    Tensor gLSE = gLSE_full(_, _, get<0>(blk_coord), get<1>(blk_coord), get<2>(blk_coord));
    Tensor tOgLSE = thr_mma.partition_C(gLSE);
    Tensor cO = make_identity_tensor(take<0, 2>(tile_shape));
    Tensor tOcO = thr_mma.partition_C(cO);
    if (get<1>(tOcO(_0{})) == 0) {
      auto tOgLSE_mn = make_tensor(tOgLSE.data(), cutlass::fmha::collective::layout_acc_mn(tiled_mma, tOgLSE.layout()));
      auto tOcO_mn = make_tensor(tOcO.data(), cutlass::fmha::collective::layout_acc_mn(tiled_mma, tOcO.layout()));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<0>(tOgLSE_mn); i++) {
        if (get<0>(tOcO_mn(i)) + get<0>(blk_coord) * get<0>(tile_shape) < seqlen_q) {
          tOgLSE_mn(i, _0{}) = lse(i);
        }
      }
    }

    // O: the warp group's first row, its (batch, head) block
    int const m0 = int(get<0>(blk_coord)) * TileM;
    auto const& bh = get<2>(blk_coord);
    int64_t const ldo = int64_t(get<0>(params.dO));
    Element* o = params.ptr_O + int64_t(get<0>(bh)) * int64_t(get<2, 0>(params.dO)) +
                 int64_t(get<1>(bh)) * int64_t(get<2, 1>(params.dO)) + int64_t(m0) * ldo;
    int const t = int(threadIdx.x) % Threads;
    // one barrier per consumer warp group (their epilogues run at once); ids count
    // from CUTLASS's first non-reserved one (NamedBarrier::sync adds the offset)
    uint32_t const barrier = uint32_t(cutlass::canonical_warp_group_idx());
    cutlass::NumericArrayConverter<Element, ElementAccumulator, 2, cutlass::FloatRoundStyle::round_to_nearest> to2;
    constexpr int ChunkGroups = EpiN / 8;

    CUTLASS_PRAGMA_UNROLL
    for (int chunk = 0; chunk < TileD / EpiN; ++chunk) {
      cutlass::arch::NamedBarrier::sync(Threads, barrier);     // the previous half's reads are done
      // the thread's pairs whose 8-column group lies in this half (the pair's column
      // is its group's first plus 2 * (lane % 4), so the group decides)
      CUTLASS_PRAGMA_UNROLL
      for (int mn = 0; mn < MmaN; ++mn) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < AtomGroups; ++j) {
          CUTLASS_PRAGMA_UNROLL
          for (int r = 0; r < 2; ++r) {
            auto crd = tOcO(make_coord(make_coord(0, r, j), 0, mn));
            if (int(get<1>(crd)) / 8 / ChunkGroups != chunk) {
              continue;
            }
            cutlass::Array<ElementAccumulator, 2> x;
            x[0] = acc(make_coord(make_coord(0, r, j), 0, mn));
            x[1] = acc(make_coord(make_coord(1, r, j), 0, mn));
            *reinterpret_cast<cutlass::Array<Element, 2>*>(storage.tile + int(get<0>(crd)) * Pitch +
                                                           int(get<1>(crd)) - chunk * EpiN) = to2(x);
          }
        }
      }
      cutlass::arch::NamedBarrier::sync(Threads, barrier);     // the half is in shared memory
      co_epi::for_each_staged_chunk<Threads, TileM, EpiN / Vec, Vec>(t, [&](auto, int trow, int tcol) {
        int const col = chunk * EpiN + tcol;
        if (m0 + trow < seqlen_q && col < head_dim) {
          *reinterpret_cast<uint4*>(o + int64_t(trow) * ldo + col) =
              *reinterpret_cast<uint4 const*>(storage.tile + trow * Pitch + tcol);
        }
      });
    }
  }
};

}  // namespace co_fmha

#endif  // CO_FMHA_STAGED_EPILOGUE_H
