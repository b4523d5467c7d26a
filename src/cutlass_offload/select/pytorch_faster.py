"""GEMM, conv2d and attention problems where PyTorch's own kernel was measured faster.

A region whose problem is listed here stays in PyTorch (a Fallback with the
measured times as its reason): there cuBLAS (with the unfused epilogue ops after
it), cuDNN's conv or the best SDPA backend (cuDNN, flash, efficient) beats our
kernel on that GPU, and with Inductor glue PyTorch's
kernel sits in the compiled graph like ours would. The list comes from the kernel
corpus benchmark (``benchmarks/kernels_bench.py --write-pytorch-faster``: every corpus
problem whose speedup over the anchor is below ``DEFER_BELOW`` in that run) and
holds the GPU, its SM count, the date and the CUTLASS version it was measured
with; it applies only to the SM count it was measured on (the arch sm_90a).
Shapes it does not list keep our kernel: nothing is extrapolated.

File (JSON): {"gpu", "num_sms", "date", "cutlass", "source", "below", "conv2d":
[{ConvProblem fields n, c, k, h, w, r, s, pad, stride, dilation, dtype, "ours_us",
"anchor", "anchor_us", optional "bench": the benchmark that measured it, default
benchmarks/kernels_bench.py}], "attention": [{AttentionProblem fields batch, heads,
seq_q, seq_kv, head_dim, head_dim_v, causal, dtype, "ours_us", "anchor",
"anchor_us"}], "gemm": [{"m" (rows at the example size), "n", "k", "batch",
"dtype", "layout_a", "layout_b", "align" [A, B, C], "epilogue" (GemmEpilogue.tag),
"kernel" (the tag of the kernel that was timed, config and launch knobs:
select.kernel_tag), "ours_us", "anchor", "anchor_us"}]}.

A GEMM entry applies only while select still chooses the kernel it timed (a
table or rule change since, or a tuned choice, is a kernel the list says
nothing about). Any entry may carry "glue": "inductor" when PyTorch's side was
measured compiled by Inductor and only then wins (gpt2's LM head: Inductor pads
its misaligned output; eager cuBLAS on it ran 3.4x slower than our kernel); it
applies to compiles with Inductor glue only.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from ..ir import AttentionProblem, ConvProblem, GemmProblem

DEFER_BELOW = 0.97      # speedup over PyTorch under which a measured problem stays there
FILE = Path(__file__).parent / "tables" / "sm90a_h200_pytorch_faster.json"

_CONV_FIELDS = ("n", "c", "k", "h", "w", "r", "s", "pad", "stride", "dilation", "dtype", "groups")
_DEFAULTS = {"groups": 1}      # fields older entries leave out
_ATTENTION_FIELDS = ("batch", "heads", "seq_q", "seq_kv", "head_dim", "head_dim_v", "causal", "dtype")
_GEMM_FIELDS = ("m", "n", "k", "batch", "dtype", "layout_a", "layout_b", "align", "epilogue")
_DEFAULTS_GEMM = {"layout_a": "row", "batch": 1}     # rows of older benchmark runs leave them out
_FIELDS = {"conv2d": _CONV_FIELDS, "attention": _ATTENTION_FIELDS, "gemm": _GEMM_FIELDS}


def conv_key(p: ConvProblem) -> tuple:
    """The identity of a conv problem in the table (the batch at its example size)."""
    d = {f: getattr(p, f) for f in _CONV_FIELDS}
    d["n"] = p.n if p.n is not None else p.n_hint
    return tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in (d[f] for f in _CONV_FIELDS))


def attention_key(p: AttentionProblem) -> tuple:
    """The identity of an attention problem in the table (batch at its example size)."""
    d = {f: getattr(p, f) for f in _ATTENTION_FIELDS}
    d["batch"] = p.batch if p.batch is not None else p.batch_hint
    return tuple(d[f] for f in _ATTENTION_FIELDS)


def gemm_key(p: GemmProblem) -> tuple:
    """The identity of a GEMM problem in the table (M and the batch at their example
    sizes, the epilogue by its tag)."""
    return (p.m if p.m is not None else p.m_hint, p.n, p.k,
            p.batch if p.batch is not None else p.batch_hint, p.dtype, p.layout_a, p.layout_b,
            (p.align_a, p.align_b, p.align_c), p.epilogue.tag)


def _field(d: dict, f: str):
    """d[f], or the default of a field older entries leave out (KeyError otherwise)."""
    if f in d:
        return d[f] if d[f] is not None or f != "batch" else 1
    defaults = {**_DEFAULTS, **_DEFAULTS_GEMM}
    if f not in defaults:
        raise KeyError(f)
    return defaults[f]


def _entry_key(e: dict, fields) -> tuple:
    return tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in (_field(e, f) for f in fields))


class PytorchFaster:
    """The loaded list. ``reason(problem, num_sms, kernel)``: why the problem stays
    in PyTorch, or None when our kernel runs it (``kernel``: for a GEMM, the tag of
    the kernel select chose; the entry must name it). Raises KeyError / TypeError
    for a file of another shape."""

    def __init__(self, data: dict):
        self.gpu, self.num_sms = data["gpu"], int(data["num_sms"])
        self.conv = {_entry_key(e, _CONV_FIELDS): e for e in data.get("conv2d", [])}
        self.attention = {_entry_key(e, _ATTENTION_FIELDS): e for e in data.get("attention", [])}
        self.gemm = {_entry_key(e, _GEMM_FIELDS): e for e in data.get("gemm", [])}

    def reason(self, problem, num_sms: int, kernel: str | None = None,
               glue: str = "eager") -> str | None:
        if num_sms != self.num_sms:
            return None
        if isinstance(problem, ConvProblem):
            e = self.conv.get(conv_key(problem))
        elif isinstance(problem, AttentionProblem):
            e = self.attention.get(attention_key(problem))
        elif isinstance(problem, GemmProblem):
            e = self.gemm.get(gemm_key(problem))
            if e is not None and e["kernel"] != kernel:
                return None
        else:
            return None
        if e is None or e.get("glue", glue) != glue:
            return None
        return (f"PyTorch is faster here: {e['anchor']} {e['anchor_us']:.1f} us against our kernel's "
                f"{e['ours_us']:.1f} us per call on {self.gpu} ({e.get('bench', 'benchmarks/kernels_bench.py')})")


@functools.cache
def default() -> PytorchFaster | None:
    """The packaged list (``FILE``), or None when there is none."""
    return PytorchFaster(json.loads(FILE.read_text())) if FILE.exists() else None


def reason(problem, arch: str, num_sms: int, kernel: str | None = None,
           glue: str = "eager") -> str | None:
    """Why ``problem`` (a GemmProblem whose chosen kernel has the tag ``kernel``, a
    ConvProblem or an AttentionProblem) should stay in PyTorch on ``arch`` with
    ``num_sms`` SMs under ``glue`` ("eager" / "inductor"), or None (also for other
    arches and kinds)."""
    table = default() if arch == "sm90a" else None
    return table.reason(problem, num_sms, kernel, glue) if table is not None else None


def entry_key(kind: str, e: dict) -> tuple:
    """The identity of a list entry or benchmark row of ``kind`` ("gemm" /
    "conv2d" / "attention")."""
    return _entry_key(e, _FIELDS[kind])


def measured_keys(rows: list) -> dict:
    """{"gemm": {keys}, "conv2d": {keys}, "attention": {keys}} of the problems
    benchmark rows timed (a heuristic speedup recorded), listed or not."""
    out = {"gemm": set(), "conv2d": set(), "attention": set()}
    for r in rows:
        if r.get("kind") in out and r.get("heuristic_speedup") is not None:
            out[r["kind"]].add(entry_key(r["kind"], r))
    return out


def entries_from_rows(rows: list, below: float = DEFER_BELOW) -> dict:
    """{"gemm": [...], "conv2d": [...], "attention": [...]} of benchmark rows
    (benchmarks/kernels_bench.py) whose heuristic speedup over the anchor is below
    ``below``; a GEMM entry names the kernel it timed (the row's "heuristic")."""
    out, seen = {"gemm": [], "conv2d": [], "attention": []}, set()
    for r in rows:
        kind = r.get("kind")
        sp = r.get("heuristic_speedup")
        if kind not in out or sp is None or sp >= below or (kind, entry_key(kind, r)) in seen:
            continue
        seen.add((kind, entry_key(kind, r)))        # a lowered conv's GEMM may repeat a linear's
        e = {f: _field(r, f) for f in _FIELDS[kind]}
        anchor = r.get("anchor", "pytorch")
        if kind == "gemm":
            e["kernel"] = r["heuristic"]
            if "anchor" not in r:     # kernels_bench.py's GEMM rows: cuBLAS, then the unfused ops
                anchor = "cuBLAS" + (" and the unfused epilogue" if r.get("fused") else "")
        e.update(ours_us=r["heuristic_us"], anchor=anchor, anchor_us=r["anchor_us"])
        if "bench" in r:
            e["bench"] = r["bench"]
        out[kind].append(e)
    return out
