// A per-sample row broadcast: an EVT leaf for the CUTLASS 3.x sm90 epilogue
// (emit/evt_sm90.py ``per_sample_broadcast``) that gives output element (m, n) the
// value vec[m / rows_per_sample][n] of a (samples, N) row-major vector.
//
// What it is for: a conv's add of an (N, K, 1, 1) tensor (the SD UNet's time
// embedding, added to each ResnetBlock2D's first conv) or a squeeze-excite
// multiply. The implicit GEMM's M is the linearized N * P * Q (CUTLASS's
// get_linearized_problem_shape_MNKL, cutlass/conv/detail.hpp), so no stride of
// CUTLASS's own broadcast nodes (Sm90RowBroadcast / Sm90ColBroadcast, strides
// over (M, N, L)) can index the sample: it is m / (P * Q), taken here with
// cutlass::FastDivmod.
//
// How, after Sm90RowBroadcast (epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp):
// before the subtile loop (begin) the epilogue's threads stage the vector rows of
// the first two samples the CTA tile's rows touch, its N columns of each, in
// shared memory (2 x tile N values), then sync (begin_sync_needed); each subtile
// (begin_loop) reads its values from there into registers. A tile whose rows span
// more samples (P * Q below the tile's M / 2: images of 8 x 8 and smaller) reads
// the rest from global memory, element by element. So a tile costs one round of
// global loads, not one per subtile.
//
// Coordinates: as CUTLASS's Sm90AuxLoad without shared memory (Stages == 0) has
// them, the identity tensor over (M, N, L) partitioned like the epilogue's
// registers (sm90_partition_for_epilogue), so element i of a subtile's fragment
// has the global (m, n, l) of the accumulator visit() gets as element i.
// Out-of-bounds elements (the tile's residue) read nothing and get 0.
//
// A preamble block of the unit (before its includes), once per unit (the guard):
// it includes what it uses.
#ifndef CO_PER_SAMPLE_BROADCAST_H
#define CO_PER_SAMPLE_BROADCAST_H

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/fast_math.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

namespace co_evt {

template <class CtaTileShapeMNK, class ElementInput, class ElementCompute>
struct Sm90PerSampleRowBroadcast {
  static constexpr int TileN = cute::size<1>(CtaTileShapeMNK{});
  static constexpr int StagedSamples = 2;

  struct SharedStorage {
    cute::array_aligned<ElementCompute, StagedSamples * TileN> smem;
  };

  struct Arguments {
    ElementInput const* ptr = nullptr;   // (samples, N) with row stride ld, elements
    int64_t rows_per_sample = 1;         // P * Q of a conv: output rows per sample
    int64_t ld = 0;                      // row stride of the vector (N for a packed one)
  };

  struct Params {
    ElementInput const* ptr = nullptr;
    cutlass::FastDivmod rows_per_sample{};
    int ld = 0;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return {args.ptr, cutlass::FastDivmod(int(args.rows_per_sample)), int(args.ld)};
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    // every row index and (sample * ld + n) offset fits an int (M itself does: the
    // conv's run checks N * P * Q <= INT32_MAX)
    int64_t m = int64_t(cute::size(cute::get<0>(problem_shape)));
    int64_t n = int64_t(cute::size(cute::get<1>(problem_shape)));
    if (args.ptr == nullptr || args.rows_per_sample < 1 || args.rows_per_sample > INT32_MAX ||
        args.ld < n || m > INT32_MAX) {
      return false;
    }
    int64_t samples = (m + args.rows_per_sample - 1) / args.rows_per_sample;
    return samples * args.ld <= INT32_MAX;
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

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_zero() const { return false; }

  CUTLASS_HOST_DEVICE Sm90PerSampleRowBroadcast() {}
  CUTLASS_HOST_DEVICE Sm90PerSampleRowBroadcast(Params const& params_, SharedStorage const& shared_storage)
      : params(params_), smem(const_cast<ElementCompute*>(shared_storage.smem.data())) {}

  Params params;
  ElementCompute* smem = nullptr;

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::detail::EmptyProducerLoadCallbacks{};
  }

  template <class CTensor, class RTensor, class ProblemShapeMNL>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::detail::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(CTensor tCcVec_, RTensor tCrVec_, ProblemShapeMNL shape_mnl_,
                                          int m0_, int n0_, int thread_idx_, int threads_,
                                          ElementCompute* smem_, Params const* params_)
        : tCcVec(tCcVec_), tCrVec(tCrVec_), shape_mnl(shape_mnl_), m0(m0_), n0(n0_),
          thread_idx(thread_idx_), threads(threads_), smem(smem_), params(params_) {}

    CTensor tCcVec;             // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) global (m, n, l) coordinates
    RTensor tCrVec;             // (CPY,CPY_M,CPY_N) this thread's values of the current subtile
    ProblemShapeMNL shape_mnl;  // (M, N, L): the bounds
    int m0, n0;                 // the CTA tile's first row and column
    int thread_idx, threads;    // among the epilogue's threads
    ElementCompute* smem;       // [StagedSamples][TileN]
    Params const* params;
    int first_sample = 0;       // the sample of row m0: smem row 0

    CUTLASS_DEVICE ElementCompute global_value(int sample, int n) const {
      return ElementCompute(params->ptr[sample * params->ld + n]);
    }

    CUTLASS_DEVICE void begin() {
      using namespace cute;
      int M = int(get<0>(shape_mnl)), N = int(get<1>(shape_mnl));
      first_sample = params->rows_per_sample.div(m0 < M ? m0 : 0);
      int samples = params->rows_per_sample.div(M - 1) + 1;
      for (int i = thread_idx; i < StagedSamples * TileN; i += threads) {
        int j = i / TileN, col = i - j * TileN;
        int sample = first_sample + j, n = n0 + col;
        smem[i] = (sample < samples && n < N) ? global_value(sample, n) : ElementCompute(0);
      }
    }

    CUTLASS_DEVICE bool begin_sync_needed() const { return true; }   // the staged rows are shared

    CUTLASS_DEVICE void begin_loop(int epi_m, int epi_n) {
      using namespace cute;
      Tensor tCc_mn = tCcVec(_, _, _, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(tCrVec); ++i) {
        auto c = tCc_mn(i);
        ElementCompute value = ElementCompute(0);
        if (elem_less(c, shape_mnl)) {
          int m = int(get<0>(c)), n = int(get<1>(c));
          int j = params->rows_per_sample.div(m) - first_sample;
          value = j < StagedSamples ? smem[j * TileN + (n - n0)] : global_value(first_sample + j, n);
        }
        tCrVec(i) = value;
      }
    }

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementCompute, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int) {
      cutlass::Array<ElementCompute, FragmentSize> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        out[i] = tCrVec(epi_v * FragmentSize + i);
      }
      return out;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    // a linearized M (one int): a nested (Q, P, N) mode would give nested coordinates
    static_assert(cute::is_integral<decltype(M)>::value && cute::is_integral<decltype(N)>::value,
                  "the per-sample broadcast needs a linearized (M, N) problem shape");
    static_assert(size<1>(decltype(args.tile_shape_mnk){}) == TileN, "the CTA tile's N");
    auto shape_mnl = make_shape(M, N, L);
    Tensor tCcVec = cutlass::epilogue::fusion::detail::sm90_partition_for_epilogue<ReferenceSrc>(
        make_identity_tensor(shape_mnl), args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile,
        args.tiled_copy, args.thread_idx);
    Tensor tCrVec = make_tensor<ElementCompute>(take<0, 3>(shape(tCcVec)));
    int m0 = int(m) * int(size<0>(args.tile_shape_mnk));
    int n0 = int(n) * TileN;
    int threads = int(size(args.tiled_copy));
    return ConsumerStoreCallbacks<decltype(tCcVec), decltype(tCrVec), decltype(shape_mnl)>(
        tCcVec, tCrVec, shape_mnl, m0, n0, args.thread_idx, threads, smem, &params);
  }
};

}  // namespace co_evt

#endif  // CO_PER_SAMPLE_BROADCAST_H
