"""Kernel corpus: every distinct GEMM, conv2d and attention problem of the built-in
models, offloaded or left in PyTorch, as data for a kernel benchmark (no GPU).

    python benchmarks/corpus.py [--models llama vae-decoder] [--out FILE] [--force]

For each model (default: bert-base, gpt2, sd-unet, resnet50, llama, whisper-encoder,
convnext-tiny, efficientnet-b0, vae-decoder): ``load_model(name, "fp16")`` at its
default sizes (models.DEFAULT_SIZES), ``capture`` (torch.export, canonicalized), then
``partition(gm, CompileOptions(arch="sm90a"))``. Offloaded GEMM / conv2d / attention
regions give their problem objects (cutlass_offload.ir); the matmul / conv / attention
ops that stay in PyTorch are the partitioner's Fallbacks of those kinds plus such ops
it has no anchor for (conv1d, baddbmm, ...), with their operands read from the
graph's ``meta['val']`` so PyTorch can be timed on them. Prints a summary table.

Resumable: the JSON is rewritten (atomically) after each model, and a model already
in it with the same key (schema, sizes, dtype, arch and package versions) is not
captured again unless ``--force``. A model that fails (e.g. timm missing) is recorded
with its error and tried again on the next run; the exit status is 1 then. A model
recorded ok before keeps that record and its problems (``refresh_error`` says why it
was not refreshed).

JSON schema (``schema_version`` 1; benchmarks/corpus/corpus.json):

    {"schema_version": 1,
     "created": "YYYY-MM-DD",            # UTC date of the last write
     "versions": {"python", "torch", "transformers", "diffusers", "timm",
                  "torchvision", "cutlass_offload"},   # this run's; None = missing
     "options": {"dtype": "fp16", "arch": "sm90a"},
     "models": {NAME: {
         "status": "ok" | "error", "error": str (status error only),
         "key": {...},                   # what a resumed run compares
         "created": "YYYY-MM-DD", "versions": {...},
         "batch": int, "seq": int,       # load_model's sizes (seq: see models.py)
         "inputs": [TENSOR, ...], "capture_s": float, "partition_s": float,
         "regions": {"gemm" | "conv2d" | "attention" | "norm" | "group_norm": count},
         "fallbacks": {op: count},       # every Fallback, norms included
         "pytorch_ops": {"gemm" | "conv" | "attention": count},
         "problems": {"gemm" | "conv2d" | "attention": [regions, distinct]},
         "gflop": {"offloaded": float, "pytorch": float}}},  # per forward
     "gemm" | "conv2d" | "attention": [   # distinct offloaded problems, all models
         {"id": "gemm-0",                 # stable only within one file
          "problem": {...},               # dataclasses.asdict of the ir problem
          "shape": str,                   # e.g. "M4096 N768 K768"
          "flops": float,                 # per call (attention: visible pairs only)
          "counts": {MODEL: regions}, "forms": {MODEL: [anchor forms]}}, ...],
     "pytorch": [                         # distinct ops left in PyTorch, all models
         {"id": "pytorch-0", "kind": "gemm" | "conv" | "attention",
          "target": "aten.convolution.default", "args": [ARG, ...],
          "kwargs": {name: ARG}, "out": TENSOR,
          "shape": {...},                 # kind-specific summary, see _summary
          "flops": float | None, "reason": str,
          "counts": {MODEL: ops}}, ...]}

    TENSOR = {"shape": [int], "stride": [int], "dtype": "float16"}
    ARG = TENSOR | int | float | bool | str | None | [ARG]

Problem fields: GEMM (ir.GemmProblem) m (None when dynamic; m_hint the example's),
n, k, batch, layout_b, align_a/b/c, a_batch_broadcast, epilogue {bias, activation,
residual, post_activation, residual_broadcast}; conv2d (ir.ConvProblem) n, c, h, w,
k, r, s, pad (top, bottom, left, right), stride, dilation, align_a/b/c, epilogue, plus
"p", "q" (output size); attention (ir.AttentionProblem) batch, heads, seq_q, seq_kv,
head_dim, head_dim_v, causal, bias, bias_broadcast, scale, align.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from _region_stats import describe, region_flops, region_kind  # noqa: E402
from cutlass_offload.capture import capture  # noqa: E402
from cutlass_offload.config import CompileOptions  # noqa: E402
from cutlass_offload.models import DEFAULT_SIZES, load_model  # noqa: E402
from cutlass_offload.partition import partition  # noqa: E402

SCHEMA_VERSION = 1
DEFAULT_MODELS = ("bert-base", "gpt2", "sd-unet", "resnet50", "llama", "whisper-encoder",
                  "convnext-tiny", "efficientnet-b0", "vae-decoder")
DEFAULT_OUT = HERE / "corpus" / "corpus.json"
DTYPE, ARCH = "fp16", "sm90a"
REGION_KINDS = ("gemm", "conv2d", "attention")

aten = torch.ops.aten
# Fallback.op (the partitioner's anchor form) -> corpus kind; others (norms) only counted
FALLBACK_KIND = {"linear": "gemm", "matmul": "gemm", "mm": "gemm", "addmm": "gemm",
                 "bmm": "gemm", "conv2d": "conv", "sdpa": "attention",
                 "softmax_attention": "attention"}


def _unanchored_targets() -> dict:
    """Heavy ATen ops the partitioner has no anchor for, by kind (the partitioner
    reports those it knows as fallbacks, partition/unanchored.py; any other is
    listed here as having no anchor)."""
    names = {"gemm": ("baddbmm.default", "addbmm.default", "einsum.default", "mv.default",
                      "dot.default", "tensordot.default", "addmv.default"),
             "conv": ("conv1d.default", "conv1d.padding", "conv3d.default", "conv3d.padding",
                      "conv_transpose1d.default", "conv_transpose2d.input",
                      "conv_transpose3d.input"),
             "attention": ("_scaled_dot_product_flash_attention.default",
                           "_scaled_dot_product_efficient_attention.default",
                           "_scaled_dot_product_cudnn_attention.default")}
    out = {}
    for kind, ops in names.items():
        for name in ops:
            packet, _, overload = name.partition(".")
            target = getattr(getattr(aten, packet, None), overload, None)
            if target is not None:
                out[target] = kind
    return out


UNANCHORED = _unanchored_targets()


# ------------------------------------------------------------------ versions, keys

def _version(module: str):
    try:
        return __import__(module).__version__
    except Exception:              # missing, or broken (timm without a usable torchvision)
        return None


def _git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": _version("transformers"), "diffusers": _version("diffusers"),
            "timm": _version("timm"), "torchvision": _version("torchvision"),
            "cutlass_offload": _git_commit()}


def model_key(name: str, vers: dict) -> dict:
    """What must match for a stored model to be reused by a resumed run."""
    batch, seq = DEFAULT_SIZES.get(name, (8, 128))
    return {"schema_version": SCHEMA_VERSION, "batch": batch, "seq": seq, "dtype": DTYPE,
            "arch": ARCH, **{k: vers[k] for k in ("torch", "transformers", "diffusers", "timm")}}


# ------------------------------------------------------------------ graph values

def _tensor(v) -> dict:
    return {"shape": [_int(d) for d in v.shape], "stride": [_int(d) for d in v.stride()],
            "dtype": str(v.dtype).removeprefix("torch.")}


def _int(d):
    try:
        return int(d)
    except (TypeError, ValueError):    # a symbolic size (not in these static captures)
        return str(d)


def _arg(a):
    """An FX argument as JSON: a node becomes its meta['val'] (a tensor's shape,
    stride and dtype), constants stay."""
    import torch.fx as fx
    if isinstance(a, fx.Node):
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor):
            return _tensor(v)
        return _arg(v) if not isinstance(v, fx.Node) else str(a)
    if isinstance(a, (list, tuple)):
        return [_arg(x) for x in a]
    if isinstance(a, (bool, int, float, str)) or a is None:
        return a if not isinstance(a, float) or math.isfinite(a) else str(a)
    if isinstance(a, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(a)
    if isinstance(a, torch.SymInt):
        return _int(a)
    return repr(a)


def _shape(n):
    v = n.meta.get("val") if hasattr(n, "meta") else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _summary(kind: str, node) -> tuple:
    """(shape summary dict, FLOPs or None) of an op left in PyTorch, from meta['val']."""
    args = list(node.args) + [None] * 10
    out = _shape(node)
    target = str(node.target)
    try:
        if kind == "conv":
            x, w = _shape(args[0]), _shape(args[1])
            kw = dict(node.kwargs)
            groups = kw.get("groups")
            if groups is None:           # conv{1,2,3}d(x, w, b, stride, pad, dil, groups)
                groups = args[8] if "convolution" in target else args[6]
            groups = groups if isinstance(groups, int) else 1
            transposed = "transpose" in target or ("convolution" in target and bool(args[6]))
            s = {"x": list(x), "w": list(w), "out": list(out), "groups": groups,
                 "transposed": transposed, "bias": args[2] is not None,
                 "spatial_dims": len(x) - 2}
            c_per_group = w[0] // groups if transposed else w[1]
            # 2 * output elements * (input channels per group) * kernel elements
            flops = 2.0 * math.prod(out) * c_per_group * math.prod(w[2:]) if not transposed \
                else 2.0 * math.prod(x) * w[1] * math.prod(w[2:])
            return s, flops
        if kind == "gemm":
            if "linear" in target:
                a, b = _shape(args[0]), _shape(args[1])
                k, n = a[-1], b[0]
            elif "addmm" in target or "baddbmm" in target:
                a, b = _shape(args[1]), _shape(args[2])
                k, n = a[-1], b[-1]
            else:
                a, b = _shape(args[0]), _shape(args[1])
                k, n = a[-1], (b[-1] if len(b) > 1 else 1)
            s = {"a": list(a), "b": list(b), "out": list(out), "k": k, "n": n,
                 "m": math.prod(out) // n if n else None}
            return s, 2.0 * math.prod(out) * k
        if kind == "attention":
            if "softmax" in target:          # a refused hand-written attention's softmax
                return {"logits": list(out)}, None
            q, k, v = _shape(args[0]), _shape(args[1]), _shape(args[2])
            kw = dict(node.kwargs)
            mask = args[3] if args[3] is not None else kw.get("attn_mask")
            causal = kw.get("is_causal", args[5] if args[5] is not None else False)
            s = {"batch": q[0] if len(q) == 4 else None, "heads": q[-3] if len(q) == 4 else q[0],
                 "kv_heads": k[-3] if len(k) == 4 else k[0], "seq_q": q[-2], "seq_kv": k[-2],
                 "head_dim": q[-1], "head_dim_v": v[-1], "is_causal": bool(causal),
                 "mask": list(_shape(mask)) if mask is not None else None,
                 "scale": kw.get("scale"), "enable_gqa": bool(kw.get("enable_gqa", False)),
                 "dropout_p": kw.get("dropout_p", args[4] or 0.0)}
            pairs = q[-2] * k[-2]
            if causal:
                pairs = sum(min(k[-2], i + 1) for i in range(q[-2]))
            return s, 2.0 * math.prod(q[:-2]) * pairs * (q[-1] + v[-1])
    except (TypeError, IndexError, ZeroDivisionError):
        pass
    return {"out": list(out) if out else None}, None


def _pytorch_op(kind: str, node, reason: str) -> dict:
    summary, flops = _summary(kind, node)
    return {"kind": kind, "target": str(node.target), "args": [_arg(a) for a in node.args],
            "kwargs": {k: _arg(v) for k, v in node.kwargs.items()},
            "out": _arg(node), "shape": summary, "flops": flops, "reason": reason}


# ------------------------------------------------------------------ one model

def _problem_dict(region) -> dict:
    d = dataclasses.asdict(region.problem)
    if region_kind(region) == "conv2d":
        d["p"], d["q"] = region.problem.p, region.problem.q
    return d


def collect(name: str) -> tuple:
    """(model record, {kind: [entry, ...]}) for one model; entries carry "count"."""
    batch, seq = DEFAULT_SIZES.get(name, (8, 128))
    model, inputs = load_model(name, DTYPE, batch, seq)
    t0 = time.perf_counter()
    cap = capture(model, inputs)
    t1 = time.perf_counter()
    gm = cap.graph_module
    part = partition(gm, CompileOptions(arch=ARCH))
    t2 = time.perf_counter()
    nodes = {n.name: n for n in gm.graph.nodes}
    record = {"batch": batch, "seq": seq,
              "inputs": [_tensor(x) for x in inputs if isinstance(x, torch.Tensor)],
              "capture_s": round(t1 - t0, 1), "partition_s": round(t2 - t1, 1),
              "regions": {}, "fallbacks": {}, "pytorch_ops": {}, "problems": {},
              "gflop": {"offloaded": 0.0, "pytorch": 0.0}}
    found = {k: {} for k in (*REGION_KINDS, "pytorch")}
    in_region = set()

    for r in part.regions:
        kind = region_kind(r)
        record["regions"][kind] = record["regions"].get(kind, 0) + 1
        in_region.update(r.nodes)
        if kind not in REGION_KINDS:
            continue
        out_shape = _shape(nodes[r.output])
        flops = region_flops(r, out_shape)
        problem = _problem_dict(r)
        e = found[kind].setdefault(json.dumps(problem, sort_keys=True), {
            "problem": problem, "shape": describe(r, out_shape), "flops": flops,
            "count": 0, "forms": set()})
        e["count"] += 1
        e["forms"].add(r.form)
        record["gflop"]["offloaded"] += flops / 1e9
    fallen = set()
    for f in part.fallbacks:
        record["fallbacks"][f.op] = record["fallbacks"].get(f.op, 0) + 1
        kind = FALLBACK_KIND.get(f.op) or UNANCHORED.get(nodes[f.node].target)
        if kind is None:
            continue
        fallen.add(f.node)
        entry = _pytorch_op(kind, nodes[f.node], f.reason)
        if f.op == "softmax_attention":   # the anchor is the softmax; q @ k^T and p @ v
            entry["reason"] += " (its matmuls are listed as GEMMs, offloaded or not)"
        _add_pytorch(found, record, entry)
    for n in gm.graph.nodes:
        kind = UNANCHORED.get(n.target) if n.op == "call_function" else None
        if kind is None or n.name in in_region or n.name in fallen:
            continue
        reason = f"no partitioner anchor for {n.target} (not listed as a fallback)"
        _add_pytorch(found, record, _pytorch_op(kind, n, reason))
    for kind in REGION_KINDS:
        regions = sum(e["count"] for e in found[kind].values())
        record["problems"][kind] = [regions, len(found[kind])]
    record["gflop"] = {k: round(v, 3) for k, v in record["gflop"].items()}
    entries = {kind: [{**e, "forms": sorted(e["forms"])} if "forms" in e else e
                      for e in found[kind].values()] for kind in found}
    del model, inputs, cap, gm, part
    gc.collect()
    return record, entries


def _add_pytorch(found, record, entry):
    key = json.dumps({k: entry[k] for k in ("kind", "target", "args", "kwargs", "reason")},
                     sort_keys=True)
    e = found["pytorch"].setdefault(key, {**entry, "count": 0})
    e["count"] += 1
    record["pytorch_ops"][entry["kind"]] = record["pytorch_ops"].get(entry["kind"], 0) + 1
    record["gflop"]["pytorch"] += (entry["flops"] or 0.0) / 1e9


# ------------------------------------------------------------------ the file

def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def load_corpus(path: Path) -> dict:
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("schema_version") == SCHEMA_VERSION:
            return data
        print(f"{path}: schema {data.get('schema_version')} != {SCHEMA_VERSION}: starting over")
    return {"schema_version": SCHEMA_VERSION, "models": {},
            **{k: [] for k in (*REGION_KINDS, "pytorch")}}


def _entry_key(kind: str, e: dict) -> str:
    if kind == "pytorch":
        return json.dumps({k: e[k] for k in ("kind", "target", "args", "kwargs", "reason")},
                          sort_keys=True)
    return json.dumps(e["problem"], sort_keys=True)


def merge(corpus: dict, name: str, entries: dict) -> None:
    """Replace ``name``'s counts in the distinct tables with ``entries``' (entries that
    no model counts any more are dropped); ids renumbered in table order."""
    for kind in (*REGION_KINDS, "pytorch"):
        table = {}
        for e in corpus.get(kind, []):
            e["counts"].pop(name, None)
            e.get("forms", {}).pop(name, None)
            if e["counts"]:
                table[_entry_key(kind, e)] = e
        for new in entries.get(kind, []):
            key = _entry_key(kind, new)
            e = table.get(key)
            if e is None:
                e = {k: v for k, v in new.items() if k not in ("count", "forms")}
                e["counts"] = {}
                if kind != "pytorch":
                    e["forms"] = {}
                table[key] = e
            e["counts"][name] = new["count"]
            if kind != "pytorch":
                e["forms"][name] = new["forms"]
        rows = sorted(table.values(), key=lambda e: -(e.get("flops") or 0.0))
        for i, e in enumerate(rows):
            e.pop("id", None)
            rows[i] = {"id": f"{kind}-{i}", **e}
        corpus[kind] = rows


def drop_model(corpus: dict, name: str) -> None:
    merge(corpus, name, {})


def write(corpus: dict, path: Path, vers: dict) -> None:
    corpus["created"] = _today()
    corpus["versions"] = vers
    corpus["options"] = {"dtype": DTYPE, "arch": ARCH}
    order = ("schema_version", "created", "versions", "options", "models",
             *REGION_KINDS, "pytorch")
    data = {k: corpus[k] for k in order if k in corpus}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(_dumps(data))
    os.chmod(tmp, 0o644)                     # mkstemp's 0600 is for secrets
    os.replace(tmp, path)


def _dumps(data: dict) -> str:
    """JSON with one model / one table entry per line (readable diffs)."""
    parts = []
    for k, v in data.items():
        if k == "models":
            body = ",\n".join(f"  {json.dumps(n)}: {json.dumps(m)}" for n, m in v.items())
            parts.append(f' "models": {{\n{body}\n }}')
        elif k in (*REGION_KINDS, "pytorch"):
            body = ",\n".join(f"  {json.dumps(e)}" for e in v)
            parts.append(f" {json.dumps(k)}: [\n{body}\n ]" if v else f" {json.dumps(k)}: []")
        else:
            parts.append(f" {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


# ------------------------------------------------------------------ summary

def summary_table(corpus: dict) -> str:
    head = ("model", "gemm", "conv2d", "attention", "PyTorch gemm/conv/attn",
            "GFLOP ours / PyTorch", "capture s")
    rows = [head]
    for name, m in corpus["models"].items():
        if m.get("status") != "ok":
            rows.append((name, f"error: {m.get('error', '')[:40]}", "", "", "", "", ""))
            continue
        cells = [f"{m['problems'][k][0]} ({m['problems'][k][1]})" for k in REGION_KINDS]
        ops = "/".join(str(m["pytorch_ops"].get(k, 0)) for k in ("gemm", "conv", "attention"))
        distinct = len([e for e in corpus["pytorch"] if name in e["counts"]])
        rows.append((name, *cells, f"{ops} ({distinct})",
                     f"{m['gflop']['offloaded']:.1f} / {m['gflop']['pytorch']:.1f}",
                     f"{m['capture_s']:.0f}"))
    rows.append(("distinct, all models", *[str(len(corpus[k])) for k in REGION_KINDS],
                 str(len(corpus["pytorch"])), "", ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n(regions (distinct problems) per kind; PyTorch: ops left " \
                              "there (distinct); GFLOP per forward)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                    help="built-in names (default: the nine)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true", help="capture models already in the file again")
    a = ap.parse_args(argv)
    vers = versions()
    corpus = load_corpus(a.out)
    failed = []
    for name in a.models:
        key = model_key(name, vers)
        old = corpus["models"].get(name)
        if not a.force and old and old.get("status") == "ok" and old.get("key") == key:
            print(f"{name}: in {a.out} already (same key), kept")
            continue
        print(f"{name}: capturing ...", flush=True)
        t0 = time.perf_counter()
        try:
            record, entries = collect(name)
        except Exception as e:            # recorded; the other models go on
            failed.append(name)
            print(f"{name}: FAILED: {type(e).__name__}: {e}", flush=True)
            if old and old.get("status") == "ok":
                # a refresh that fails (a package missing here) loses nothing: the
                # model's earlier record and problems stay, marked with the failure
                old["refresh_error"] = f"{_today()}: {type(e).__name__}: {e}"
                print(f"{name}: kept its record of {old.get('created')}", flush=True)
            else:
                drop_model(corpus, name)
                corpus["models"][name] = {"status": "error", "error": f"{type(e).__name__}: {e}",
                                          "key": key, "created": _today(), "versions": vers}
            write(corpus, a.out, vers)
            continue
        merge(corpus, name, entries)
        corpus["models"][name] = {"status": "ok", "key": key, "created": _today(),
                                  "versions": vers, **record}
        write(corpus, a.out, vers)
        print(f"{name}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    print(summary_table(corpus))
    print(f"wrote {a.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
