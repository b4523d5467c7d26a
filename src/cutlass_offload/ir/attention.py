"""Fused multi-head attention regions: the problem, the sm80 (CUTLASS examples/41)
and sm90 (examples/88) kernels, and the region."""
from __future__ import annotations

import dataclasses
import math
import numbers
import struct
from dataclasses import dataclass
from typing import Optional

from .common import ARCHS, KernelConfig, _check, _Region

# Attention (emit/attention.py: CUTLASS's fused multi-head attention, examples/41)
ATTENTION_DTYPES = ("f16", "bf16", "f32")
CAUSAL = ("none", "top_left", "bottom_right")
CAUSAL_CODE = {"none": 0, "top_left": 1, "bottom_right": 2}   # CoAttentionArgs.causal
ATTENTION_BIASES = ("none", "add")
BIAS_BROADCAST_DIMS = ("batch", "heads", "queries")
ATTENTION_LAYOUTS = ("bmhk",)
# Q/K/V access width in elements: aligned kernel (16 bytes) / not aligned (kMinimumAlignment)
ATTENTION_ALIGNED_ACCESS = {"f16": 8, "bf16": 8, "f32": 4}
ATTENTION_UNALIGNED_ACCESS = 4


@dataclass(frozen=True)
class AttentionProblem:
    """What one attention region computes, per batch b and head h:

    out[b, :, h, :] = softmax(scale * Q_bh @ K_bh^T + bias_bh, mask) @ V_bh
    with Q_bh (seq_q, head_dim), K_bh (seq_kv, head_dim), V_bh (seq_kv, head_dim_v),
    fp32 accumulation and softmax, output in ``dtype``.

    seq_q, seq_kv, batch: ``None`` when dynamic (all three are runtime arguments).
    causal: "none", "top_left" (query i sees keys j <= i: PyTorch is_causal=True,
      torch.nn.attention.bias.causal_upper_left) or "bottom_right" (j <= i + seq_kv
      - seq_q: causal_lower_right; needs seq_q <= seq_kv).
    bias: "none" or "add" (an additive float bias of the input dtype; a boolean
      mask becomes 0 / -inf). bias_broadcast: the dims of (batch, heads, queries)
      over which the bias is broadcast (stride 0), e.g. ("batch", "heads") for a
      (Mq, Nk) bias; keys cannot be broadcast (key stride 1).
    scale: the logit scale taken from the model (PyTorch default 1/sqrt(head_dim));
      any float is representable, the kernel takes finite scale > 0 (see module doc).
    layout: "bmhk", the kernel's native order (batch, seq, heads, head_dim) with
      runtime batch / seq / head strides for Q, K, V (any values, 0 broadcasts; so
      a PyTorch (B, H, L, E) tensor is used in place). The output is packed BMHK
      except for its seq stride (head stride head_dim_v, batch stride seq_q *
      seq stride), and the bias (B, H, Mq, Nk) has batch / head / query strides.
    align: elements, the largest of 8/4/2/1 dividing the Q/K/V pointers and all
      their strides (example inputs; checked again on every call): 8 (16-bit) or
      4 (f32) selects the aligned kernel, 4 the not-aligned one.
    softcap: 0.0, or the cap c of a tanh soft-cap on the scaled logits before the bias
      and the softmax: ``c * tanh(scale * Q_bh @ K_bh^T / c)`` (Gemma 2's
      ``attn_logit_softcapping``; Grok-1); only the Hopper kernel applies it.
    kv_group: query heads per K/V head (grouped-query attention): query head h reads
      K/V head h // kv_group, K and V holding heads // kv_group heads, read in place
      (no ``repeat_kv`` copy). 1: one K/V head per query head (or one shared by all,
      stride 0).
    window: 0, or W of a top-left sliding window with the causal mask: query i sees
      keys i - W < j <= i (transformers' ``sliding_window``: Mistral, Gemma 2 / 3);
      needs causal "top_left"; only the Hopper kernel applies it.
    """

    heads: int
    seq_q: Optional[int]
    seq_kv: Optional[int]
    head_dim: int
    head_dim_v: int
    dtype: str
    scale: float
    batch: Optional[int] = None
    causal: str = "none"
    bias: str = "none"
    bias_broadcast: tuple = ()
    align: int = 8
    layout: str = "bmhk"
    batch_hint: int = 1
    softcap: float = 0.0
    kv_group: int = 1
    window: int = 0

    def __post_init__(self):
        _check(self.dtype, ATTENTION_DTYPES, "dtype")
        _check_window(self.window, self.causal == "top_left")
        if not (isinstance(self.kv_group, int) and not isinstance(self.kv_group, bool)
                and self.kv_group >= 1 and self.heads % self.kv_group == 0):
            raise ValueError(f"kv_group must be a positive divisor of heads={self.heads}, "
                             f"got {self.kv_group!r}")
        if not (isinstance(self.softcap, numbers.Real) and not isinstance(self.softcap, bool)
                and 0.0 <= self.softcap < math.inf):
            raise ValueError(f"softcap must be a finite number >= 0 (0: none), got {self.softcap!r}")
        object.__setattr__(self, "softcap", float(self.softcap))
        _check(self.causal, CAUSAL, "causal")
        _check(self.bias, ATTENTION_BIASES, "bias")
        _check(self.layout, ATTENTION_LAYOUTS, "layout")
        _check(self.align, (1, 2, 4, 8), "align")
        if self.heads < 1 or self.head_dim < 1 or self.head_dim_v < 1:
            raise ValueError(f"heads and head dims must be positive: heads={self.heads} "
                             f"head_dim={self.head_dim} head_dim_v={self.head_dim_v}")
        for what, n in (("batch", self.batch), ("seq_q", self.seq_q), ("seq_kv", self.seq_kv)):
            if n is not None and n < 0:
                raise ValueError(f"{what} must be >= 0 or None (dynamic), got {n}")
        if not isinstance(self.scale, numbers.Real) or isinstance(self.scale, bool):
            raise ValueError(f"scale must be a real number, got {self.scale!r}")
        object.__setattr__(self, "scale", float(self.scale))
        dims = tuple(self.bias_broadcast)
        if "keys" in dims:
            raise ValueError("a bias broadcast over keys is a per-row constant (softmax "
                             "ignores it unless it is -inf): drop it or materialize it; the "
                             "kernel reads bias rows with key stride 1")
        for d in dims:
            _check(d, BIAS_BROADCAST_DIMS, "bias_broadcast dim")
        if len(set(dims)) != len(dims):
            raise ValueError(f"bias_broadcast lists a dim twice: {dims}")
        if dims and self.bias == "none":
            raise ValueError("bias_broadcast needs a bias")
        # canonical order, so equal problems compare equal
        object.__setattr__(self, "bias_broadcast",
                           tuple(d for d in BIAS_BROADCAST_DIMS if d in dims))

    @property
    def epilogue(self) -> "AttentionVariant":
        """No fused epilogue: the report's epilogue column names the mask variant (and a
        soft-cap, K/V heads read in place for grouped-query attention)."""
        parts = [] if self.causal == "none" else [{"top_left": "causal",
                                                    "bottom_right": "causal_br"}[self.causal]]
        if self.window:
            parts.append("window")
        if self.bias != "none":
            parts.append("bias")
        if self.softcap:
            parts.append("softcap")
        if self.kv_group > 1:
            parts.append("gqa")
        return AttentionVariant("_".join(parts) or "plain")

    def summary(self) -> dict:
        """The problem as the report shows it (JSON-able)."""
        p = self
        return {"attention": {"batch_hint": p.batch_hint, "heads": p.heads, "seq_q": p.seq_q,
                              "seq_kv": p.seq_kv, "head_dim": p.head_dim,
                              "head_dim_v": p.head_dim_v, "scale": p.scale, "causal": p.causal,
                              "bias": p.bias, "bias_broadcast": list(p.bias_broadcast),
                              "align": p.align, **({"softcap": p.softcap} if p.softcap else {}),
                              **({"kv_group": p.kv_group} if p.kv_group > 1 else {}),
                              **({"window": p.window} if p.window else {})}}


@dataclass(frozen=True)
class AttentionVariant:
    """What the report lists in an attention region's "epilogue" column."""

    tag: str


@dataclass(frozen=True)
class AttentionKernel:
    """One distinct AttentionKernel<...> instantiation (examples/41 kernel_forward.h).

    config: KernelConfig(family "cutlass2x_sm80", tile = (kQueriesPerBlock,
      kKeysPerBlock, kMaxK), warp (32, 32, 32) and instruction (16, 8, 8) as the
      kernel hard-codes them, stages 4 (16-bit) / 3 (f32): the mainloop depth the
      kernel requests; informational, not a template parameter).
    aligned: isAligned (Q/K/V read 16 bytes at a time) vs 4-element accesses.
    supports_bias: kSupportsBias. kSupportsDropout is always false.
    kv_group: query heads per K/V head, compiled in (grouped-query attention: the
      launch's K / V head stride is per K/V head; 1: per query head).
    The causal mask, all sizes, strides and the scale are runtime arguments.
    """

    arch: str
    dtype: str
    config: KernelConfig
    aligned: bool = True
    supports_bias: bool = False
    kv_group: int = 1

    kind = "attention"
    args_type = "CoAttentionArgs"
    layout_a = layout_b = "bmhk"

    def __post_init__(self):
        _check(self.arch, ARCHS, "arch")
        _check(self.dtype, ATTENTION_DTYPES, "dtype")
        _check_group(self.kv_group)

    @property
    def queries_per_block(self) -> int:
        return self.config.tile[0]

    @property
    def keys_per_block(self) -> int:
        return self.config.tile[1]

    @property
    def max_k(self) -> int:
        return self.config.tile[2]

    @property
    def single_value_iteration(self) -> bool:
        """kSingleValueIteration: the output stays in registers ("rf")."""
        return self.max_k <= self.keys_per_block

    @property
    def needs_workspace(self) -> bool:
        """kNeedsOutputAccumulatorBuffer: fp32 running output in the workspace."""
        return not self.single_value_iteration and self.dtype != "f32"

    @property
    def access(self) -> int:
        """Q/K/V access width in elements (head dims and strides must be multiples)."""
        return ATTENTION_ALIGNED_ACCESS[self.dtype] if self.aligned else ATTENTION_UNALIGNED_ACCESS

    # the (A, B, C) alignments other kernel kinds have (build/shards.py reads them)
    @property
    def align_a(self) -> int:
        return self.access

    align_b = align_c = align_a

    @property
    def name(self) -> str:
        q, k, mk = self.config.tile
        mode = "rf" if self.single_value_iteration else "gmem"
        return (f"{self.config.family}_fmha_fwd_{self.dtype}_"
                f"{'aligned' if self.aligned else 'notaligned'}_{q}x{k}_k{mk}_{mode}"
                + ("_bias" if self.supports_bias else "") + _group_tag(self.kv_group))


@dataclass(frozen=True)
class AttentionKernelSm90:
    """One Hopper fused multi-head attention forward instantiation (CUTLASS
    examples/88_hopper_fmha: TMA loads and stores, warp-specialized cooperative
    schedule, one producer and two consumer warpgroups; emit/attention_sm90.py).

    config: KernelConfig(family "cutlass3x_sm90", tile = (BlockQ, BlockKV,
      BlockHead): 128 or 192 queries per CTA (64 per consumer warpgroup) x keys per
      mainloop step x the head dim the tile holds (head dims below it are zero-filled
      by TMA and clipped by the TMA store), stages = K/V pipeline depth (kStagesKV,
      5 by default), kernel_schedule "KernelTmaWarpSpecializedCooperative" or
      "KernelTmaWarpSpecializedPingpong", tile_scheduler "persistent" (the
      example's schedulers) or, causal only, "lpt" (query tiles heaviest first);
      families/attention_sm90.CONFIGS lists the legal ones).
    causal: the fusion is a template parameter: True = CausalFusion (top-left),
      False = ResidualFusion (no mask; keys past seq_kv in the last tile masked).
    softcap, scale: a tanh soft-cap ``softcap * tanh(scale * s / softcap)`` on the
      logits s, applied by the fusion before its mask with both constants compiled in
      (the fusion is stateless); the kernel then takes only calls of that ``scale``.
      0.0 and 0.0 without one.
    kv_group: query heads per K/V head, compiled in (grouped-query attention: the K /
      V head mode is (kv_group, heads // kv_group) with strides (0, K/V head stride),
      templates/fmha_gqa_mainloop.h); 1: one K/V head per query head.
    window: 0, or W of a sliding window on the causal mask (keys i - W < j <= i),
      compiled in (the fusion masks every K/V tile it visits).
    Q/K/V/O are read and written 16 bytes at a time (TMA): head dim, pointers
    and strides multiples of 8 elements. The workspace holds the per-row
    log-sum-exp the kernel always writes (fp32, batch x heads x seq_q).
    """

    arch: str
    dtype: str
    config: KernelConfig
    causal: bool = False
    softcap: float = 0.0
    scale: float = 0.0
    kv_group: int = 1
    window: int = 0

    kind = "attention"
    args_type = "CoAttentionArgs"
    layout_a = layout_b = "bmhk"
    aligned = True
    supports_bias = False
    needs_workspace = True          # the log-sum-exp rows
    access = 8                      # elements per 16-byte TMA access (f16 / bf16)
    align_a = align_b = align_c = 8

    def __post_init__(self):
        _check(self.arch, ("sm90a",), "arch")
        _check(self.dtype, ("f16", "bf16"), "dtype")
        if self.config.family != "cutlass3x_sm90":
            raise ValueError(f"Hopper attention kernels are cutlass3x_sm90, got {self.config.family!r}")
        if self.config.tile_scheduler not in ("persistent", "lpt"):
            raise ValueError(f"Hopper attention tile schedulers are 'persistent' and 'lpt', "
                             f"got {self.config.tile_scheduler!r}")
        if self.softcap:
            if not (0.0 < self.softcap < math.inf and 0.0 < self.scale < math.inf):
                raise ValueError(f"a soft-capped kernel needs a finite cap and scale > 0, got "
                                 f"softcap={self.softcap!r} scale={self.scale!r}")
        elif self.scale:
            raise ValueError("scale is compiled into soft-capped kernels only")
        _check_group(self.kv_group)
        _check_window(self.window, self.causal)

    @property
    def head_tile(self) -> int:
        return self.config.tile[2]

    @property
    def name(self) -> str:
        q, k, d = self.config.tile
        schedule = "pingpong" if self.config.kernel_schedule.endswith("Pingpong") else "coop"
        return (f"cutlass3x_sm90_fmha_fwd_{self.dtype}_{q}x{k}x{d}_s{self.config.stages}_{schedule}"
                + ("_lpt" if self.config.tile_scheduler == "lpt" else "")
                + ("_causal" if self.causal else "")
                + (f"_softcap{_float_tag(self.softcap)}_scale{_float_tag(self.scale)}"
                   if self.softcap else "") + _group_tag(self.kv_group)
                + (f"_win{self.window}" if self.window else ""))


def _check_window(window, causal: bool) -> None:
    if not (isinstance(window, int) and not isinstance(window, bool) and window >= 0):
        raise ValueError(f"window must be an int >= 0 (0: none), got {window!r}")
    if window and not causal:
        raise ValueError("a sliding window is a band on the top-left causal mask: it needs causal")


def _check_group(kv_group) -> None:
    if not (isinstance(kv_group, int) and not isinstance(kv_group, bool) and kv_group >= 1):
        raise ValueError(f"kv_group must be an int >= 1, got {kv_group!r}")


def _group_tag(kv_group: int) -> str:
    """The kernel name's grouped-query suffix: none for one K/V head per query head."""
    return f"_gqa{kv_group}" if kv_group > 1 else ""


def _float_tag(x: float) -> str:
    """``x`` in an identifier: its float32 bits in hex (what the kernel compiles in)."""
    return struct.pack(">f", x).hex()


@dataclass(frozen=True)
class AttentionRegion(_Region):
    """A fused multi-head attention subgraph to offload: ``aten.scaled_dot_product_attention``
    or the hand-written ``softmax(q @ k^T * scale [+ bias]) @ v`` (partition/attention.py).

    nodes: FX node names in graph order, the last one the region's output.
    q, k, v: input node names by role, as the graph gives them: (..., L, E) tensors of
      rank 4 (B, H, L, E) or 3 (N, L, E); with ``k_transposed`` the k input is K^T
      (..., E, S) (the hand-written form's ``k.transpose(-1, -2)`` when it is not part
      of the region).
    bias: input read as the kernel's additive bias, by ``bias_kind``: "float" (added
      to the scaled logits), "bool_keep" (SDPA's boolean mask, True = attend) or
      "bool_masked" (``masked_fill(logits, mask, -inf)``, True = masked); the region
      module turns a boolean mask into a 0 / -inf bias.
    mask: an input mask folded into ``problem.causal`` (or found to mask nothing): the
      kernel does not read it, the PyTorch fallback does. ``mask_check`` (its value
      depends on dynamic sizes): the region module compares it once per shape with the
      pattern before trusting the fold (``mask_kind`` says how to read it).
    negate: the model's scale is negative: the kernel runs with -scale on -Q (or -K).
    out_layout: "bmhk": the region's output is (B, L, H, Ev), contiguous (a transpose
      of SDPA's output joined the region); "strided": (B, H, L, Ev), a view of the
      kernel's BMHK output (rank 3: (N, L, Ev), contiguous); "contiguous": (B, H, L,
      Ev) copied contiguous (a user views it in a way the strided one does not allow).
    rank: 4 or 3 (q, k, v and the output).
    anchor: the SDPA call's node name (form "sdpa"; layout copies before it may come
      first in ``nodes``): what a fallback of the region names; "" for the other form.
    form: "sdpa" or "softmax_attention". Query rows that see no key give 0 in SDPA
      (PyTorch's rule) and NaN in the hand-written form (softmax over -inf), with the
      kernel as in PyTorch.
    """

    name: str
    form: str
    nodes: tuple
    q: str
    k: str
    v: str
    problem: AttentionProblem
    bias: Optional[str] = None
    bias_kind: str = "none"
    mask: Optional[str] = None
    mask_kind: str = "none"
    mask_check: bool = False
    k_transposed: bool = False
    negate: bool = False
    out_layout: str = "strided"
    rank: int = 4
    notes: tuple = ()
    anchor: str = ""

    def __post_init__(self):
        _check(self.form, ("sdpa", "softmax_attention"), "form")
        _check(self.out_layout, ("bmhk", "strided", "contiguous"), "out_layout")
        _check(self.rank, (3, 4), "rank")
        if self.out_layout == "bmhk" and self.rank != 4:
            raise ValueError("only a rank-4 output is transposed to BMHK")
        kinds = ("none", "float", "bool_keep", "bool_masked")
        _check(self.bias_kind, kinds, "bias_kind")
        _check(self.mask_kind, kinds, "mask_kind")
        if (self.bias is None) != (self.bias_kind == "none"):
            raise ValueError("bias and bias_kind go together")
        if (self.bias is not None) != (self.problem.bias == "add"):
            raise ValueError("a bias input needs a problem with bias='add', and back")

    @property
    def kernel_problem(self) -> AttentionProblem:
        """The problem as the kernel runs it: bottom-right causal attention with more
        queries than keys runs on the last seq_kv queries only (the region module
        fills the rows that see no key)."""
        p = self.problem
        if p.causal == "bottom_right" and p.seq_q is not None and p.seq_kv is not None \
                and p.seq_q > p.seq_kv:
            return dataclasses.replace(p, seq_q=p.seq_kv)
        return p
