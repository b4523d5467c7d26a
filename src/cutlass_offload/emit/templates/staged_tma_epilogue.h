// The staged elementwise epilogue of templates/staged_epilogue.h with its stores done
// by TMA: the same math (D = post(residual_op(act(acc + bias), C)), rounded to ElementD
// after every op), with the output staged in TMA's swizzled box layout by stmatrix
// and written by cp.async.bulk.tensor from one thread per warp group, C read into
// the same layout by cp.async and taken back into the accumulator layout by ldmatrix.
// emit/staged.py picks it with STORE = "tma".
//
// Why: the 16-byte row stores of staged_epilogue.h lost 13% (geomean; up to 39%)
// against CUTLASS's TMA epilogue (session 38, H100): each thread waits on its own
// stores and bound checks, while TMA stores run asynchronously and clip at the
// problem's edges. This keeps the staged epilogue's plain class template (what makes
// it about half the nvcc time of CUTLASS's TMA epilogue with its fusion callbacks)
// and takes the TMA epilogue's way of writing: cute's TMA and ldmatrix / stmatrix
// wrappers are a few lines of inline PTX each.
//
// How: the tile's columns go out in chunks of EpiN = 64, 32 or 16 (the widest that
// divides TileN, at most MaxChunkCols_; 32 by default, CUTLASS's own subtile width),
// i.e. box rows of 128, 64 or 32 bytes with TMA's swizzle of that width, so
// stmatrix's eight 16-byte rows of a matrix fall in distinct banks. A box is 64 rows
// (one wgmma's M). Each warp group stages and stores its boxes one at a time (chunk
// by chunk, each of its 64-row blocks), between named barriers of its own, in a
// shared-memory region of its own (Groups_ = 2 in the cooperative kernel, whose
// groups run at once); the ping-pong kernel orders its groups' epilogues
// (math_wg_order_barrier), so they share one region. Buffers_ boxes are in flight: a
// box's staging waits only for the store of the box Buffers_ before it. C goes to
// two boxes per region a step ahead. At the end the storing thread waits until TMA
// has read every box, then the group's barrier, before any thread can stage again.
// Shared memory: Groups_ x (Buffers_ + 2 with a residual) x 64 x EpiN x 2 bytes, 16
// KB for a ping-pong kernel's residual epilogue at the defaults (the mainloop's
// stages are counted after it).
//
// Needs: what staged_epilogue.h needs (16-bit C and D; D and C rows and batch starts
// 16-byte aligned; a conv's NPQK packed), TileN a multiple of 16 and, with a
// residual, N a multiple of 8; can_implement also encodes D's tensor map. Each op is
// rounded as staged_epilogue.h rounds it.
//
// Spliced into a unit's code after staged_common.h and tma_driver.h, once per unit.
#ifndef CO_STAGED_TMA_EPILOGUE_H
#define CO_STAGED_TMA_EPILOGUE_H

namespace co_staged {

// The widest chunk of 64, 32 or 16 columns (at most max_cols) that tiles tile_n; 0 if none.
constexpr int tma_chunk_cols(int tile_n, int max_cols) {
  for (int c = 64; c >= 16; c /= 2) {
    if (c <= max_cols && tile_n % c == 0) {
      return c;
    }
  }
  return 0;
}

// TMA's swizzle of a box whose rows are RowBytes (32, 64 or 128) long, on a byte
// offset from a 1024-byte aligned box: the 16-byte chunk bits [4, 4 + log2(RowBytes /
// 16)) are XORed with the bits above 128 bytes (CU_TENSOR_MAP_SWIZZLE_32B / 64B /
// 128B; cute's Swizzle<1|2|3, 4, 3>). The hardware applies it to the shared memory
// address, which equals this where the box is 1024-byte aligned (checked); on the
// offset, the compiler folds the parts known at compile time.
template <int RowBytes>
CUTLASS_DEVICE uint32_t tma_swizzle(uint32_t offset) {
  constexpr uint32_t mask = RowBytes / 16 - 1;
  return offset ^ (((offset >> 7) & mask) << 4);
}

CUTLASS_DEVICE void stsm_x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b),
               "r"(c), "r"(d));
}

CUTLASS_DEVICE void ldsm_x4(uint32_t addr, uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
  asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
               : "r"(addr));
}

// 16 bytes from global to shared memory, skipped where !pred
CUTLASS_DEVICE void cp_async_16(uint32_t smem_addr, void const* gmem, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(smem_addr),
      "l"(gmem), "r"(int(pred)));
}

template <class ElementC_, class ElementD_, class ElementBias_, template <class> class Activation_,
          bool HasActivation_, bool HasBias_, int Residual_, template <class> class Post_, bool HasPost_,
          class EpilogueSchedule_, class TileShape_, class Stride_ = cute::Stride<int64_t, cute::_1, int64_t>,
          int MaxChunkCols_ = 64, int Buffers_ = 2, int Groups_ = 1, bool Glu_ = false>
class TmaStagedEpilogue : public co_epi::NoWorkspace<co_epi::Arguments<ElementD_, ElementBias_, Stride_>>,
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
  // Glu_: the tile's columns are gate and up interleaved in blocks of 8 (as
  // templates/glu_epilogue.h reads them) and D gets act(gate) * up, TileN / 2 wide
  static constexpr bool Glu = Glu_;
  static constexpr int OutN = Glu_ ? TileN / 2 : TileN;     // D's columns of a tile
  static constexpr int EpiN = tma_chunk_cols(OutN, MaxChunkCols_);
  static constexpr int RowBytes = EpiN * 2;       // a box row: the swizzle's width
  static constexpr int BoxRows = 64;              // one wgmma's M
  static constexpr int BoxBytes = BoxRows * RowBytes;
  static constexpr int Buffers = Buffers_;
  // warp groups in their epilogue at once: 1 in the ping-pong kernel (its groups take
  // turns and share the boxes), 2 in the cooperative one (a region each)
  static constexpr int Groups = Groups_;
  static_assert(EpiN != 0, "D's tile width must be a multiple of 16");
  static_assert(!Glu_ || (Residual_ == 0 && !HasPost_), "a GLU has no residual");
  static_assert(TileM % BoxRows == 0, "tile M must be a multiple of 64");
  static_assert(Buffers_ >= 1 && Buffers_ <= 4, "one to four boxes in flight");
  static_assert(Groups_ == 1 || Groups_ == 2, "one or two consumer warp groups");

  // D's boxes [group][buffer], each BoxBytes; C's [group][2] (a residual only).
  // 1024-byte aligned: the 128-byte swizzle's period.
  struct SharedStorage {
    alignas(1024) char d[Groups_ * Buffers_ * BoxBytes];
    alignas(1024) char c[Residual_ != 0 ? Groups_ * 2 * BoxBytes : 1];
  };
  using TensorStorage = SharedStorage;

  // thread.bias: (N,), HasBias only; ptr_C: (M, N, L) with dC's strides, Residual only.
  // No workspace (NoWorkspace's); its own Params and to_underlying_arguments (below).
  using Arguments = co_epi::Arguments<ElementD_, ElementBias_, Stride_>;
  struct Params {
    CUtensorMap tma_d;   // D as (N or N / 2, M, L), box (EpiN, 64, 1), swizzled RowBytes
    Arguments args;
  };

  // D's tensor map for problem_shape ((M, N, K[, L]); a conv's M (q, p, n)); false
  // where the driver refuses it (or cannot be reached)
  template <class ProblemShape>
  static bool encode_d(ProblemShape const& problem_shape, Arguments const& args, CUtensorMap* out) {
    auto shape = cute::append<4>(problem_shape, 1);
    uint64_t M = uint64_t(cute::size(cute::get<0>(shape)));
    uint64_t N = uint64_t(cute::size(cute::get<1>(shape))) / (Glu_ ? 2 : 1);
    uint64_t L = uint64_t(cute::size(cute::get<3>(shape)));
    if (M == 0 || N == 0 || L == 0 || args.ptr_D == nullptr) {
      return false;
    }
    uint64_t ldd = uint64_t(co_epi::row_stride(args.dD));
    // a single batch's stride is never used; any multiple of 16 bytes will do
    uint64_t batch = L > 1 ? uint64_t(int64_t(cute::get<2>(args.dD))) : ldd * M;
    cuuint64_t dims[3] = {N, M, L};
    cuuint64_t strides[2] = {ldd * sizeof(ElementD_), batch * sizeof(ElementD_)};
    cuuint32_t box[3] = {uint32_t(EpiN), uint32_t(BoxRows), 1u};
    cuuint32_t element_strides[3] = {1u, 1u, 1u};
    CUtensorMapDataType dtype = cute::is_same_v<ElementD_, cutlass::bfloat16_t> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    CUtensorMapSwizzle swizzle = RowBytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                 : RowBytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                  : CU_TENSOR_MAP_SWIZZLE_32B;
    CUresult r = co_driver::call_cuTensorMapEncodeTiled(
        out, dtype, 3u, static_cast<void*>(args.ptr_D), dims, strides, box, element_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS;
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void*) {
    Params params{};
    params.args = args;
    encode_d(problem_shape, args, &params.tma_d);   // can_implement has encoded it once already
    return params;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto shape = cute::append<4>(problem_shape, 1);
    int L = int(cute::size(cute::get<3>(shape)));
    auto shape_m = cute::get<0>(shape);
    CUtensorMap probe;
    constexpr int Vec = 16 / int(sizeof(ElementD_));
    // C is read in whole 16-byte pieces: N a multiple of them (as align_c = 8 makes it)
    bool c_ok = Residual == 0 ||
                (co_epi::rows_ok<Vec>(args.ptr_C, args.dC, shape_m, L) && int(cute::get<1>(shape)) % Vec == 0);
    // a GLU's N: whole 16-column gate / up blocks
    bool n_ok = !Glu_ || int(cute::get<1>(shape)) % 16 == 0;
    // D in 16-byte aligned rows (TMA's global strides and address)
    return co_epi::rows_ok<Vec>(args.ptr_D, args.dD, shape_m, L) && c_ok && n_ok &&
           (!HasBias || args.thread.bias != nullptr) && encode_d(problem_shape, args, &probe);
  }

  // params_ is the kernel's __grid_constant__ Params: TMA reads the map where it lies
  CUTLASS_HOST_DEVICE
  TmaStagedEpilogue(Params const& params_, SharedStorage const& = SharedStorage()) : params(&params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return Residual != 0; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine,
            class FrgLayout, class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl,
                                 cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                 ResidueMNK, int thread_idx, char* smem_buf) {
    using namespace cute;
    co_epi::check_accumulator_layout<FrgLayout, BlockShapeMNK, TileM, TileN>();
    // the warp groups of one tile's MMA run their epilogues at once: a region each
    // (the ping-pong kernel's two groups each hold a whole tile and take turns)
    static_assert(int(size(TiledMma{})) == 128 * Groups_, "Groups_: the tile's consumer warp groups");
    constexpr int MmaM = size<1>(FrgLayout{});     // the 64-row blocks this warp group holds
    constexpr int ChunkGroups = EpiN / 8;          // D's 8-column groups of a chunk (even)
    constexpr int Chunks = OutN / EpiN;
    // the accumulator's 8-column groups of D's group j: j; a GLU's gate 2j and up 2j + 1
    constexpr int AccPerGroup = Glu_ ? 2 : 1;
    constexpr int Vec = 16 / int(sizeof(ElementD_));

    int M = int(size(get<0>(problem_shape_mnkl)));    // a conv's M linearized
    int N = int(size(get<1>(problem_shape_mnkl)));
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    int m0 = int(m_coord) * TileM;
    int n0 = int(n_coord) * TileN;
    Arguments const& args = params->args;

    auto thr_mma = tiled_mma.get_thread_slice(thread_idx);
    Tensor cTile = make_identity_tensor(make_shape(size<0>(blk_shape_MNK), size<1>(blk_shape_MNK)));
    Tensor tCc = thr_mma.partition_C(cTile);
    CUTE_STATIC_ASSERT_V(size(tCc) == size(accumulators), "one coordinate per accumulator");

    int const lane = thread_idx % 32;
    int const wg_thread = thread_idx % 128;
    bool const storer = wg_thread == 0;
    // this group's barrier: one id per consumer warp group (the ping-pong kernel's
    // groups alternate; the cooperative kernel's run at once)
    uint32_t const barrier_id = uint32_t(cutlass::canonical_warp_group_idx() & 1);
    auto sync_group = [&] { cutlass::arch::NamedBarrier::sync(128, barrier_id); };

    // the 64-row block of each of the thread's MMA_M rows, and its row in the block
    // of lane l's stmatrix / ldmatrix address (row l % 8 of matrix l / 8; matrices:
    // rows 0-7 and 8-15 of group j, then of group j + 1)
    int block[MmaM];
    uint32_t row_off[MmaM];     // that row's byte offset in a box
    CUTLASS_PRAGMA_UNROLL
    for (int mm = 0; mm < MmaM; ++mm) {
      int row = int(get<0>(tCc(make_coord(make_coord(0, 0, 0), mm, 0))));
      block[mm] = row / BoxRows;
      int warp_row0 = row % BoxRows - lane / 4;
      row_off[mm] = uint32_t((warp_row0 + ((lane / 8) % 2) * 8 + lane % 8) * RowBytes);
    }
    uint32_t const d_base = cute::cast_smem_ptr_to_uint(smem_buf + offsetof(SharedStorage, d));
    uint32_t const c_base = cute::cast_smem_ptr_to_uint(smem_buf + offsetof(SharedStorage, c));
    // the swizzle below is computed on offsets: a misaligned box would scramble D
    // (alignas(1024) and the kernel's aligned shared memory rule it out; a trap, not
    // wrong output, if not)
    if ((d_base | (Residual != 0 ? c_base : 0u)) % 1024u != 0) {
      __trap();
    }
    // this group's region of the boxes (the cooperative kernel's thread_idx counts
    // both groups' threads) and a box's byte offset from d_base / c_base in it
    int const region = Groups == 1 ? 0 : (thread_idx / 128) % Groups;
    auto d_off = [&](int buffer) { return uint32_t((region * Buffers + buffer) * BoxBytes); };
    auto d_box = [&](int buffer) { return d_base + d_off(buffer); };
    auto c_box = [&](int buffer) { return c_base + uint32_t((region * 2 + buffer) * BoxBytes); };

    bool const full_tile = m0 + TileM <= M && n0 + TileN <= N;

    // The group's boxes go out one (column chunk, 64-row block) step at a time, chunk
    // by chunk: step s is chunk s / MmaM of the thread's block s % MmaM.
    constexpr int Steps = Chunks * MmaM;

    // C's box of step s into C buffer s % 2 by cp.async, in the swizzled layout
    // ldmatrix reads back; what lies outside the problem is left (its results are
    // clipped by the TMA store)
    int64_t const ldc = co_epi::row_stride(args.dC);
    GmemElementC const* c_tile = nullptr;
    if constexpr (Residual != 0) {
      c_tile = static_cast<GmemElementC const*>(args.ptr_C) + int64_t(l_coord) * int64_t(get<2>(args.dC)) +
               int64_t(m0) * ldc + n0;
    }
    auto load_c = [&](int step) {
      if constexpr (Residual != 0) {
        constexpr int PiecesPerRow = EpiN / Vec;
        constexpr int Pieces = BoxRows * PiecesPerRow;
        static_assert(Pieces % 128 == 0, "whole passes of the warp group");
        int const chunk = step / MmaM, blk = block[step % MmaM];
        CUTLASS_PRAGMA_UNROLL
        for (int it = 0; it < Pieces / 128; ++it) {
          int piece = it * 128 + wg_thread;
          int r = piece / PiecesPerRow;
          int piece_col = (piece % PiecesPerRow) * Vec;     // in the chunk
          int col = chunk * EpiN + piece_col;                // in the tile
          int trow = blk * BoxRows + r;
          uint32_t dst = c_box(step % 2) + tma_swizzle<RowBytes>(uint32_t(r * RowBytes + piece_col * 2));
          GmemElementC const* src = c_tile + int64_t(trow) * ldc + col;
          // N is whole 16-byte pieces (can_implement): a piece is in or out
          cp_async_16(dst, src, full_tile || (m0 + trow < M && n0 + col < N));
        }
        cutlass::arch::cp_async_fence();
      }
    };

    constexpr auto RN = cutlass::FloatRoundStyle::round_to_nearest;
    cutlass::NumericArrayConverter<ElementD, float, 2, RN> to_d2;
    cutlass::NumericArrayConverter<float, ElementD, 2, RN> from_d2;
    cutlass::NumericArrayConverter<float, GmemElementC, 2, RN> from_c2;
    cutlass::NumericArrayConverter<float, ElementBias, 2, RN> from_bias2;
    Activation_<float> act;
    Post_<float> post;

    load_c(0);
    CUTLASS_PRAGMA_UNROLL
    for (int chunk = 0; chunk < Chunks; ++chunk) {
      // this chunk's bias pairs, one per accumulator group of the chunk (every row of
      // the thread's shares them; a GLU's bias is interleaved like its columns)
      constexpr int AccGroups = ChunkGroups * AccPerGroup;
      cutlass::Array<float, 2> bias_f[HasBias ? AccGroups : 1];
      if constexpr (HasBias) {
        // a pair's column is even: one load of the pair where the bias is aligned to it
        bool const pairs =
            full_tile && reinterpret_cast<uintptr_t>(args.thread.bias) % (2 * sizeof(ElementBias)) == 0;
        CUTLASS_PRAGMA_UNROLL
        for (int g = 0; g < AccGroups; ++g) {
          int col = n0 + int(get<1>(tCc(make_coord(make_coord(0, 0, chunk * AccGroups + g), 0, 0))));
          if (pairs) {
            bias_f[g] = from_bias2(*reinterpret_cast<cutlass::Array<ElementBias, 2> const*>(args.thread.bias + col));
          } else {
            bias_f[g][0] = col < N ? float(args.thread.bias[col]) : 0.f;
            bias_f[g][1] = col + 1 < N ? float(args.thread.bias[col + 1]) : 0.f;
          }
        }
      }
      // the thread's pair of accumulator group g of the chunk at (row + 8 r), plus its bias
      auto acc_pair = [&](int mm, int r, int g) {
        cutlass::Array<float, 2> x;
        x[0] = accumulators(make_coord(make_coord(0, r, chunk * AccGroups + g), mm, 0));
        x[1] = accumulators(make_coord(make_coord(1, r, chunk * AccGroups + g), mm, 0));
        if constexpr (HasBias) {
          x[0] += bias_f[g][0];
          x[1] += bias_f[g][1];
        }
        return x;
      };
      // act(acc + bias) [op C, post] of the thread's pair at (row + 8 r, D's group jj),
      // packed; a GLU's act(gate) * up, each operand rounded as glu_epilogue.h rounds it
      auto pair = [&](int mm, int r, int jj, uint32_t c_pair) {
        if constexpr (Glu_) {
          cutlass::Array<float, 2> g = from_d2(to_d2(acc_pair(mm, r, 2 * jj)));   // the gate linear's rounding
          cutlass::Array<float, 2> u = from_d2(to_d2(acc_pair(mm, r, 2 * jj + 1)));
          if constexpr (HasActivation_) {
            g[0] = act(g[0]);
            g[1] = act(g[1]);
            g = from_d2(to_d2(g));      // the activation's rounding
          }
          g[0] *= u[0];
          g[1] *= u[1];
          cutlass::Array<ElementD, 2> out = to_d2(g);
          return reinterpret_cast<uint32_t const&>(out);
        }
        cutlass::Array<float, 2> x = acc_pair(mm, r, jj);
        if constexpr (HasActivation_) {
          if constexpr (HasBias) {
            x = from_d2(to_d2(x));      // the bias add's rounding
          }
          x[0] = act(x[0]);
          x[1] = act(x[1]);
        }
        cutlass::Array<ElementD, 2> out = to_d2(x);
        if constexpr (Residual != 0) {
          x = from_d2(out);
          auto y = from_c2(reinterpret_cast<cutlass::Array<GmemElementC, 2> const&>(c_pair));
          x[0] = Residual == 1 ? x[0] + y[0] : x[0] * y[0];
          x[1] = Residual == 1 ? x[1] + y[1] : x[1] * y[1];
          if constexpr (HasPost_) {
            x = from_d2(to_d2(x));      // the residual op's rounding
            x[0] = post(x[0]);
            x[1] = post(x[1]);
          }
          out = to_d2(x);
        }
        return reinterpret_cast<uint32_t const&>(out);
      };

      CUTLASS_PRAGMA_UNROLL
      for (int mm = 0; mm < MmaM; ++mm) {
        int const step = chunk * MmaM + mm;
        int const buffer = step % Buffers;
        // Before staging: this thread's copies of C's box are in, and TMA has read the
        // box staged Buffers steps before (within this tile; across tiles the end of
        // the previous epilogue waited for all). One barrier makes both known.
        if constexpr (Residual != 0) {
          cutlass::arch::cp_async_wait<0>();
        }
        if (step >= Buffers && storer) {
          cute::tma_store_wait<Buffers - 1>();
        }
        if (Residual != 0 || step >= Buffers) {
          sync_group();
        }
        if (step + 1 < Steps) {
          load_c(step + 1);     // its buffer was last read before the previous step's barrier
        }
        CUTLASS_PRAGMA_UNROLL
        for (int jj = 0; jj < ChunkGroups; jj += 2) {
          // lane l's row of matrix l / 8: groups jj and jj + 1 (16 columns, 32 bytes)
          uint32_t off = tma_swizzle<RowBytes>(row_off[mm] + uint32_t((jj * 8 + (lane / 16) * 8) * 2));
          uint32_t c0 = 0, c1 = 0, c2 = 0, c3 = 0;
          if constexpr (Residual != 0) {
            ldsm_x4(c_box(step % 2) + off, c0, c1, c2, c3);
          }
          stsm_x4(d_box(buffer) + off, pair(mm, 0, jj, c0), pair(mm, 1, jj, c1), pair(mm, 0, jj + 1, c2),
                  pair(mm, 1, jj + 1, c3));
        }
        // the group's writes visible to TMA (the async proxy), then one thread stores
        cute::tma_store_fence();
        sync_group();
        if (storer) {
          cute::SM90_TMA_STORE_3D::copy(&params->tma_d, smem_buf + offsetof(SharedStorage, d) + d_off(buffer),
                                        n0 / AccPerGroup + chunk * EpiN, m0 + block[mm] * BoxRows,
                                        int(l_coord));
          cute::tma_store_arrive();
        }
      }
    }
    // every box read by TMA before this group (or, ping-pong, the other) stages again
    if (storer) {
      cute::tma_store_wait<0>();
    }
    sync_group();
  }

 private:
  Params const* params;
};

}  // namespace co_staged

#endif  // CO_STAGED_TMA_EPILOGUE_H
