"""Plain data objects passed between pipeline stages.

The IR is plain frozen data: partition builds regions (each with its problem),
select picks a kernel per region, emit turns kernels into C++, build and runtime
load and run them. Nothing here does any work beyond validating itself.

The problem (what must be computed) is kept apart from the choice (how a kernel
computes it). One module per region kind:

* ``common``: the shared vocabulary: dtypes, activations, layouts, archs, kernel
  families, ``GemmEpilogue``, ``KernelConfig``, ``KernelSource``, ``replace``.
* ``gemm``: ``GemmProblem``, ``GemmLaunch``, ``GemmKernel``, ``GemmRegion``.
* ``conv``: ``ConvProblem``, ``ConvKernel``, ``ConvChoice``, ``DepthwiseKernel``, ``ConvRegion``.
* ``norm``: layer_norm / rms_norm and group_norm problems, kernels and regions.
* ``attention``: ``AttentionProblem``, ``AttentionKernel`` (sm80),
  ``AttentionKernelSm90``, ``AttentionRegion``.
* ``plan``: ``Fallback``, ``PartitionResult``, ``Plan``.

All classes are frozen dataclasses of scalars and tuples; they validate in
``__post_init__`` and raise ``ValueError`` on an impossible combination.
Import them from ``cutlass_offload.ir``; the submodules are an implementation
detail.
"""
from .attention import (
    ATTENTION_ALIGNED_ACCESS,
    ATTENTION_BIASES,
    ATTENTION_DTYPES,
    ATTENTION_LAYOUTS,
    ATTENTION_UNALIGNED_ACCESS,
    BIAS_BROADCAST_DIMS,
    CAUSAL,
    CAUSAL_CODE,
    AttentionKernel,
    AttentionKernelSm90,
    AttentionProblem,
    AttentionRegion,
    AttentionVariant,
)
from .common import (
    ACTIVATIONS,
    ARCHS,
    DTYPES,
    FAMILIES,
    LAYOUTS,
    POST_ACTIVATIONS,
    RESIDUAL_OPS,
    TILE_SCHEDULERS,
    GemmEpilogue,
    KernelConfig,
    KernelSource,
    Note,
    config_from_dict,
    config_to_dict,
    note_mask_folded,
    note_not_fused,
    note_stops,
    replace,
)
from .conv import CONV_ITERATORS, ConvChoice, ConvKernel, ConvProblem, ConvRegion, DepthwiseKernel
from .gemm import (
    DECOMPOSITIONS,
    RASTER_ORDERS,
    GemmKernel,
    GemmLaunch,
    GemmProblem,
    GemmRegion,
)
from .norm import (
    NORM_KINDS,
    GroupNormKernel,
    GroupNormProblem,
    GroupNormRegion,
    NormKernel,
    NormProblem,
    NormRegion,
)
from .plan import Fallback, PartitionResult, Plan, anchor_node

__all__ = [
    "ACTIVATIONS",
    "ARCHS",
    "ATTENTION_ALIGNED_ACCESS",
    "ATTENTION_BIASES",
    "ATTENTION_DTYPES",
    "ATTENTION_LAYOUTS",
    "ATTENTION_UNALIGNED_ACCESS",
    "BIAS_BROADCAST_DIMS",
    "CAUSAL",
    "CAUSAL_CODE",
    "CONV_ITERATORS",
    "DECOMPOSITIONS",
    "DTYPES",
    "FAMILIES",
    "LAYOUTS",
    "NORM_KINDS",
    "POST_ACTIVATIONS",
    "RASTER_ORDERS",
    "RESIDUAL_OPS",
    "TILE_SCHEDULERS",
    "AttentionKernel",
    "AttentionKernelSm90",
    "AttentionProblem",
    "AttentionRegion",
    "AttentionVariant",
    "ConvChoice",
    "ConvKernel",
    "DepthwiseKernel",
    "ConvProblem",
    "ConvRegion",
    "Fallback",
    "GemmEpilogue",
    "GemmKernel",
    "GemmLaunch",
    "GemmProblem",
    "GemmRegion",
    "GroupNormKernel",
    "GroupNormProblem",
    "GroupNormRegion",
    "KernelConfig",
    "KernelSource",
    "Note",
    "note_mask_folded",
    "note_not_fused",
    "note_stops",
    "config_from_dict",
    "config_to_dict",
    "NormKernel",
    "NormProblem",
    "NormRegion",
    "PartitionResult",
    "Plan",
    "anchor_node",
    "replace",
]
