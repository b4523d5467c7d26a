// How many thread-block clusters of a kernel the device holds at once, for CUTLASS 3.x's
// persistent tile schedulers (KernelHardwareInfo::max_active_clusters).
//
// Why: given no count, the schedulers size a clustered kernel's grid by assuming GPCs of
// 18 SMs (cutlass/gemm/kernel/tile_scheduler_params.h, get_max_cta_occupancy): on a
// 132-SM H100 / H200 that is 112 CTAs for clusters of 8 and 116 for clusters of 4, so
// e.g. sd-unet's 512x3840x1280 GEMM, 120 tiles of 128x128 in clusters of 8 (cuBLAS's
// choice), ran in two waves of persistent CTAs. CUTLASS's own query
// (KernelHardwareInfo::query_device_max_active_clusters) passes no dynamic shared
// memory, which overstates the count of a kernel that fills an SM's shared memory, so
// the scheduler ignores it; this one passes the kernel's bytes (CUDA runtime API,
// cudaOccupancyMaxActiveClusters).
//
// One query per device per kernel, kept in the kernel's own ``known`` array (value + 1;
// 0: not asked yet). 0 (CUTLASS's estimate) where the query fails.
#ifndef CO_CLUSTER_OCCUPANCY_H
#define CO_CLUSTER_OCCUPANCY_H

inline int co_max_active_clusters(const void* kernel, int smem_bytes, int threads, dim3 cluster,
                                  std::atomic<int>* known) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (device < kCoMaxDevices) {
    int const seen = known[device].load(std::memory_order_acquire);
    if (seen > 0) {
      return seen - 1;
    }
  }
  // the occupancy of the kernel as launched: its dynamic shared memory opted in first
  // (the launcher's co_opt_in_smem sets the same value again)
  if (smem_bytes > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = cluster.x;
  attribute.val.clusterDim.y = cluster.y;
  attribute.val.clusterDim.z = cluster.z;
  cudaLaunchConfig_t config = {};
  config.gridDim = cluster;               // the smallest grid of whole clusters
  config.blockDim = dim3(threads, 1, 1);
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess || clusters < 0) {
    (void)cudaGetLastError();
    clusters = 0;
  }
  if (device < kCoMaxDevices) {
    known[device].store(clusters + 1, std::memory_order_release);
  }
  return clusters;
}

#endif  // CO_CLUSTER_OCCUPANCY_H
