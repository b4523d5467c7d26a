// Tile schedulers for the Hopper FMHA (examples/88_hopper_fmha) that hand out the
// causal problem's heaviest query tiles first: longest-processing-time-first order,
// as FlashAttention-3's causal schedulers do.
//
// Under a top-left causal mask, query tile m reads m + 1 key tiles (BlockQ = BlockKV:
// fmha_fusion.hpp CausalFusion::get_trip_count), so a problem's tiles differ in work
// up to seq / BlockQ times. The example's schedulers take m fastest: the persistent
// one strides its tile index by the grid (one CTA per SM), so with 132 SMs and 4
// query tiles every CTA gets the same m on every turn and the CTAs holding the last
// tiles do 4x the others' work (LLaMA's 512-token prefill: 16 key tiles on the
// busiest SM for 9.7 on average). Here the tile index runs over (batch, head)
// fastest and over the query tiles from the last one down, so the heavy tiles are
// spread over every SM first and the light ones fill in behind them.
//
// Both keep the example's interface (fmha_tile_scheduler.hpp): Params,
// to_underlying_arguments(problem (B, H, Q, K, D), hw_info, cluster, tile),
// get_grid_shape, is_valid, get_block_coord -> (m, _0, (b, h)), operator++.
//
// Inlined by emit_unit before the TU's includes.
#ifndef CO_FMHA_LPT_SCHEDULER_H
#define CO_FMHA_LPT_SCHEDULER_H
#include <algorithm>
#include <cute/tensor.hpp>
#include <cutlass/fast_math.h>
#include <cutlass/kernel_hardware_info.h>

namespace co_fmha {

// One CTA per SM, looping over the tiles (the example's ping-pong kernel).
struct LptPersistentTileScheduler {
  struct Params {
    int num_blocks;
    int num_m_blocks;
    cutlass::FastDivmod divmod_bh;   // tile index -> (rank from the last query tile, b * H + h)
    cutlass::FastDivmod divmod_h;    // b * H + h -> (b, h)
    cutlass::KernelHardwareInfo hw_info;
  };

  int block_idx = 0;
  Params params;

  CUTLASS_DEVICE
  LptPersistentTileScheduler(Params const& p) : block_idx(blockIdx.x), params(p) {}

  template <class ProblemSize, class ClusterShape, class TileShape>
  static Params to_underlying_arguments(ProblemSize const& problem_size,
                                        cutlass::KernelHardwareInfo hw_info,
                                        ClusterShape const& cluster_shape,
                                        TileShape const& tile_shape) {
    using namespace cute;
    if (hw_info.sm_count <= 0) {
      hw_info.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw_info.device_id);
    }
    const int num_m = cutlass::round_up(ceil_div(int(size<2>(problem_size)), int(size<0>(tile_shape))),
                                        int(size<0>(cluster_shape)));
    const int bh = int(size<0>(problem_size)) * int(size<1>(problem_size));
    return Params{num_m * bh, num_m, cutlass::FastDivmod(bh), cutlass::FastDivmod(int(size<1>(problem_size))),
                  hw_info};
  }

  static dim3 get_grid_shape(Params const& params) {
    return dim3(std::min(params.num_blocks, params.hw_info.sm_count), 1, 1);
  }

  CUTLASS_DEVICE
  bool is_valid() { return block_idx < params.num_blocks; }

  CUTLASS_DEVICE
  auto get_block_coord() {
    using namespace cute;
    int rank, bh, b, h;
    params.divmod_bh(rank, bh, block_idx);
    params.divmod_h(b, h, bh);
    return make_coord(params.num_m_blocks - 1 - rank, _0{}, make_coord(b, h));
  }

  CUTLASS_DEVICE
  LptPersistentTileScheduler& operator++() {
    block_idx += gridDim.x;
    return *this;
  }
};

// One CTA per tile (the example's cooperative kernel): grid ((b, h), query tiles), so
// the hardware, which starts CTAs in the order of their linear index, starts every
// (b, h)'s last query tile first. Grid y holds the query tiles (at most 65535).
struct LptIndividualTileScheduler {
  struct Params {
    dim3 grid;
    cutlass::FastDivmod divmod_h;
  };

  bool valid_ = true;
  Params params;

  CUTLASS_DEVICE
  LptIndividualTileScheduler(Params const& p) : params(p) {}

  template <class ProblemSize, class ClusterShape, class TileShape>
  static Params to_underlying_arguments(ProblemSize const& problem_size,
                                        cutlass::KernelHardwareInfo,
                                        ClusterShape const& cluster_shape,
                                        TileShape const& tile_shape) {
    using namespace cute;
    const int num_m = cutlass::round_up(ceil_div(int(size<2>(problem_size)), int(size<0>(tile_shape))),
                                        int(size<0>(cluster_shape)));
    const int bh = int(size<0>(problem_size)) * int(size<1>(problem_size));
    return Params{dim3(bh, num_m, 1), cutlass::FastDivmod(int(size<1>(problem_size)))};
  }

  static dim3 get_grid_shape(Params const& params) { return params.grid; }

  CUTLASS_DEVICE
  bool is_valid() { return valid_; }

  CUTLASS_DEVICE
  auto get_block_coord() {
    using namespace cute;
    int b, h;
    params.divmod_h(b, h, int(blockIdx.x));
    return make_coord(int(gridDim.y) - 1 - int(blockIdx.y), _0{}, make_coord(b, h));
  }

  CUTLASS_DEVICE
  LptIndividualTileScheduler& operator++() {
    valid_ = false;
    return *this;
  }
};

}  // namespace co_fmha
#endif  // CO_FMHA_LPT_SCHEDULER_H
