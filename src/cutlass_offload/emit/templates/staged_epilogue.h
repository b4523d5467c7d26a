// An elementwise epilogue for the CUTLASS 3.x sm90 GEMM and implicit-GEMM conv kernels that stages its
// output in shared memory and stores it in 16-byte row chunks, without TMA and
// without CUTLASS's epilogue visitor tree (emit/staged.py, switched by ENABLED; wrapped
// in cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter like
// templates/glu_epilogue.h, whose staged store it generalizes).
//
//     D = post(residual_op(act(acc + bias), C))
//
// rounded to ElementD after every op, as PyTorch rounds each op's result and as the
// EVT of emit/evt_sm90.py rounds between its nodes; unlike that tree it also rounds
// the accumulator before a residual op that has no bias or activation before it
// (PyTorch rounds the matmul's output there too).
//
// Why: the sm90 TMA epilogue with its fusion callbacks is about half of a GEMM
// kernel's instantiation in nvcc; this one is a plain class template (session 37,
// 2-core machine: a unit of four 16-bit GEMM kernels 42.0 s with the TMA epilogue,
// 22.8 s with the GLU epilogue, which stores the same way).
//
// How: the tile's bias goes to shared memory once per tile; C's chunks go there by
// cp.async a chunk ahead of their use. The tile's columns are processed in chunks of
// EpiN (whole 8-column groups of the wgmma accumulator, at most 8 * MaxChunkGroups_
// columns; Buffers_ chunks staged at once): the threads write their rounded
// act(acc + bias) pairs (stmatrix, 16 bytes a lane) to a TileM x Pitch
// shared-memory tile, a named barrier, then every thread copies whole 16-byte row
// chunks out, applying the residual op with C's matching chunk, another barrier
// before the next chunk's writes (with one buffer). The ping-pong kernel orders its
// two warp groups' epilogues (math_wg_order_barrier), so they share the one tile,
// each with a barrier of its own; the cooperative kernel's two groups share one.
//
// Speed (session 38, H100, benchmarks/staged_epilogue.py, 12 corpus GEMMs): 0.87x
// the TMA epilogue's geomean, 0.61x (bias + GELU, ping-pong) to 1.03x (no epilogue);
// ncu counted 4-37% more instructions and, with GELU, 9.4 against 6.3 warp cycles
// per issued instruction. Since then (not yet run on a GPU): stmatrix for the
// staging (16 instructions a thread where 64 4-byte stores were), the bias read once
// per chunk, and tiles inside the problem stored without bound checks from
// addresses a fixed step apart. It stays off until it holds the TMA epilogue's speed
// (emit/staged.py).
//
// Needs: D (and C) row-major (M, N, L) with 16-byte aligned rows and batch starts, or
// a conv's packed NPQK with M = (q, p, n) (can_implement; Stride_); any M and N (a
// chunk that straddles N is stored element by element). The kernel's tile has one
// wgmma along N (MMA_N = 1: the builders' tiles).
//
// Spliced into a unit's code after its includes, once per unit (the guard).
#ifndef CO_STAGED_EPILOGUE_H
#define CO_STAGED_EPILOGUE_H

namespace co_staged {

// The largest divisor of groups that is at most max_groups: a chunk of 8-column groups
// (at most 8 * max_groups columns) that tiles the CTA tile's width exactly.
constexpr int chunk_groups(int groups, int max_groups) {
  int g = groups < max_groups ? groups : max_groups;
  while (groups % g != 0) {
    --g;
  }
  return g;
}

template <class ElementC_, class ElementD_, class ElementBias_, template <class> class Activation_,
          bool HasActivation_, bool HasBias_, int Residual_, template <class> class Post_, bool HasPost_,
          class EpilogueSchedule_, class TileShape_, class Stride_ = cute::Stride<int64_t, cute::_1, int64_t>,
          int MaxChunkGroups_ = 12, int Buffers_ = 1>
class StagedEpilogue : public co_epi::NoWorkspace<co_epi::Arguments<ElementD_, ElementBias_, Stride_>>,
                       public co_epi::AdapterTypes<ElementD_, EpilogueSchedule_>,
                       public co_epi::StagedTypes<ElementC_, ElementD_, ElementBias_, Stride_, HasBias_, Residual_,
                                                  TileShape_> {
 public:
  using Types = co_epi::StagedTypes<ElementC_, ElementD_, ElementBias_, Stride_, HasBias_, Residual_, TileShape_>;
  using typename Types::ElementD;
  using typename Types::ElementBias;
  using typename Types::GmemElementC;
  using Types::HasBias;
  using Types::Residual;
  using Types::TileM;
  using Types::TileN;
  static constexpr int Groups = TileN / 8;
  static constexpr int EpiN = 8 * chunk_groups(Groups, MaxChunkGroups_);
  // staged chunks in flight: with two, a chunk's staging need not wait for the
  // previous chunk's copy-out (its buffer was read two chunks before)
  static constexpr int Buffers = Buffers_;
  static constexpr int Vec = 16 / int(sizeof(ElementD_));      // elements of one 16-byte chunk
  static constexpr int Pitch = co_epi::staged_pitch<ElementD_>(EpiN);      // the staged tile's row
  static_assert(TileN % 8 == 0, "tile N must be a multiple of 8");
  static_assert(Buffers_ == 1 || Buffers_ == 2, "one or two staged chunks");

  // the staged chunk of D; C's chunk (cp.async, a residual only); the tile's bias
  struct SharedStorage {
    alignas(128) ElementD_ tile[Buffers_ * TileM * Pitch];
    alignas(16) GmemElementC c_tile[Residual_ != 0 ? TileM * Pitch : 1];
    alignas(16) ElementBias_ bias[HasBias_ ? TileN : 1];
  };
  using TensorStorage = SharedStorage;

  // thread.bias: (N,), HasBias only; ptr_C: (M, N, L) with dC's strides, Residual only
  using Arguments = co_epi::Arguments<ElementD_, ElementBias_, Stride_>;
  using Params = Arguments;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    // (M, N, K[, L]); a conv's M is (q, p, n), its L a static 1
    auto shape = cute::append<4>(problem_shape, 1);
    int L = int(cute::size(cute::get<3>(shape)));
    auto shape_m = cute::get<0>(shape);
    // 16-byte chunks of D and C
    return co_epi::rows_ok<Vec>(args.ptr_D, args.dD, shape_m, L) &&
           (Residual == 0 || co_epi::rows_ok<Vec>(args.ptr_C, args.dC, shape_m, L)) &&
           (!HasBias || args.thread.bias != nullptr);
  }

  CUTLASS_HOST_DEVICE
  StagedEpilogue(Params const& params_, SharedStorage const& = SharedStorage()) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return Residual != 0; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char* smem_buf) {
    using namespace cute;
    co_epi::check_accumulator_layout<FrgLayout, BlockShapeMNK, TileM, TileN>();

    // a conv's M arrives linearized (its mainloop's problem shape); size() either way
    int M = int(size(get<0>(problem_shape_mnkl)));
    int N = int(size(get<1>(problem_shape_mnkl)));
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    int m0 = int(m_coord) * TileM;
    int n0 = int(n_coord) * TileN;

    // tile-relative (row, column) of every accumulator element of this thread
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor cTile = make_identity_tensor(make_shape(size<0>(blk_shape_MNK), size<1>(blk_shape_MNK)));
    Tensor tCc = thr_mma.partition_C(cTile);
    CUTE_STATIC_ASSERT_V(size(tCc) == size(accumulators), "one coordinate per accumulator");

    int64_t ldd = co_epi::row_stride(params.dD);
    // the tile's first element of D: the stores below add only their place in the tile
    ElementD* d_tile = params.ptr_D + int64_t(l_coord) * int64_t(get<2>(params.dD)) + int64_t(m0) * ldd + n0;
    int64_t ldc = co_epi::row_stride(params.dC);
    GmemElementC const* c_src = nullptr;
    if constexpr (Residual != 0) {
      c_src = static_cast<GmemElementC const*>(params.ptr_C) + int64_t(l_coord) * int64_t(get<2>(params.dC)) +
              int64_t(m0) * ldc + n0;     // the tile's first element
    }
    // packed conversions (two or eight at a time: cvt.rn.f16x2.f32 and kin), fewer
    // instructions per element than scalar ones
    constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;
    cutlass::NumericArrayConverter<ElementD, float, 2, RN> to_d2;
    cutlass::NumericArrayConverter<float, ElementD, 2, RN> from_d2;
    cutlass::NumericArrayConverter<float, ElementBias, 2, RN> from_bias2;
    cutlass::NumericArrayConverter<ElementD, float, Vec, RN> to_dv;
    cutlass::NumericArrayConverter<float, ElementD, Vec, RN> from_dv;
    cutlass::NumericArrayConverter<float, GmemElementC, Vec, RN> from_cv;
    Activation_<float> act;
    Post_<float> post;

    constexpr int Threads = int(size(TiledMma{}));
    auto sync_tile = [] { co_epi::sync_staged_tile<Threads>(); };
    constexpr int ChunkGroups = EpiN / 8;
    constexpr int ChunksPerRow = EpiN / Vec;

    auto& storage = *reinterpret_cast<SharedStorage*>(smem_buf);

    // The tile's bias in shared memory, loaded once (it repeats down the rows) and
    // visible after the first chunk's barrier. The previous tile's last reads of it
    // came before that tile's last barrier (in the ping-pong kernel, before the other
    // group's epilogue began).
    if constexpr (HasBias) {
      for (int t = thread_idx; t < TileN; t += Threads) {
        storage.bias[t] = n0 + t < N ? params.thread.bias[n0 + t] : ElementBias(0);
      }
    }

    // a tile wholly inside the problem skips every bound check below
    bool const full_tile = m0 + TileM <= M && n0 + TileN <= N;
    // Where a thread's 16-byte chunks lie RowStep rows apart (the threads cover whole
    // rows), its global addresses are a first one plus iteration * RowStep rows: no
    // 64-bit row product per store.
    constexpr bool RowSteps = Threads % ChunksPerRow == 0;
    constexpr int RowStep = Threads / ChunksPerRow;
    int const trow0 = thread_idx / ChunksPerRow;
    int const tcol0 = (thread_idx % ChunksPerRow) * Vec;
    // (offset of the thread's first chunk, distance between its iterations) in D and C
    int64_t const d_first = int64_t(trow0) * ldd + tcol0, d_step = int64_t(RowStep) * ldd;
    int64_t const c_first = int64_t(trow0) * ldc + tcol0, c_step = int64_t(RowStep) * ldc;
    auto gmem_at = [&](auto* tile_start, int64_t ld, int64_t first, int64_t step, auto i, int trow, int tcol) {
      if constexpr (RowSteps) {
        return tile_start + (first + int64_t(decltype(i)::value) * step);
      } else {
        return tile_start + (int64_t(trow) * ld + tcol);
      }
    };
    // C's chunks go to shared memory by cp.async, each issued a chunk ahead of its use
    // (the first before the first chunk's staging): a load of C beside each store
    // would wait a round trip to memory per 16 bytes (loads after stores of D cannot
    // be hoisted: the pointers might alias). Each thread copies the 16-byte chunks it
    // later reads (one mapping, for_each_staged_chunk), so waiting for its own copies
    // suffices; chunks that leave the problem are read from C where they are used.
    auto load_c = [&](int chunk) {
      if constexpr (Residual != 0) {
        auto issue = [&](auto full) {
          co_epi::for_each_staged_chunk<Threads, TileM, ChunksPerRow, Vec>(thread_idx, [&](auto i, int trow, int tcol) {
            int row = m0 + trow;
            int col = n0 + chunk * EpiN + tcol;
            cutlass::arch::cp_async<16, cutlass::arch::CacheOperation::Global>(
                storage.c_tile + trow * Pitch + tcol,
                gmem_at(c_src, ldc, c_first, c_step, i, trow, tcol) + chunk * EpiN,
                decltype(full)::value || (row < M && col + Vec <= N));
          });
        };
        if (full_tile) {
          issue(cute::true_type{});
        } else {
          issue(cute::false_type{});
        }
        cutlass::arch::cp_async_fence();
      }
    };
    load_c(0);

    CUTLASS_PRAGMA_UNROLL
    for (int chunk = 0; chunk < Groups / ChunkGroups; ++chunk) {
      int const chunk_col0 = chunk * EpiN;     // the chunk's first column in the tile
      // this chunk's staging buffer
      ElementD* tile = storage.tile + (chunk % Buffers) * (TileM * Pitch);
      // the reads of the buffer's previous chunk are done: with two buffers those came
      // before the previous chunk's second barrier, except across tiles. The bias is in.
      if (Buffers == 1 || chunk == 0) {
        sync_tile();
      }

      // this chunk's bias pairs, once: every row of the thread's shares them
      cutlass::Array<float, 2> bias_f[HasBias ? ChunkGroups : 1];
      if constexpr (HasBias) {
        CUTLASS_PRAGMA_UNROLL
        for (int jj = 0; jj < ChunkGroups; ++jj) {
          int tcol = int(get<1>(tCc(make_coord(make_coord(0, 0, chunk * ChunkGroups + jj), 0, 0))));
          bias_f[jj] = from_bias2(*reinterpret_cast<cutlass::Array<ElementBias, 2> const*>(storage.bias + tcol));
        }
      }
      // act(acc + bias) of the thread's pair at (row + 8 r, 8-column group j), rounded, packed
      auto pair = [&](int mm, int r, int jj) {
        int j = chunk * ChunkGroups + jj;
        cutlass::Array<float, 2> x;
        x[0] = accumulators(make_coord(make_coord(0, r, j), mm, 0));
        x[1] = accumulators(make_coord(make_coord(1, r, j), mm, 0));
        if constexpr (HasBias) {
          x[0] += bias_f[jj][0];
          x[1] += bias_f[jj][1];
        }
        if constexpr (HasActivation_) {
          if constexpr (HasBias) {
            x = from_d2(to_d2(x));      // the bias add's rounding
          }
          x[0] = act(x[0]);
          x[1] = act(x[1]);
        }
        cutlass::Array<ElementD, 2> out = to_d2(x);
        return reinterpret_cast<uint32_t const&>(out);
      };
      // stmatrix: a warp's pairs of two 8-column groups (four 8x8 matrices: rows r = 0
      // and 1 of group j, then of j + 1, each lane holding its pair of every one: the
      // wgmma accumulator layout) in one instruction, lane l giving the address of row
      // l % 8 of matrix l / 8. An odd last group goes as two matrices.
      int const lane = thread_idx % 32;
      CUTLASS_PRAGMA_UNROLL
      for (int mm = 0; mm < size<1>(FrgLayout{}); ++mm) {
        CUTLASS_PRAGMA_UNROLL
        for (int jj = 0; jj < ChunkGroups; jj += 2) {
          auto crd = tCc(make_coord(make_coord(0, 0, chunk * ChunkGroups + jj), mm, 0));
          int row0 = int(get<0>(crd)) - lane / 4;                        // the warp's first row here
          int col0 = int(get<1>(crd)) - 2 * (lane % 4) - chunk_col0;     // the group's first column
          int i = lane / 8;
          if (jj + 1 < ChunkGroups) {
            ElementD* dst = tile + (row0 + (i % 2) * 8 + lane % 8) * Pitch + col0 + (i / 2) * 8;
            cute::SM90_U32x4_STSM_N::copy(pair(mm, 0, jj), pair(mm, 1, jj), pair(mm, 0, jj + 1), pair(mm, 1, jj + 1),
                                          *reinterpret_cast<cute::uint128_t*>(dst));
          } else {
            ElementD* dst = tile + (row0 + (i % 2) * 8 + lane % 8) * Pitch + col0;
            cute::SM90_U32x2_STSM_N::copy(pair(mm, 0, jj), pair(mm, 1, jj), *reinterpret_cast<cute::uint128_t*>(dst));
          }
        }
      }
      sync_tile();     // the chunk is in shared memory
      if constexpr (Residual != 0) {
        cutlass::arch::cp_async_wait<0>();     // this thread's copies of C's chunk
      }

      // whole 16-byte chunks of the tile's rows to D, a warp 512 bytes at a time (a
      // tile inside the problem in a copy of its own, without the bound checks)
      auto store_chunk = [&](auto full) {
        constexpr bool Full = decltype(full)::value;
        co_epi::for_each_staged_chunk<Threads, TileM, ChunksPerRow, Vec>(thread_idx, [&](auto i, int trow, int tcol) {
          int row = m0 + trow;
          int col = n0 + chunk_col0 + tcol;
          if (!Full && (row >= M || col >= N)) {
            return;
          }
          bool whole = Full || col + Vec <= N;
          cutlass::AlignedArray<ElementD, Vec> v =
              *reinterpret_cast<cutlass::AlignedArray<ElementD, Vec> const*>(tile + trow * Pitch + tcol);
          if constexpr (Residual != 0) {
            cutlass::AlignedArray<GmemElementC, Vec> cv;
            if (whole) {
              cv = *reinterpret_cast<cutlass::AlignedArray<GmemElementC, Vec> const*>(storage.c_tile + trow * Pitch +
                                                                                       tcol);
            } else {
              GmemElementC const* src = gmem_at(c_src, ldc, c_first, c_step, i, trow, tcol) + chunk_col0;
              CUTLASS_PRAGMA_UNROLL
              for (int e = 0; e < Vec; ++e) {
                cv[e] = col + e < N ? src[e] : GmemElementC(0);
              }
            }
            auto x = from_dv(reinterpret_cast<cutlass::Array<ElementD, Vec> const&>(v));
            auto y = from_cv(reinterpret_cast<cutlass::Array<GmemElementC, Vec> const&>(cv));
            CUTLASS_PRAGMA_UNROLL
            for (int e = 0; e < Vec; ++e) {
              x[e] = Residual == 1 ? x[e] + y[e] : x[e] * y[e];
            }
            if constexpr (HasPost_) {
              x = from_dv(to_dv(x));      // the residual op's rounding
              CUTLASS_PRAGMA_UNROLL
              for (int e = 0; e < Vec; ++e) {
                x[e] = post(x[e]);
              }
            }
            reinterpret_cast<cutlass::Array<ElementD, Vec>&>(v) = to_dv(x);
          }
          ElementD* dst = gmem_at(d_tile, ldd, d_first, d_step, i, trow, tcol) + chunk_col0;
          if (whole) {
            *reinterpret_cast<cutlass::AlignedArray<ElementD, Vec>*>(dst) = v;
          } else {
            CUTLASS_PRAGMA_UNROLL
            for (int e = 0; e < Vec; ++e) {
              if (col + e < N) {
                dst[e] = v[e];
              }
            }
          }
        });
      };
      if (full_tile) {
        store_chunk(cute::true_type{});
      } else {
        store_chunk(cute::false_type{});
      }
      // the next chunk of C into the buffer this thread has just read (its values are
      // in the stores above, so the reads are done)
      if (chunk + 1 < Groups / ChunkGroups) {
        load_c(chunk + 1);
      }
    }
  }

 private:
  Params params;
};

}  // namespace co_staged

#endif  // CO_STAGED_EPILOGUE_H
