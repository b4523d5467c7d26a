"""A Hopper (sm_90a) GEMM with our fused epilogue, written in CuTe DSL (issue 21).

    D = post(residual_op(activation(acc + bias), C))        (evt_sm90.py's semantics)

A second kernel source beside the C++ emitters: the DSL compiles one of these in
1-3 s on a CPU-only machine, against 34-47 s of nvcc for the C++ unit of the same
tile (benchmarks/dsl_compile_time.py), and exports it ahead of time as an object
file and a C header (``export_to_c``) that link into a shared library
(build/dsl.py). Correct on the H200 (tests/gpu/test_dsl_gemm.py) at 0.87x our C++
kernels' speed over the GEMM corpus, 0.94x on the problems of 20 us or more
(benchmarks/dsl_gemm.py, docs/measured.md "Measured in session 13"): not on the default path.

The kernel (our composition of the DSL's Hopper building blocks, in the manner of
NVIDIA's persistent dense GEMM example): a persistent, warp-specialized kernel on
CUTLASS's static tile scheduler. One producer warp group (its first warp issues
the TMA loads of A and B through a PipelineTmaAsync of ``ab_stage`` stages, with
multicast across the cluster) and one or two consumer warp groups (two for tiles
of 128 x 256, splitting the rows as CUTLASS's cooperative schedule does) run the
wgmma mainloop and the epilogue: the accumulators in subtiles of ``epi_tile``,
the fused ops in fp32 rounding to D's dtype where PyTorch's separate ops would
(after the bias add, the activation, the residual op: evt_sm90.py), registers ->
shared memory (stmatrix) -> global memory (TMA store). The residual C comes in by
TMA on the producer group's second warp, ``c_stage`` subtiles ahead; the bias is
staged in shared memory once per tile. ``gated``: B's rows interleave two weights
(gate_0, up_0, gate_1, ...) and D = act(x W_gate^T) * (x W_up^T) is half as wide as
the accumulators, each pair of adjacent columns (one thread's registers) giving one
element (a gated MLP's up projection in one GEMM).

Operands: A (M, K, L) K-contiguous; B (N, K, L) K-contiguous (an nn.Linear weight);
D and C (M, N, L) N-contiguous; bias (N,); fp16 or bf16, fp32 accumulation. M, N, K
and L are run-time sizes (one kernel for every shape); the contiguous extents must
be multiples of 8 (16-byte TMA rows).

Imports the DSL (``nvidia-cutlass-dsl``, the ``[dsl]`` extra) when called, never at
package import. The tile scheduler is the wheel's ``StaticPersistentTileScheduler``,
which nvidia-cutlass-dsl 4.8 marks as moving to CUTLASS's examples (BSD-3): a
scheduler of our own replaces it before a release that drops it.
"""
# no ``from __future__ import annotations``: the DSL reads the kernels' annotations
# as objects, and cute exists only inside _kernel_class
import math
from dataclasses import dataclass

from ..ir.common import RESIDUAL_OPS
from .activations import FUNCTOR

ACTIVATIONS = tuple(FUNCTOR)        # the C++ emitters' (activations.py)
RESIDUALS = RESIDUAL_OPS
# M: one or two wgmma m64 rows per consumer warp group; N: what wgmma takes, in
# steps of 32 (not re-measured since the C++ kernels' odd multiples of 16 got their own
# wgmma shapes: emit/sm90_parts.wgmma_selector)
TILES = tuple((m, n) for m in (64, 128) for n in range(64, 257, 32))
CLUSTERS = ((1, 1), (2, 1), (1, 2), (2, 2))
DTYPES = ("f16", "bf16")


def check(tile_mn, cluster_mn, dtype: str, activation: str, residual: str) -> None:
    """Raise ValueError for a configuration this kernel does not build."""
    if tuple(tile_mn) not in TILES:
        raise ValueError(f"tile {tuple(tile_mn)} is not one of {TILES}")
    if tuple(cluster_mn) not in CLUSTERS:
        raise ValueError(f"cluster {tuple(cluster_mn)} is not one of {CLUSTERS}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {DTYPES}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {ACTIVATIONS}")
    if residual not in RESIDUALS:
        raise ValueError(f"residual {residual!r} is not one of {RESIDUALS}")


@dataclass(frozen=True)
class DslGemmConfig:
    """One DSL kernel: tile (M, N) and cluster (M, N) in CTAs' elements / CTAs,
    dtype ("f16" / "bf16", fp32 accumulation) and the epilogue (evt_sm90.py's
    semantics). Raises ValueError for a configuration ``check`` refuses."""

    tile: tuple
    cluster: tuple = (1, 1)
    dtype: str = "f16"
    activation: str = "identity"
    bias: bool = False
    residual: str = "none"
    post_relu: bool = False
    gated: bool = False

    def __post_init__(self):
        object.__setattr__(self, "tile", tuple(self.tile))
        object.__setattr__(self, "cluster", tuple(self.cluster))
        check(self.tile, self.cluster, self.dtype, self.activation, self.residual)
        if self.gated and (self.bias or self.residual != "none" or self.post_relu
                           or self.activation == "identity"):
            raise ValueError("a gated GEMM (D = act(x W_gate^T) * (x W_up^T)) takes an "
                             "activation and no bias, residual or post relu")

    @property
    def name(self) -> str:
        """A C identifier naming the configuration (the exported prefix)."""
        epi = [self.activation] if self.activation != "identity" else []
        epi = (["bias"] if self.bias else []) + epi
        epi += [f"res{self.residual}"] if self.residual != "none" else []
        epi += ["relu"] if self.post_relu else []
        epi = ["gated"] + epi if self.gated else epi
        return "dsl_gemm_{}x{}_{}x{}_{}_{}".format(*self.tile, *self.cluster, self.dtype,
                                                  "_".join(epi) or "plain")


def unsupported(problem) -> str | None:
    """Why the DSL kernel cannot run ``problem`` (an ir.GemmProblem), or None: A
    (M, K) K-contiguous, B an (N, K) K-contiguous weight, every operand 16-byte
    aligned, fp16 / bf16, a full-shape residual, post activation relu or none."""
    e = problem.epilogue
    if problem.dtype not in DTYPES or problem.tf32:
        return f"dtype {problem.dtype}"
    if problem.layout_a != "row" or problem.layout_b != "col":
        return f"layouts A {problem.layout_a}, B {problem.layout_b} (needs row, col)"
    if (problem.align_a, problem.align_b, problem.align_c) != (8, 8, 8):
        return "operands not 16-byte aligned"
    if problem.a_batch_broadcast:
        return "A broadcast over the batch"
    if e.residual_broadcast:
        return "residual broadcast over rows"
    if e.activation not in ACTIVATIONS or e.post_activation not in ("identity", "relu"):
        return f"epilogue {e.tag}"
    return None


def config_for(problem, tile, cluster=(1, 1)) -> DslGemmConfig:
    """The DslGemmConfig running ``problem``'s dtype and epilogue at ``tile`` /
    ``cluster``. Raises ValueError where ``unsupported`` gives a reason."""
    why = unsupported(problem)
    if why:
        raise ValueError(f"the DSL GEMM does not run this problem: {why}")
    e = problem.epilogue
    return DslGemmConfig(tile, cluster, problem.dtype, e.activation, e.bias, e.residual,
                         e.post_activation == "relu")


def _kernel_class():
    """The kernel class, defined on first use (it needs the DSL)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    import cutlass.memory
    import cutlass.pipeline as pipeline
    import cutlass.utils as utils
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass.pipeline import pipeline_init_arrive, pipeline_init_wait

    def activate(x, name):
        """``name`` on an fp32 TensorSSA (PyTorch's formulas, as activations.py)."""
        zero, one, half = (cute.full_like(x, v) for v in (0.0, 1.0, 0.5))
        if name == "relu":
            return cute.where(x > zero, x, zero)
        if name == "gelu_erf":
            return half * x * (one + cute.math.erf(x * cute.full_like(x, 0.7071067811865476)))
        if name == "gelu_tanh":
            k0, k1 = cute.full_like(x, 0.7978845608028654), cute.full_like(x, 0.044715)
            return half * x * (one + cute.math.tanh(k0 * (x + k1 * x * x * x)))
        if name == "silu":
            return x / (one + cute.math.exp(-x))
        if name == "sigmoid":
            return one / (one + cute.math.exp(-x))
        if name == "quick_gelu":
            return x / (one + cute.math.exp(cute.full_like(x, -1.702) * x))
        if name in ("hardswish", "hardsigmoid"):
            r6 = x + cute.full_like(x, 3.0)
            r6 = cute.where(r6 > zero, r6, zero)
            six = cute.full_like(x, 6.0)
            r6 = cute.where(r6 < six, r6, six)
            return x * r6 / six if name == "hardswish" else r6 / six
        return x

    class GemmSm90:
        """One compiled configuration: tile (M, N), cluster (M, N), epilogue."""

        def __init__(self, tile_mn, cluster_mn, activation="identity", bias=False,
                     residual="none", post_relu=False, gated=False):
            self.tile_mn, self.cluster_mn = tuple(tile_mn), tuple(cluster_mn)
            self.gated = bool(gated)
            self.activation, self.has_bias = activation, bool(bias)
            self.residual, self.post_relu = residual, bool(post_relu)
            self.has_c = residual != "none"
            # two consumer warp groups split 128 x 256 tiles (accumulator registers)
            self.atom_layout_mnk = (2, 1, 1) if tile_mn[0] > 64 and tile_mn[1] > 128 else (1, 1, 1)
            self.mma_warp_groups = math.prod(self.atom_layout_mnk)
            self.threads_per_wg = 128
            self.threads_per_cta = (1 + self.mma_warp_groups) * self.threads_per_wg
            self.load_warp_id = 0                     # A and B, by TMA
            self.c_load_warp_id = 1                   # the residual C, by TMA
            self.store_warp_id = 4                    # the first consumer warp
            self.num_mma_threads = self.mma_warp_groups * self.threads_per_wg
            self.epi_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_mma_threads)
            self.smem_capacity = cutlass.memory.get_smem_capacity_in_bytes("sm_90")
            self.buffer_align_bytes = 1024
            self.epi_stage = 4
            self.c_stage = 4 if self.has_c else 1

        def _setup(self):
            self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
                self.a_dtype, self.b_dtype, self.a_layout.sm90_mma_major_mode(),
                self.b_layout.sm90_mma_major_mode(), cutlass.Float32, self.atom_layout_mnk,
                tiler_mn=(64, self.tile_mn[1]))
            k_inst = cute.size(self.tiled_mma.shape_mnk, mode=[2])
            self.tile_mnk = (*self.tile_mn, k_inst * 4)          # 64-deep K tiles for 16-bit types
            self.cta_layout_mnk = cute.make_layout((*self.cluster_mn, 1))
            self.mcast_a, self.mcast_b = self.cluster_mn[1], self.cluster_mn[0]
            # the accumulators' epilogue subtile; D's is half as wide for a gated GEMM
            self.epi_tile = sm90_utils.compute_tile_shape_or_override(
                self.tile_mnk, self.d_dtype, is_cooperative=self.mma_warp_groups == 2)
            epi_m, epi_n = cute.size(self.epi_tile, mode=[0]), cute.size(self.epi_tile, mode=[1])
            self.epi_n = epi_n
            self.epi_tile_d = (epi_m, epi_n // 2) if self.gated else (epi_m, epi_n)
            self.tile_d = (self.tile_mn[0], self.tile_mn[1] // 2) if self.gated else self.tile_mn
            ab_bytes = (self.tile_mnk[0] + self.tile_mnk[1]) * self.tile_mnk[2] * self.a_dtype.width // 8
            epi_bytes = epi_m * self.epi_tile_d[1] * self.d_dtype.width // 8 * self.epi_stage
            c_bytes = epi_m * epi_n * self.d_dtype.width // 8 * self.c_stage if self.has_c else 0
            bias_bytes = self.tile_mn[1] * 4
            self.ab_stage = (self.smem_capacity - 2048 - epi_bytes - c_bytes - bias_bytes) // ab_bytes
            self.a_smem = sm90_utils.make_smem_layout_a(self.a_layout, self.tile_mnk, self.a_dtype,
                                                        self.ab_stage)
            self.b_smem = sm90_utils.make_smem_layout_b(self.b_layout, self.tile_mnk, self.b_dtype,
                                                        self.ab_stage)
            self.epi_smem = sm90_utils.make_smem_layout_epi(self.d_dtype, self.d_layout,
                                                            self.epi_tile_d, self.epi_stage)
            # C's subtiles as the accumulators' (a 1-stage stand-in when there is no C)
            self.c_smem = sm90_utils.make_smem_layout_epi(self.d_dtype, self.d_layout,
                                                          self.epi_tile, self.c_stage)

        @cute.jit
        def __call__(self, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, bias: cute.Tensor,
                     c: cute.Tensor, max_active_clusters: cutlass.Constexpr, stream: cuda.CUstream):
            self.a_dtype, self.b_dtype, self.d_dtype = a.element_type, b.element_type, d.element_type
            self.a_layout = cutlass.tensor_utils.LayoutEnum.from_tensor(a)
            self.b_layout = cutlass.tensor_utils.LayoutEnum.from_tensor(b)
            self.d_layout = cutlass.tensor_utils.LayoutEnum.from_tensor(d)
            self._setup()
            g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
            g2s_mc = cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp()
            tma_a, t_a = cute.nvgpu.cpasync.make_tiled_tma_atom(
                g2s_mc if self.mcast_a > 1 else g2s, a, cute.slice_(self.a_smem, (None, None, 0)),
                (self.tile_mnk[0], self.tile_mnk[2]), num_multicast=self.mcast_a)
            tma_b, t_b = cute.nvgpu.cpasync.make_tiled_tma_atom(
                g2s_mc if self.mcast_b > 1 else g2s, b, cute.slice_(self.b_smem, (None, None, 0)),
                (self.tile_mnk[1], self.tile_mnk[2]), num_multicast=self.mcast_b)
            tma_d, t_d = cute.nvgpu.cpasync.make_tiled_tma_atom(
                cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), d,
                cute.slice_(self.epi_smem, (None, None, 0)), self.epi_tile_d)
            # C's loads by TMA (the same atom type as D's stand-in without a C)
            tma_c, t_c = cute.nvgpu.cpasync.make_tiled_tma_atom(
                g2s, c if self.has_c else d, cute.slice_(self.c_smem, (None, None, 0)), self.epi_tile)
            # the accumulators' (M, N, L) space: D's, or for a gated GEMM B's 2N
            # interleaved columns, whose tiles are scheduled and stored two to one
            acc_space = t_d
            if cutlass.const_expr(self.gated):
                acc_space = cute.make_identity_tensor(
                    (cute.size(a, mode=[0]), cute.size(b, mode=[0]), cute.size(a, mode=[2])))
            tiles = cute.zipped_divide(acc_space, tiler=cute.slice_(self.tile_mnk, (None, None, 0)))
            sched = utils.PersistentTileSchedulerParams(
                tiles[(0, (None, None, None))].shape, (*self.cluster_mn, 1), 1, True)
            grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, max_active_clusters)

            @cute.struct
            class SharedStorage:
                barriers: cute.struct.MemRange[cutlass.Int64, self.ab_stage * 2]
                c_barriers: cute.struct.MemRange[cutlass.Int64, self.c_stage * 2]
                bias: cute.struct.MemRange[cutlass.Float32, self.tile_mn[1]]
                sA: cute.struct.Align[cute.struct.MemRange[self.a_dtype, cute.cosize(self.a_smem)],
                                      self.buffer_align_bytes]
                sB: cute.struct.Align[cute.struct.MemRange[self.b_dtype, cute.cosize(self.b_smem)],
                                      self.buffer_align_bytes]
                sD: cute.struct.Align[cute.struct.MemRange[self.d_dtype, cute.cosize(self.epi_smem)],
                                      self.buffer_align_bytes]
                sC: cute.struct.Align[cute.struct.MemRange[
                    self.d_dtype, cute.cosize(self.c_smem) if self.has_c else 8], self.buffer_align_bytes]

            self.shared_storage = SharedStorage
            self.kernel(tma_a, t_a, tma_b, t_b, tma_d, t_d, tma_c, t_c, acc_space, d, bias,
                        self.tiled_mma, self.cta_layout_mnk, self.a_smem, self.b_smem,
                        self.epi_smem, self.c_smem, sched).launch(
                grid=grid, block=[self.threads_per_cta, 1, 1], cluster=(*self.cluster_mn, 1),
                min_blocks_per_mp=1, stream=stream)

        @cute.kernel
        def kernel(self, tma_a: cute.CopyAtom, mA: cute.Tensor, tma_b: cute.CopyAtom,
                   mB: cute.Tensor, tma_d: cute.CopyAtom, mD_tma: cute.Tensor,
                   tma_c: cute.CopyAtom, mC_tma: cute.Tensor, acc_space: cute.Tensor,
                   mD: cute.Tensor, mBias: cute.Tensor, tiled_mma: cute.TiledMma,
                   cta_layout_mnk: cute.Layout, a_smem: cute.ComposedLayout,
                   b_smem: cute.ComposedLayout, epi_smem: cute.ComposedLayout,
                   c_smem: cute.ComposedLayout, sched_params: utils.PersistentTileSchedulerParams):
            tidx, _, _ = cute.arch.thread_idx()
            warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
            if warp_idx == 0:
                cute.nvgpu.cpasync.prefetch_descriptor(tma_a)
                cute.nvgpu.cpasync.prefetch_descriptor(tma_b)
                cute.nvgpu.cpasync.prefetch_descriptor(tma_d)
                if cutlass.const_expr(self.has_c):
                    cute.nvgpu.cpasync.prefetch_descriptor(tma_c)
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
            cluster_coord = cta_layout_mnk.get_flat_coord(rank)
            a_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=1)
            b_mask = cute.make_layout_image_mask(cta_layout_mnk, cluster_coord, mode=0)
            a_mask = a_mask if self.mcast_a > 1 else 0
            b_mask = b_mask if self.mcast_b > 1 else 0
            tx_bytes = (cute.size_in_bytes(self.a_dtype, cute.slice_(a_smem, (None, None, 0)))
                        + cute.size_in_bytes(self.b_dtype, cute.slice_(b_smem, (None, None, 0))))

            storage = cutlass.memory.SmemAllocator().allocate(self.shared_storage)
            # every consumer warp of every CTA that reads a multicast stage releases it
            arrivals = (self.mcast_a + self.mcast_b - 1) * self.mma_warp_groups * 4
            ab_pipe = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.barriers.data_ptr(), num_stages=self.ab_stage,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, arrivals),
                tx_count=tx_bytes, cta_layout_vmnk=cute.make_layout((1, *cta_layout_mnk.shape)),
                defer_sync=True)
            # C's subtiles: this CTA's own loads, released by its consumer warps
            c_pipe = pipeline.PipelineTmaAsync.create(
                barrier_storage=storage.c_barriers.data_ptr(), num_stages=self.c_stage,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
                consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.mma_warp_groups * 4),
                tx_count=cute.size_in_bytes(self.d_dtype, cute.slice_(c_smem, (None, None, 0))),
                cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)), defer_sync=True)
            pipeline_init_arrive(cluster_shape_mn=self.cluster_mn, is_relaxed=True)

            sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)
            sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)
            sD = storage.sD.get_tensor(epi_smem.outer, swizzle=epi_smem.inner)
            sC = storage.sC.get_tensor(c_smem.outer, swizzle=c_smem.inner)
            sBias = storage.bias.get_tensor(cute.make_layout(self.tile_mn[1]))
            gA = cute.local_tile(mA, cute.slice_(self.tile_mnk, (None, 0, None)), (None, None, None))
            gB = cute.local_tile(mB, cute.slice_(self.tile_mnk, (0, None, None)), (None, None, None))
            gAcc = cute.local_tile(acc_space, cute.slice_(self.tile_mnk, (None, None, 0)), (None, None, None))
            gD = cute.local_tile(mD_tma, self.tile_d, (None, None, None))
            gC = cute.local_tile(mC_tma, self.tile_mn, (None, None, None))
            tAsA, tAgA = cute.nvgpu.cpasync.tma_partition(
                tma_a, cluster_coord[1], cute.make_layout(cute.slice_(cta_layout_mnk, (0, None, 0)).shape),
                cute.group_modes(sA, 0, 2), cute.group_modes(gA, 0, 2))
            tBsB, tBgB = cute.nvgpu.cpasync.tma_partition(
                tma_b, cluster_coord[0], cute.make_layout(cute.slice_(cta_layout_mnk, (None, 0, 0)).shape),
                cute.group_modes(sB, 0, 2), cute.group_modes(gB, 0, 2))

            wg = cute.arch.make_warp_uniform(tidx // self.threads_per_wg)
            thr_mma = tiled_mma.get_slice(
                cute.make_layout(self.mma_warp_groups, stride=self.threads_per_wg)(wg - 1))
            tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
            tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
            acc = cute.make_rmem_tensor(thr_mma.partition_C(gAcc).shape[:3], cutlass.Float32)
            k_tiles = cute.size(gA, mode=[3])
            pipeline_init_wait(cluster_shape_mn=self.cluster_mn)

            if wg == 0:                                          # producer warp group
                cute.arch.setmaxregister_decrease(40)
                if warp_idx == self.load_warp_id:
                    sched = utils.StaticPersistentTileScheduler.create(
                        sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
                    work = sched.initial_work_tile_info()
                    state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                         self.ab_stage)
                    while work.is_valid_tile:
                        mnl = work.tile_idx
                        a_k = tAgA[(None, mnl[0], None, mnl[2])]
                        b_k = tBgB[(None, mnl[1], None, mnl[2])]
                        state.reset_count()
                        for _ in range(k_tiles):
                            ab_pipe.producer_acquire(state)
                            bar = ab_pipe.producer_get_barrier(state)
                            cute.copy(tma_a, a_k[(None, state.count)], tAsA[(None, state.index)],
                                      tma_bar_ptr=bar, mcast_mask=a_mask)
                            cute.copy(tma_b, b_k[(None, state.count)], tBsB[(None, state.index)],
                                      tma_bar_ptr=bar, mcast_mask=b_mask)
                            ab_pipe.producer_commit(state)
                            state.advance()
                        sched.advance_to_next_work()
                        work = sched.get_current_work()
                    ab_pipe.producer_tail(state)
                if cutlass.const_expr(self.has_c):
                    if warp_idx == self.c_load_warp_id:
                        # C's subtiles, in the consumers' order, c_stage ahead of them
                        sched = utils.StaticPersistentTileScheduler.create(
                            sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
                        work = sched.initial_work_tile_info()
                        c_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                               self.c_stage)
                        while work.is_valid_tile:
                            mnl = work.tile_idx
                            tiles_c = cute.zipped_divide(gC[(None, None, *mnl)], self.epi_tile)
                            bGS_sC, bGS_gC = cute.nvgpu.cpasync.tma_partition(
                                tma_c, 0, cute.make_layout(1), cute.group_modes(sC, 0, 2), tiles_c)
                            epi_shape = tiles_c.shape[1]
                            epi_layout = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
                            for e in cutlass.range_constexpr(cute.size(tiles_c, mode=[1])):
                                em, en = epi_layout.get_hier_coord(e)
                                c_pipe.producer_acquire(c_state)
                                cute.copy(tma_c, bGS_gC[(None, (em, en))], bGS_sC[(None, c_state.index)],
                                          tma_bar_ptr=c_pipe.producer_get_barrier(c_state))
                                c_pipe.producer_commit(c_state)
                                c_state.advance()
                            sched.advance_to_next_work()
                            work = sched.get_current_work()
                        c_pipe.producer_tail(c_state)
            if wg > 0:                                           # consumer warp groups
                cute.arch.setmaxregister_increase(232)
                self._consume(tidx, warp_idx, ab_pipe, c_pipe, sched_params, tiled_mma, tCrA, tCrB,
                              acc, k_tiles, sD, sC, sBias, gAcc, gD, tma_d, mD, mBias)

        @cute.jit
        def _consume(self, tidx, warp_idx, ab_pipe, c_pipe, sched_params, tiled_mma, tCrA, tCrB,
                     acc, k_tiles, sD, sC, sBias, gAcc, gD, tma_d, mD, mBias):
            sched = utils.StaticPersistentTileScheduler.create(
                sched_params, cute.arch.block_idx(), cute.arch.grid_dim())
            work = sched.initial_work_tile_info()
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
            release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.ab_stage)
            c_read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.c_stage)
            k_blocks = cute.size(tCrA, mode=[2])
            epi_t = tidx - self.threads_per_wg                   # 0 .. consumer threads - 1

            # registers -> shared memory (stmatrix), laid out as the wgmma accumulators
            r2s = cute.make_tiled_copy_S(
                sm90_utils.get_smem_store_op(self.d_layout, elem_ty_d=self.d_dtype,
                                             elem_ty_acc=cutlass.Float32),
                cute.make_tiled_copy_C_atom(
                    cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(
                        self.d_layout.is_m_major_c(), 4), self.d_dtype), tiled_mma))
            thr_r2s = r2s.get_slice(epi_t)
            tRS_acc = r2s.retile(acc)
            # each register's (row, column) inside an accumulator subtile: the copy's
            # source side (what this thread holds), not its destination side (the
            # rows whose addresses it gives stmatrix, which holds other threads' values)
            tRS_crd = thr_r2s.partition_S(cute.make_identity_tensor(self.epi_tile))
            rd_layout = cute.make_layout(cute.shape(tRS_crd))
            rD = cute.make_rmem_tensor(rd_layout.shape, cutlass.Float32)
            rD_out = cute.make_rmem_tensor(rd_layout.shape, self.d_dtype)
            n_rd = cute.size(rD)
            store_pipe = pipeline.PipelineTmaStore.create(
                num_stages=self.epi_stage,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads))
            n_size = cute.size(mD, mode=[1])
            n_stage_d = cute.size(sD, mode=[2])

            while work.is_valid_tile:
                mnl = work.tile_idx
                read.reset_count()
                release.reset_count()
                acc.fill(0.0)
                tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                cute.nvgpu.warpgroup.fence()
                for k in range(k_tiles):
                    ab_pipe.consumer_wait(read)
                    for kb in cutlass.range_constexpr(k_blocks):
                        cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)],
                                  tCrB[(None, None, kb, read.index)], acc)
                    cute.nvgpu.warpgroup.commit_group()
                    if k > 0:        # the previous k tile's wgmmas are done: its stage is free
                        cute.nvgpu.warpgroup.wait_group(1)
                        ab_pipe.consumer_release(release)
                        release.advance()
                    read.advance()
                cute.nvgpu.warpgroup.wait_group(0)
                if k_tiles > 0:
                    ab_pipe.consumer_release(release)
                    release.advance()

                if cutlass.const_expr(self.has_bias):
                    # this tile's bias columns into shared memory, coalesced, once (the
                    # last subtile's barrier of the previous tile ended its reads)
                    for j in cutlass.range_constexpr((self.tile_mn[1] + self.num_mma_threads - 1)
                                                     // self.num_mma_threads):
                        i = epi_t + j * self.num_mma_threads
                        if i < self.tile_mn[1]:
                            col = mnl[1] * self.tile_mn[1] + i
                            bv = cutlass.Float32(0.0)
                            if col < n_size:
                                bv = mBias[col].to(cutlass.Float32)
                            sBias[i] = bv
                    self.epi_barrier.arrive_and_wait()

                tiles_d = cute.zipped_divide(gD[(None, None, *mnl)], self.epi_tile_d)
                bSG_sD, bSG_gD = cute.nvgpu.cpasync.tma_partition(
                    tma_d, 0, cute.make_layout(1), cute.group_modes(sD, 0, 2), tiles_d)
                tRS_sD = thr_r2s.partition_D(sD)
                n_epi = cute.size(tiles_d, mode=[1])
                epi_shape = tiles_d.shape[1]
                epi_layout = cute.make_layout(epi_shape, stride=(epi_shape[1], 1))
                done_before = sched.num_tiles_executed * n_epi
                for e in cutlass.range_constexpr(n_epi):
                    em, en = epi_layout.get_hier_coord(e)
                    buf = (done_before + e) % n_stage_d
                    for v in cutlass.range_constexpr(n_rd):
                        rD[v] = tRS_acc[e * n_rd + v]
                    x = rD.load()
                    if cutlass.const_expr(self.gated):
                        # registers v, v + 1 hold columns c, c + 1 (c even: the wgmma
                        # accumulator layout), B's rows gate_j, up_j: D[:, j] =
                        # act(gate) * up, rounded where PyTorch's ops would round
                        x = x.to(self.d_dtype).to(cutlass.Float32)
                        rD.store(x)
                        rG = cute.make_rmem_tensor(rd_layout.shape, cutlass.Float32)
                        rG.store(activate(x, self.activation).to(self.d_dtype).to(cutlass.Float32))
                        for v in cutlass.range_constexpr(0, n_rd, 2):
                            r, col = tRS_crd[v]
                            sD[(r, col // 2, buf)] = (rG[v] * rD[v + 1]).to(self.d_dtype)
                    else:
                        if cutlass.const_expr(self.has_bias):
                            rB = cute.make_rmem_tensor(rd_layout.shape, cutlass.Float32)
                            for v in cutlass.range_constexpr(n_rd):
                                rB[v] = sBias[en * self.epi_n + tRS_crd[v][1]]
                            x = (x + rB.load()).to(self.d_dtype).to(cutlass.Float32)
                        if cutlass.const_expr(self.activation != "identity"):
                            x = activate(x, self.activation).to(self.d_dtype).to(cutlass.Float32)
                        if cutlass.const_expr(self.has_c):
                            # C's subtile, loaded by TMA (zeros outside the tensor)
                            rC = cute.make_rmem_tensor(rd_layout.shape, cutlass.Float32)
                            c_pipe.consumer_wait(c_read)
                            for v in cutlass.range_constexpr(n_rd):
                                r, col = tRS_crd[v]
                                rC[v] = sC[(r, col, c_read.index)].to(cutlass.Float32)
                            c_pipe.consumer_release(c_read)
                            c_read.advance()
                            if cutlass.const_expr(self.residual == "add"):
                                x = (x + rC.load()).to(self.d_dtype).to(cutlass.Float32)
                            if cutlass.const_expr(self.residual == "mul"):
                                x = (x * rC.load()).to(self.d_dtype).to(cutlass.Float32)
                        if cutlass.const_expr(self.post_relu):
                            x = activate(x, "relu")
                        rD_out.store(x.to(self.d_dtype))
                        cute.copy(r2s, rD_out, tRS_sD[(None, None, None, buf)])
                    cute.arch.fence_proxy("async.shared", space="cta")
                    self.epi_barrier.arrive_and_wait()
                    if warp_idx == self.store_warp_id:
                        cute.copy(tma_d, bSG_sD[(None, buf)], bSG_gD[(None, (em, en))])
                        store_pipe.producer_commit()
                        store_pipe.producer_acquire()
                    self.epi_barrier.arrive_and_wait()
                sched.advance_to_next_work()
                work = sched.get_current_work()
            store_pipe.producer_tail()

    return GemmSm90


DTYPE_NAMES = {"f16": "Float16", "bf16": "BFloat16"}


def compile_sm90(tile_mn, cluster_mn, dtype="f16", activation="identity", bias=False,
                 residual="none", post_relu=False, num_sms=132, gated=False):
    """``compile_config`` of the DslGemmConfig of these fields (which validates them)."""
    return compile_config(DslGemmConfig(tile_mn, cluster_mn, dtype, activation, bias, residual,
                                        post_relu, gated), num_sms)


def compile_config(config: DslGemmConfig, num_sms=132):
    """Compile one configuration for sm_90a on fake tensors (no GPU needed): A, B, D,
    bias and C of run-time sizes, the contiguous extents divisible by 8. Returns the
    DSL's compiled function (``export_to_c`` writes its object file and header).
    Raises ImportError without the DSL, and what the DSL raises for code it cannot
    compile (DslGemmConfig raised ValueError for a configuration it refuses)."""
    c = config
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor

    element = getattr(cutlass, DTYPE_NAMES[c.dtype])

    def matrix():        # (rows, cols, batch), cols contiguous
        return make_fake_compact_tensor(element, (cute.SymInt(), cute.SymInt(divisibility=8),
                                                  cute.SymInt()), stride_order=(1, 0, 2))
    vector = make_fake_compact_tensor(element, (cute.SymInt(divisibility=8),), stride_order=(0,))
    gemm = _kernel_class()(c.tile, c.cluster, c.activation, c.bias, c.residual, c.post_relu,
                           c.gated)
    clusters = num_sms // (c.cluster[0] * c.cluster[1])
    # the target: CUTE_DSL_ARCH is read when the DSL is first imported and otherwise
    # defaults to the visible GPU's (sm_100a without one); a compile option alone
    # leaves export_to_c unable to write the object file, so set the DSL's own
    _set_arch("sm_90a")
    return cute.compile(gemm, matrix(), matrix(), matrix(), vector, matrix(), clusters,
                        cuda.CUstream(0))


def _set_arch(arch: str) -> None:
    """Make ``arch`` the target of the DSL's compiles in this process."""
    from cutlass.cutlass_dsl import CuTeDSL
    CuTeDSL._get_dsl().envar.arch = arch


def export(compiled, out_dir, prefix: str) -> tuple:
    """Write ``compiled``'s object file and C header into ``out_dir`` (the DSL's
    ``export_to_c``). Returns (object path, header path)."""
    from pathlib import Path
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    compiled.export_to_c(file_path=str(out), file_name=prefix, function_prefix=prefix)
    return out / f"{prefix}.o", out / f"{prefix}.h"
