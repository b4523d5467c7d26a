// A gated-linear-unit (GLU) epilogue for the CUTLASS 3.x sm90 GEMM kernels
// (emit/gemm_sm90.py; wrapped in cutlass::epilogue::collective::detail::
// Sm90TmaWarpSpecializedAdapter like CUTLASS's DefaultEpilogue, which it follows).
//
// The GEMM's N columns hold gate and up values interleaved in blocks of 8:
// columns 16i .. 16i+7 are the gate of output columns 8i .. 8i+7, columns
// 16i+8 .. 16i+15 their up (partition/gated_gemm.py interleaves the weights so).
// D, (M, N / 2) row-major, gets
//     D = round(act(round(gate [+ bias_g]))) * round(up [+ bias_u])
// rounded to ElementD as PyTorch rounds each op's result (two linears, the
// activation, the product). The bias, when there is one, has N values
// interleaved like the columns.
//
// Why blocks of 8: a warpgroup's wgmma accumulator gives each thread two adjacent
// columns of every 8-column group (value mode (2, 2, N/8) of the 64 x N atom's
// C layout: column pair, row + 8, column group), so a thread holds a column's gate
// (group 2j) and up (group 2j + 1) in registers and computes their product with no
// exchange between threads.
//
// Two ways to store the product (Staged_):
// * registers (false): each thread writes its column pairs to D directly, 2 x 16
//   bits per thread and row, 16 contiguous bytes per quad of threads; no shared
//   memory. On the H200 this ran the UNet's short-K GEGLU projections 2.3x slower
//   than the plain GEMM with its TMA store (session 23).
// * staged (true): the products go to a shared-memory tile (TileM x Pitch elements,
//   Pitch >= TileN / 2 chosen so the 8 rows of a warp's 4-byte writes fall in
//   distinct banks), then every thread of the epilogue copies whole 16-byte row
//   chunks to D, a warp 512 contiguous-in-row bytes at a time, as CUTLASS's
//   epilogue does after its own smem stage (without TMA: no tensor map to build).
//   Named barriers (the group's threads) bracket the tile: before the writes (the
//   group's reads of the previous tile are done) and between writes and reads. The
//   ping-pong kernel orders its two warp groups' epilogues (math_wg_order_barrier),
//   so they share the one tile.
//
// Spliced into a unit's code after its includes, once per unit (the guard).
#ifndef CO_GLU_EPILOGUE_H
#define CO_GLU_EPILOGUE_H

namespace co_glu {

template <class ElementD_, class ElementBias_, template <class> class Activation_, bool HasBias_,
          class EpilogueSchedule_, class TileShape_, bool Staged_>
class GluEpilogue : public co_epi::NoWorkspace<co_epi::Arguments<ElementD_, ElementBias_>>,
                    public co_epi::AdapterTypes<ElementD_, EpilogueSchedule_>,
                    public co_epi::StagedTypes<void, ElementD_, ElementBias_, cute::Stride<int64_t, cute::_1, int64_t>,
                                               HasBias_, 0, TileShape_> {
 public:
  using Types = co_epi::StagedTypes<void, ElementD_, ElementBias_, cute::Stride<int64_t, cute::_1, int64_t>,
                                    HasBias_, 0, TileShape_>;
  using typename Types::ElementD;
  using Types::HasBias;
  using Types::TileM;
  using Types::TileN;
  static constexpr bool Staged = Staged_;
  static constexpr int Vec = 16 / int(sizeof(ElementD_));      // elements of one 16-byte chunk
  static constexpr int Pitch = co_epi::staged_pitch<ElementD_>(TileN / 2);   // the staged tile's row
  static_assert(TileN % 16 == 0, "tile N must be a multiple of 16");

  struct StagedStorage {
    alignas(128) ElementD_ tile[TileM * Pitch];
  };
  struct EmptyStorage {};
  using SharedStorage = cute::conditional_t<Staged_, StagedStorage, EmptyStorage>;
  using TensorStorage = SharedStorage;

  using Arguments = co_epi::Arguments<ElementD_, ElementBias_>;   // thread.bias: (N,), interleaved
  using Params = Arguments;

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto N = cute::get<1>(problem_shape);
    // whole 16-column blocks (N / 2 a multiple of 8); 4-byte aligned pair stores, or
    // 16-byte chunks from the staged tile (every row and batch start 16-byte aligned)
    constexpr int align = Staged ? Vec : 2;
    bool strides_ok = cute::get<0>(args.dD) % align == 0 && cute::get<2>(args.dD) % align == 0;
    return N % 16 == 0 && args.ptr_D != nullptr && strides_ok &&
           (reinterpret_cast<uintptr_t>(args.ptr_D) % (align * sizeof(ElementD))) == 0 &&
           (!HasBias || args.thread.bias != nullptr);
  }

  CUTLASS_HOST_DEVICE
  GluEpilogue(Params const& params_, SharedStorage const& = SharedStorage()) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char* smem_buf) {
    using namespace cute;
    static_assert(is_static<BlockShapeMNK>::value, "the CTA tile shape must be static");
    static_assert(is_static<FrgLayout>::value, "the accumulator layout must be static");
    // ((column pair, row + 8, column groups of 8), MMA_M, MMA_N): the wgmma C layout
    static_assert(rank(FrgLayout{}) == 3 && rank<0>(FrgLayout{}) == 3, "unexpected accumulator layout");
    static_assert(size<0, 0>(FrgLayout{}) == 2 && size<0, 1>(FrgLayout{}) == 2,
                  "unexpected accumulator layout");
    constexpr int Groups = size<0, 2>(FrgLayout{});
    static_assert(Groups % 2 == 0, "each wgmma's N must hold whole 16-column gate/up blocks");
    static_assert(size<1>(BlockShapeMNK{}) % 16 == 0, "tile N must be a multiple of 16");

    int M = get<0>(problem_shape_mnkl);
    int N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    int m0 = int(m_coord) * int(size<0>(blk_shape_MNK));
    int n0 = int(n_coord) * int(size<1>(blk_shape_MNK));   // a multiple of 16

    // tile-relative (row, column) of every accumulator element of this thread
    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor cTile = make_identity_tensor(make_shape(size<0>(blk_shape_MNK), size<1>(blk_shape_MNK)));
    Tensor tCc = thr_mma.partition_C(cTile);
    CUTE_STATIC_ASSERT_V(size(tCc) == size(accumulators), "one coordinate per accumulator");

    int64_t ldd = get<0>(params.dD);
    ElementD* d = params.ptr_D + int64_t(l_coord) * get<2>(params.dD);
    cutlass::NumericConverter<ElementD, float, cutlass::FloatRoundStyle::round_to_nearest> to_d;
    Activation_<float> act;

    // The bias values of this thread's columns, loaded once before any store: they
    // repeat down the rows, and loads after the stores of D could not be hoisted past
    // them by the compiler (the pointers might alias).
    constexpr int MmaN = size<2>(FrgLayout{});
    float bias_g[MmaN][Groups / 2][2];
    float bias_u[MmaN][Groups / 2][2];
    if constexpr (HasBias) {
      CUTLASS_PRAGMA_UNROLL
      for (int mn = 0; mn < MmaN; ++mn) {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < Groups / 2; ++j) {
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < 2; ++c) {
            int col = n0 + int(get<1>(tCc(make_coord(make_coord(c, 0, 2 * j), 0, mn))));
            bool in = col < N;
            bias_g[mn][j][c] = in ? float(params.thread.bias[col]) : 0.f;
            bias_u[mn][j][c] = in ? float(params.thread.bias[col + 8]) : 0.f;
          }
        }
      }
    }

    // the staged tile: the group's reads of the previous tile are done before any write
    constexpr int Threads = int(size(TiledMma{}));
    // the staged tile's barrier (co_epi::sync_staged_tile), in the staged form only
    auto sync_tile = [] { co_epi::sync_staged_tile<Threads>(); };
    ElementD* tile = reinterpret_cast<ElementD*>(smem_buf);
    if constexpr (Staged) {
      static_assert(size<0>(BlockShapeMNK{}) == TileM && size<1>(BlockShapeMNK{}) == TileN,
                    "the staged tile is sized for TileShape");
      sync_tile();
    }

    CUTLASS_PRAGMA_UNROLL
    for (int mn = 0; mn < MmaN; ++mn) {
      CUTLASS_PRAGMA_UNROLL
      for (int mm = 0; mm < size<1>(FrgLayout{}); ++mm) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < 2; ++r) {
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < Groups / 2; ++j) {
            auto gate0 = make_coord(make_coord(0, r, 2 * j), mm, mn);
            auto crd = tCc(gate0);
            int trow = int(get<0>(crd));
            int tcol = int(get<1>(crd));          // the gate's column in the tile, % 16 in {0, 2, 4, 6}
            int row = m0 + trow;
            int col = n0 + tcol;
            if constexpr (!Staged) {
              if (row >= M || col >= N) {
                continue;
              }
            }
            cutlass::AlignedArray<ElementD, 2> out;
            CUTLASS_PRAGMA_UNROLL
            for (int c = 0; c < 2; ++c) {
              float g = accumulators(make_coord(make_coord(c, r, 2 * j), mm, mn));
              float u = accumulators(make_coord(make_coord(c, r, 2 * j + 1), mm, mn));
              if constexpr (HasBias) {
                g += bias_g[mn][j][c];
                u += bias_u[mn][j][c];
              }
              float a = float(to_d(act(float(to_d(g)))));
              out[c] = to_d(a * float(to_d(u)));
            }
            int out_tcol = (tcol >> 4) * 8 + (tcol & 7);
            if constexpr (Staged) {
              *reinterpret_cast<cutlass::AlignedArray<ElementD, 2>*>(tile + trow * Pitch + out_tcol) = out;
            } else {
              int out_col = (col >> 4) * 8 + (col & 7);
              *reinterpret_cast<cutlass::AlignedArray<ElementD, 2>*>(d + int64_t(row) * ldd + out_col) = out;
            }
          }
        }
      }
    }

    if constexpr (Staged) {
      sync_tile();
      // whole 16-byte chunks of the tile's rows to D: N / 2 is a multiple of 8, so a
      // chunk is all in or all out of D's columns
      int const n_out = N / 2;
      int const col0 = n0 / 2;
      co_epi::for_each_staged_chunk<Threads, TileM, (TileN / 2) / Vec, Vec>(thread_idx, [&](auto, int trow, int tcol) {
        int row = m0 + trow;
        int col = col0 + tcol;
        if (row < M && col < n_out) {
          uint4 v = *reinterpret_cast<uint4 const*>(tile + trow * Pitch + tcol);
          *reinterpret_cast<uint4*>(d + int64_t(row) * ldd + col) = v;
        }
      });
    }
  }

 private:
  Params params;
};

}  // namespace co_glu

#endif  // CO_GLU_EPILOGUE_H
