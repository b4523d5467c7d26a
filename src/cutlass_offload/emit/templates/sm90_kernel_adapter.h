// What cutlass::gemm::device::GemmUniversalAdapter does for the sm90a GEMM kernels of
// emit/gemm_sm90.py (CUTLASS 4.2, cutlass/gemm/device/gemm_universal_adapter.h: its
// static can_implement, get_workspace_size and run(Params&, ...)), without its header.
//
// Why: that header includes cutlass/gemm/kernel/gemm_universal.hpp, i.e. every GEMM
// kernel of every architecture (sm70 to sm120), and the 2.x device layer; with the
// builders' umbrella headers that is about a third of the header text cudafe++, cicc
// and the host compiler parse in every kernel unit (emit/gemm_sm90.py INCLUDES).
//
// The run is the adapter's for an sm90 kernel: a plain launch (PDL as an attribute)
// for a static 1x1x1 cluster, else CUTLASS's cluster launcher, then cudaGetLastError
// (gemm_universal_adapter.h's run, lines 374-562 in CUTLASS 4.2). The shared-memory
// opt-in is the launcher's (prelude.h co_opt_in_smem), as with the adapter's run.
// Spliced into a unit's code ahead of its GEMM kernels, once (guarded).
#ifndef CO_SM90_KERNEL_ADAPTER_H
#define CO_SM90_KERNEL_ADAPTER_H

namespace co_sm90 {

template <class Kernel>
struct KernelAdapter {
  using Arguments = typename Kernel::Arguments;
  using Params = typename Kernel::Params;

  static cutlass::Status can_implement(Arguments const& args) {
    return Kernel::can_implement(args) ? cutlass::Status::kSuccess : cutlass::Status::kInvalid;
  }

  // The adapter adds a split-K-parallel reduction's bytes to this; these kernels run
  // in kGemm mode.
  static size_t get_workspace_size(Arguments const& args) {
    return Kernel::get_workspace_size(args);
  }

  static cutlass::Status run(Params& params, cudaStream_t stream, void* /* no host adapter */, bool pdl) {
    static_assert(Kernel::ArchTag::kMinComputeCapability == 90, "sm90 kernels: the cluster launch");
    dim3 const block = Kernel::get_block_shape();
    dim3 const grid = Kernel::get_grid_shape(params);
    int const smem = Kernel::SharedStorageSize;
    using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
    cutlass::Status launched;
    if constexpr (cute::is_static_v<Cluster> && cute::size(Cluster{}) == 1) {
      launched = cutlass::kernel_launch<Kernel>(grid, block, smem, stream, params, pdl);
    } else {
      dim3 const cluster(cute::size<0>(Cluster{}), cute::size<1>(Cluster{}), cute::size<2>(Cluster{}));
      void* kernel_params[] = {&params};
      launched = cutlass::ClusterLauncher::launch(grid, cluster, block, smem, stream,
                                                  (void const*)cutlass::device_kernel<Kernel>,
                                                  kernel_params, pdl);
    }
    // as the adapter ends: reading the error also clears it, so a failed launch does
    // not surface later in an unrelated CUDA call (the launchers' failure paths return
    // before reading it)
    cudaError_t const error = cudaGetLastError();
    return error == cudaSuccess && launched == cutlass::Status::kSuccess ? cutlass::Status::kSuccess
                                                                          : cutlass::Status::kErrorInternal;
  }
};

}  // namespace co_sm90

#endif  // CO_SM90_KERNEL_ADAPTER_H
