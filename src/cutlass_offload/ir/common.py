"""The vocabulary every region kind shares: dtypes, epilogue ops, layouts, archs,
kernel families, the fused epilogue, the kernel configuration and the emitted
kernel source.

* ``KernelConfig``: tile shape, warp shape, stages, cluster, schedule.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from ..dtypes import NAMES
from ..target import TARGETS

DTYPES = NAMES                      # dtypes.py: the dtype table
# quick_gelu: x * sigmoid(1.702 x) (OpenAI CLIP; transformers' QuickGELUActivation)
ACTIVATIONS = ("identity", "relu", "gelu_erf", "gelu_tanh", "silu", "sigmoid", "hardswish", "hardsigmoid",
               "quick_gelu")
RESIDUAL_OPS = ("none", "add", "mul")
POST_ACTIVATIONS = ("identity", "relu")
LAYOUTS = ("row", "col")
ARCHS = tuple(sorted(TARGETS))     # ("sm80", "sm90a"): target.py
FAMILIES = ("cutlass2x_sm80", "cutlass3x_sm90", "rowwise_norm", "nhwc_group_norm", "direct_depthwise")
TILE_SCHEDULERS = ("persistent", "stream_k", "lpt")

_SHORT = {
    "identity": "id", "relu": "relu", "gelu_erf": "gelu", "gelu_tanh": "gelutanh",
    "silu": "silu", "sigmoid": "sigmoid", "hardswish": "hswish", "hardsigmoid": "hsigmoid",
    "quick_gelu": "qgelu", "add": "add", "mul": "mul",
}


def _check(value, allowed, what):
    if value not in allowed:
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class GemmEpilogue:
    """D = post(residual_op(activation(acc + bias), C)), computed in fp32.

    bias: a per-output-column vector of shape (N,), broadcast over rows and batch.
    residual: "add" or "mul" with a full-shape source C of shape (L, M, N), or, with
      residual_broadcast, a vector of shape (N,) broadcast over rows (a per-channel
      tensor such as (1, K, 1, 1) after a conv), applied after the activation.
    residual_per_sample (conv kernels, with residual_broadcast): the vector is one
      per sample instead, (batch, N) row-major: a conv's (N, K, 1, 1) tensor such as
      the UNet's time embedding; output row m of the implicit GEMM (M = batch * P * Q)
      reads row m // (P * Q).
    post_activation: only "relu" after a residual (ResNet/TVM residual block form).
    glu: a gated linear unit (GEMM kernels on sm90a only): the GEMM's N columns are
      gate and up values interleaved in blocks of 8 (columns 16i..16i+7 the gate of
      output columns 8i..8i+7, 16i+8..16i+15 their up; bias interleaved alike) and
      D = activation(gate + bias_g) * (up + bias_u) has N / 2 columns
      (partition/gated_gemm.py, emit/templates/glu_epilogue.h). No residual then.
    """

    bias: bool = False
    activation: str = "identity"
    residual: str = "none"
    post_activation: str = "identity"
    residual_broadcast: bool = False
    glu: bool = False
    residual_per_sample: bool = False

    def __post_init__(self):
        _check(self.activation, ACTIVATIONS, "activation")
        _check(self.residual, RESIDUAL_OPS, "residual")
        _check(self.post_activation, POST_ACTIVATIONS, "post_activation")
        if self.post_activation != "identity" and self.residual == "none":
            raise ValueError("post_activation needs a residual; fold it into activation")
        if self.residual_broadcast and self.residual == "none":
            raise ValueError("residual_broadcast needs a residual")
        if self.residual_per_sample and not self.residual_broadcast:
            raise ValueError("residual_per_sample needs residual_broadcast")
        if self.glu and self.residual != "none":
            raise ValueError("a GLU epilogue takes no residual")

    @property
    def tag(self) -> str:
        parts = ["bias"] if self.bias else []
        if self.glu:
            parts.append("glu")
        if self.activation != "identity":
            parts.append(_SHORT[self.activation])
        if self.residual != "none":
            kind = ("ressvec" if self.residual_per_sample else "resvec" if self.residual_broadcast
                    else "res")
            parts.append(kind + _SHORT[self.residual])
        if self.post_activation != "identity":
            parts.append(_SHORT[self.post_activation])
        return "_".join(parts) or "plain"


@dataclass(frozen=True)
class KernelConfig:
    """How a kernel computes: the tuning choice.

    tile: threadblock (CTA) tile (M, N, K) in elements.
    warp: warp tile (M, N, K) for CUTLASS 2.x. For 3.x GEMMs, the tile of one
    consumer warp group when it is not the schedule's own split: (0, 0, 0) for
    that (cooperative: the two warp groups split the tile's rows; ping-pong: each
    takes whole tiles), or (M, N / 2, K) for a cooperative kernel whose two warp
    groups split the tile's columns (``n_split``; tile M may then be 192, e.g.
    192x192 tiles: emit/gemm_sm90.py).
    instruction: MMA instruction shape for 2.x, e.g. (16, 8, 16).
    stages: software pipeline depth; 0 = let the 3.x collective builder choose.
    cluster: thread block cluster shape (3.x only), (1, 1, 1) for 2.x.
    kernel_schedule / epilogue_schedule: 3.x schedule tags (C++ type names
    without namespace), e.g. "KernelTmaWarpSpecializedCooperative".
    tile_scheduler: how output tiles map onto CTAs (3.x GEMMs only): "persistent"
    (CUTLASS's default persistent data-parallel scheduler) or "stream_k"
    (``cutlass::gemm::StreamKScheduler``, cooperative schedule only; its default
    heuristic decomposition picks data-parallel, split-K or stream-K per problem
    and needs a workspace), or for causal Hopper attention "lpt" (query tiles
    heaviest first: emit/templates/fmha_lpt_scheduler.h).
    swap_ab: a 3.x GEMM computed transposed, D^T (N, M) = B^T A^T, and D^T stored
    column-major, which is D row-major: the tile's M runs along the problem's N and
    its N along M, so a problem with few rows (M = 154 for the UNet's text
    projections) fills a tile N fitted to M instead of leaving most of a 64-row tile
    empty (cuBLAS's and TensorRT-LLM's "swap AB" for small M; emit/gemm_sm90.py).
    """

    family: str
    tile: tuple
    stages: int
    warp: tuple = (0, 0, 0)
    instruction: tuple = (0, 0, 0)
    cluster: tuple = (1, 1, 1)
    kernel_schedule: str = ""
    epilogue_schedule: str = ""
    tile_scheduler: str = "persistent"
    swap_ab: bool = False

    def __post_init__(self):
        _check(self.family, FAMILIES, "family")
        if self.swap_ab and (self.family != "cutlass3x_sm90" or self.tile_scheduler != "persistent"
                             or tuple(self.warp) != (0, 0, 0)):
            raise ValueError("swap_ab is for CUTLASS 3.x GEMMs on the persistent scheduler, "
                             "without an N-split warp tile")
        _check(self.tile_scheduler, TILE_SCHEDULERS, "tile_scheduler")
        if len(self.tile) != 3 or len(self.cluster) != 3:
            raise ValueError("tile and cluster are (M, N, K) triples")
        if self.tile_scheduler != "persistent" and self.family != "cutlass3x_sm90":
            raise ValueError(f"tile_scheduler {self.tile_scheduler!r} is for CUTLASS 3.x kernels only")
        if self.family == "cutlass2x_sm80" and (len(self.warp) != 3 or 0 in self.warp):
            raise ValueError("a CUTLASS 2.x config needs a warp shape")
        if self.family == "cutlass3x_sm90" and tuple(self.warp) not in (
                (0, 0, 0), (self.tile[0], self.tile[1] // 2, self.tile[2])):
            raise ValueError(f"a CUTLASS 3.x warp group tile is (0, 0, 0) or (M, N / 2, K) of the "
                             f"tile {self.tile}, got {self.warp}")

    @property
    def n_split(self) -> bool:
        """Whether a 3.x GEMM's two consumer warp groups split the tile's columns
        (``warp`` = (M, N / 2, K)) instead of its rows."""
        return self.family == "cutlass3x_sm90" and tuple(self.warp) != (0, 0, 0)

    @property
    def tag(self) -> str:
        t = "x".join(map(str, self.tile))
        if self.family == "cutlass3x_sm90":
            c = "x".join(map(str, self.cluster))
            sched = {"KernelTmaWarpSpecializedCooperative": "coop",
                     "KernelTmaWarpSpecializedPingpong": "pingpong",
                     "KernelTmaWarpSpecialized": "ws",
                     "KernelImplicitTmaWarpSpecializedSm90": "ws"}.get(self.kernel_schedule, "auto")
            sched += "n" if self.n_split else ""
            return (f"{t}_c{c}_{sched}" + (f"_s{self.stages}" if self.stages else "")
                    + {"stream_k": "_streamk", "lpt": "_lpt"}.get(self.tile_scheduler, "")
                    + ("_swapab" if self.swap_ab else ""))
        w = "x".join(map(str, self.warp))
        return f"{t}_w{w}_s{self.stages}"


@dataclass(frozen=True)
class KernelSource:
    """C++ for one kernel: its includes (collected once per TU) and its code.

    code defines ``namespace <name> { int64_t workspace_size(const Args&);
    int run(const Args&, cudaStream_t); }`` where Args is ``args_type``
    (CoGemmArgs, CoConvArgs, CoNormArgs; emit/templates/prelude.h).
    """

    name: str
    includes: tuple
    code: str
    args_type: str = "CoGemmArgs"
    defines: tuple = ()      # macros the TU must define before its includes
    preamble: tuple = ()     # code blocks inlined before the includes (each once per TU)
    # nvcc options the kernel's TU is compiled with (build.shards.unit_class keeps
    # kernels of different flags in different TUs; emit_unit checks it)
    nvcc_flags: tuple = ()


def replace(obj, **changes):
    return dataclasses.replace(obj, **changes)


class _Region:
    """What every region has: ``nodes`` (FX node names in graph order) whose last one
    is the region's output."""

    @property
    def output(self) -> str:
        return self.nodes[-1]


def config_to_dict(config: KernelConfig) -> dict:
    """A KernelConfig as JSON-able data (tuples become lists)."""
    return asdict(config)


def config_from_dict(d: dict) -> KernelConfig:
    """The KernelConfig ``config_to_dict`` wrote. Raises ValueError (KernelConfig's
    own validation) or TypeError for data of another shape."""
    d = dict(d)
    for f in ("tile", "warp", "instruction", "cluster"):
        if f in d:
            d[f] = tuple(d[f])
    return KernelConfig(**d)


class Note(str):
    """A region note: the text (the str itself, with the node names a reader can
    find in the graph) and ``summary``, the same without node names, by which the
    report counts equal notes across regions."""

    summary: str

    def __new__(cls, text: str, summary: str | None = None):
        note = super().__new__(cls, text)
        note.summary = summary if summary is not None else text
        return note


def note_stops(what: str, node: str, uses: int) -> Note:
    """A norm or epilogue that ends at an output used elsewhere too."""
    return Note(f"{what} stops at {node}: used {uses} times",
                f"{what} ends at an output with more than one user (a residual stream, a "
                "concatenation): it is written to memory for them, so nothing after it fuses")


def note_not_fused(node: str, why: str) -> Note:
    """The op after the region that did not join it."""
    return Note(f"{node} not fused: {why}",
                f"next op not fused into the epilogue (stays in PyTorch): {why}")


def note_mask_folded(label: str, node: str, causal: str, checked: bool, window: int = 0) -> Note:
    """A compile-time mask folded into the attention kernel's causal mode; ``causal``
    "none": a mask that hides nothing (e.g. BERT's all-ones padding mask), dropped;
    ``window`` W: a top-left sliding window of W keys on the causal mask."""
    rest = " (checked once per shape)" if checked else ""
    if window:
        return Note(f"{label} {node} folded: {causal}, window {window}{rest}",
                    f"sliding-window causal mask folded into the kernel (top-left aligned, "
                    f"{window} keys){rest}")
    if causal == "none":
        return Note(f"{label} {node} folded: none{rest}",
                    f"mask hides nothing (a bias of zeros, a mask of all true, at the values "
                    f"compiled): dropped{rest}")
    words = {"top_left": "top-left", "bottom_right": "bottom-right"}.get(causal, causal)
    return Note(f"{label} {node} folded: {causal}{rest}",
                f"causal mask folded into the kernel ({words} aligned){rest}")
