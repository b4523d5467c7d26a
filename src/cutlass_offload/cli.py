"""cutlass-offload: compile a model's GEMMs, convs, attention and norms into one CUTLASS
library, run it, manage the cache."""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys
import time
from pathlib import Path

import torch

from .errors import CaptureError, CutlassOffloadError


def _folder(text: str) -> str:
    """argparse type of --out: a path, not the empty string (which would name '.')."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: name the output folder")
    return text


def _cmd_compile(a) -> int:
    if a.dry_run:
        return _dry_run(a)
    from .api import check_out_dir, resolve_arch
    from .api import compile as co_compile
    from .models import load_model
    check_out_dir(a.out)            # before building the model (sd-unet, llama take a while)
    resolve_arch(a.arch)            # the same: an unknown --arch, or none without a GPU
    t0 = time.perf_counter()
    notes = []
    model, inputs = load_model(a.model, a.dtype, a.batch, a.seq, notes=notes)
    t_model = time.perf_counter() - t0
    for line in notes:
        print(f"note: {line}", file=sys.stderr)
    if a.quiet:
        os.environ["CUTLASS_OFFLOAD_PROGRESS"] = "off"
    compiled = co_compile(model, inputs, arch=a.arch, allow_tf32=a.tf32, dynamic_batch=a.dynamic_batch,
                          out_dir=a.out, strict=a.strict, build_strategy=a.build,
                          executor=a.executor, ray_address=a.ray_address, tune=a.tune,
                          glue=a.glue, mode=a.mode, offload_norms=a.norms,
                          combine_gemms=a.combine_gemms, jobs=a.jobs or None,
                          phases_before={"model": t_model},
                          decompose_wide_attention=a.decompose_wide_attention)
    print(compiled.report)
    print(f"wrote {a.out}")
    return 0


def _dry_run(a) -> int:
    """compile --dry-run: dry_run.explain's report and build preview; nothing built
    or written (but --json's file)."""
    from .api import resolve_arch
    from .dry_run import explain
    from .models import load_model
    resolve_arch(a.arch)            # before building the model
    notes = []
    t0 = time.perf_counter()
    model, inputs = load_model(a.model, a.dtype, a.batch, a.seq, notes=notes)
    t_model = time.perf_counter() - t0
    ignored = [flag for flag, given in (("--out", a.out), ("--tune", a.tune),
                                        ("--executor ray", a.executor != "local")) if given]
    for line in notes + ([f"a dry run builds nothing: {', '.join(ignored)} not used"] if ignored else []):
        print(f"note: {line}", file=sys.stderr)
    dry = explain(model, inputs, arch=a.arch, allow_tf32=a.tf32, dynamic_batch=a.dynamic_batch,
                  strict=a.strict, build_strategy=a.build, glue=a.glue, mode=a.mode,
                  offload_norms=a.norms, combine_gemms=a.combine_gemms, jobs=a.jobs or None,
                  decompose_wide_attention=a.decompose_wide_attention)
    dry.report.phases = {"model": t_model, **dry.report.phases}     # as compile's line starts
    print(dry)
    if a.json:
        Path(a.json).write_text(json.dumps(dry.to_dict(), indent=1) + "\n")
    return 0


def _rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _bench(fn, iters=50, warmup=10) -> float:
    """Median latency in ms, timed with CUDA events (triton's do_bench when present)."""
    try:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))
    except ImportError:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); fn(); e.record(); e.synchronize()
            times.append(s.elapsed_time(e))
        return sorted(times)[len(times) // 2]


def _graph_bench(fn):
    """Median latency in ms of ``fn`` captured once into a CUDA graph and replayed
    (launch overhead removed); None when the graph cannot be captured."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    except RuntimeError as e:
        print(f"  (CUDA graph capture failed: {str(e).splitlines()[0]})")
        return None
    return _bench(g.replay)


def _cmd_run(a) -> int:
    from .api import check_folder, load
    from .errors import DeviceError
    from .folder import read_manifest
    from .runtime.library import check_device
    # the arch is all that is needed first: load checks every file before it uses it
    # (weights.bin beside the program's load), so checking them here too would hash
    # twice. Without a GPU for it, a damaged folder is named before that error.
    try:
        check_device(read_manifest(a.dir)["options"]["arch"])
    except DeviceError:
        check_folder(a.dir)
        raise
    compiled, reference, inputs = load(a.dir, device="cuda", glue=a.glue, mode=a.mode)
    compiled.verify(a.verify)
    glue = compiled.inductor
    with torch.no_grad():
        ref = reference(*inputs)
        t0 = time.perf_counter()
        out = compiled(*inputs)      # Inductor glue: compiled here (its caches may serve it)
        torch.cuda.synchronize()
        first_call_s = time.perf_counter() - t0
        conversions = compiled.layout_conversions()     # after exactly one forward
        refs = ref if isinstance(ref, (tuple, list)) else (ref,)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        errs = [_rel_err(o, r) for o, r in zip(outs, refs)]
        t_ref = _bench(lambda: reference(*inputs))
        t_co = _bench(lambda: compiled(*inputs))
        g_ref = _graph_bench(lambda: reference(*inputs))
        # Inductor's CUDA graphs (reduce-overhead) cannot be captured again: t_co is that time
        in_graphs = glue is not None and compiled.glue == "inductor" and glue.cuda_graphs
        g_co = None if in_graphs else _graph_bench(lambda: compiled(*inputs))
    regions = compiled.region_modules()
    fallback_calls = sum(m.fallback_calls for m in regions)
    for m in regions:
        if m.disabled:
            print(f"  {m.region.name} runs in PyTorch: {m.disabled}")
    result = {"relative_error": errs, "pytorch_ms": t_ref, "cutlass_offload_ms": t_co,
              "pytorch_cuda_graph_ms": g_ref, "cutlass_offload_cuda_graph_ms": g_co,
              "regions": len(regions), "kernel_calls_fell_back": fallback_calls,
              "regions_by_op": dict(collections.Counter(m.region.form for m in regions)),
              "layout_conversions_per_forward": conversions,
              "glue": compiled.glue, "mode": glue.mode if glue is not None else None,
              "first_call_s": first_call_s,
              "gpu": torch.cuda.get_device_name()}
    by_op = ", ".join(f"{k} {v}" for k, v in sorted(result["regions_by_op"].items()))
    print(f"GPU {result['gpu']}: {len(regions)} offloaded regions ({by_op}), "
          f"{fallback_calls} region calls fell back to PyTorch")
    glue_line = f"glue: {compiled.glue}"
    if compiled.glue == "inductor":
        glue_line += (f" (mode {glue.mode or 'default'}; compiled on the first call: "
                      f"{first_call_s:.1f} s)")
    elif glue is not None and glue.failed:
        glue_line += f" (Inductor failed: {glue.failed})"
    print(glue_line)
    if {"conv2d", "group_norm"} & set(result["regions_by_op"]):
        print(f"NCHW -> NHWC layout conversions left per forward: {conversions}")
    print("relative error vs PyTorch: " + ", ".join(f"{e:.3e}" for e in errs))
    print(f"median latency: PyTorch eager {t_ref:.3f} ms, cutlass_offload {t_co:.3f} ms "
          f"(speedup {t_ref / t_co:.2f}x)" + (" (in Inductor's CUDA graphs)" if in_graphs else ""))
    if g_ref and g_co:
        print(f"median latency in a CUDA graph: PyTorch {g_ref:.3f} ms, cutlass_offload {g_co:.3f} ms "
              f"(speedup {g_ref / g_co:.2f}x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    bad = [e for e in errs if not e < a.tolerance]
    return 1 if bad else 0


def _positive_int(text: str) -> int:
    """argparse type of the count flags (--batch, --seq, --jobs): an integer >= 1, so
    that 0 or a negative count is one argparse error line naming the flag (exit 2)
    instead of a traceback or a silent default."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (1 or more), not {value}")
    return value


def _positive_float(text: str) -> float:
    """argparse type of --tolerance: a finite number > 0 (a relative error bound)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
    return value


_DTYPES = {"fp16": "f16", "bf16": "bf16"}


def _cmd_prebuild(a) -> int:
    from .api import resolve_arch
    from .build.executor import make_executor
    from .prebuild import prebuild, prebuild_kernels
    arch = resolve_arch(a.arch)
    bad = [d for d in a.dtype.split(",") if d not in _DTYPES]
    if bad:
        raise ValueError(f"unknown dtype {bad[0]!r}: prebuild takes {', '.join(_DTYPES)}")
    dtypes = [_DTYPES[d] for d in a.dtype.split(",")]
    if (a.batch or a.seq) and not a.models:
        raise ValueError("--batch / --seq size the models of --models; without it there are none")
    plan, skipped = None, {}
    if a.models:
        from .prebuild import model_plan
        # a model whose package is missing here is named and left out; the rest build
        plan = model_plan([m for m in a.models.split(",") if m], arch, dtypes, skipped=skipped,
                          progress=None if a.quiet else (lambda line: print(line, file=sys.stderr)),
                          batch=a.batch, seq=a.seq)
        for name, why in skipped.items():
            print(f"prebuild: skipped model {name}: {why}", file=sys.stderr)
        kernels = []
    else:
        kernels = prebuild_kernels(arch, dtypes, [t for t in a.epilogues.split(",") if t],
                                   [x for x in a.layouts.split(",") if x])
    if a.attention:
        if arch != "sm90a":
            raise ValueError(f"--attention: the Hopper attention kernels are sm_90a only, not {arch}")
        from .prebuild import chosen_attention_kernels
        kernels += chosen_attention_kernels(dtypes)
    if a.convs:
        if arch != "sm90a":
            raise ValueError(f"--convs: the TMA conv kernels are sm_90a only, not {arch}")
        from .prebuild import chosen_conv_kernels
        kernels += chosen_conv_kernels(dtypes)
    listed = list({k.name: k for k in (plan.kernels if plan is not None else ()) + tuple(kernels)}.values())
    if a.list:
        for k in listed:
            print(k.name)
        print(f"{len(listed)} kernels")
        return 1 if skipped else 0
    if a.quiet:
        os.environ["CUTLASS_OFFLOAD_PROGRESS"] = "off"
    t0 = time.perf_counter()
    res = prebuild(arch, kernels, executor=make_executor(a.executor, a.ray_address), plan=plan,
                   jobs=a.jobs or None)
    info = res.to_dict()
    units = info.get("units", [])
    hits = sum(1 for u in units if u.get("cache_hit"))
    failed = [u["name"] for u in units if not u.get("ok", True)]
    print(f"prebuilt {len(listed)} kernels for {arch} in {time.perf_counter() - t0:.1f} s: "
          f"{len(units)} units ({hits} already cached)" + (f"; failed: {', '.join(failed)}" if failed else "")
          + (f"; models skipped: {', '.join(skipped)}" if skipped else ""))
    return 1 if failed or skipped else 0


def _cmd_cache(a) -> int:
    from .build import cache_transfer
    from .build.cache import BuildCache
    cache = BuildCache()
    if a.action in ("export", "import") and not a.file:
        raise ValueError(f"cache {a.action} needs a FILE (.tar, .tar.gz, .tgz, .tar.xz, .tar.bz2)")
    if a.action in ("info", "clear") and a.file:
        raise ValueError(f"cache {a.action} takes no FILE (the cache is CUTLASS_OFFLOAD_CACHE_DIR, "
                         f"or its default); got {a.file!r}")
    if a.action == "clear":
        removed = cache.clear()
        left = cache.root.is_dir()
        print(f"cleared {cache.root}: removed {', '.join(p.name for p in removed) or 'nothing'}"
              + (" (other files there were left alone)" if left and any(cache.root.iterdir()) else ""))
    elif a.action == "export":
        print(cache_transfer.export(a.file, cache).line("exported", a.file))
    elif a.action == "import":
        print(cache_transfer.import_(a.file, cache).line("imported", a.file))
    else:
        i = cache.info()
        print(f"build cache {i['root']}: {i['compiled_units']} compiled units, {i['libraries']} "
              f"linked libraries, {i['failed']} failed units, {i['index_records']} kernel index "
              f"records; {i['disk_bytes'] / 2**20:.1f} MiB on disk (tuning and the C++ call "
              "path's builds included)")
        if i["kept_failures"]:
            print(f"  {i['kept_failures']} interrupted or toolchain-failed builds kept in "
                  f"{cache.root / 'failed'} (source and log; not cached: the next build tries again)")
    return 0


EXECUTOR_HELP = ("who compiles the shards: this machine (default) or a Ray cluster "
                 "(pip install 'cutlass_offload[ray]')")
RAY_ADDRESS_HELP = ("Ray cluster for --executor ray, as ray.init takes it (default: RAY_ADDRESS "
                    "or a local cluster)")
GLUE_HELP = ("how the ops that are not offloaded run: inductor (torch.compile's Inductor fuses them "
             "around the regions, which stay opaque custom ops), eager (one PyTorch kernel per op), "
             "auto (inductor when a GPU and Triton are present, else eager)")


def _glue_args(p, default, saved):
    p.add_argument("--glue", default=default, choices=["auto", "inductor", "eager"],
                   help=GLUE_HELP + (f"; default {default}" if default else "") + saved)
    p.add_argument("--mode", default=None,
                   choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                   help="torch.compile mode of the Inductor glue (reduce-overhead: Inductor's CUDA "
                        "graphs around the whole forward)" + saved)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: the message and where the usage is, not the
    usage block itself (13 lines for ``compile``) above it. Exit status 2 as before;
    the subcommands' parsers are of this class too (add_subparsers uses the parent's)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def main(argv=None) -> int:
    from .config import __doc__ as knobs_doc
    env = knobs_doc[knobs_doc.index("Environment variables:"):]
    p = _Parser(prog="cutlass-offload", description=__doc__, epilog=env,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__
    p.add_argument("--version", action="version", version=f"cutlass-offload {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{compile,run,prebuild,cache}")
    c = sub.add_parser("compile", help="offload a model's GEMMs, convs, attention and norms and build the library (no GPU needed)",
                       epilog="environment variables that change what is offloaded or how it builds "
                              "(CUTLASS_OFFLOAD_GROUPED_CONV, CUTLASS_OFFLOAD_PER_SAMPLE_ADD, ...): "
                              "see cutlass-offload --help")
    from .models import BUILTIN, DEFAULT_SIZES
    c.add_argument("model", help=", ".join(BUILTIN) + ", or package.module:factory (a function "
                   "returning (model, example_inputs))")
    c.add_argument("--out", default=None, type=_folder, help="output folder (required, unless --dry-run)")
    c.add_argument("--dry-run", action="store_true",
                   help="capture, partition and select only: print the report and the build's units, "
                        "each cached or to compile; no nvcc compile, no GPU with --arch, nothing written")
    c.add_argument("--json", default=None, metavar="FILE",
                   help="with --dry-run: also write the report and the build preview to FILE as JSON")
    c.add_argument("--arch", default=None, help="sm_90a (also sm_90, sm90a, sm90) or sm_80 (also "
                   "sm80, and sm_86 / sm_89: any 8.x GPU runs it) (default: the visible GPU)")
    c.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"],
                   help="the model's parameters and floating inputs are cast to it (default: fp16)")
    batches = "; ".join(f"{m}: {b}" for m, (b, q) in DEFAULT_SIZES.items())
    seqs = "; ".join(f"{m}: {q}" for m, (b, q) in DEFAULT_SIZES.items())
    c.add_argument("--batch", type=_positive_int, default=None,
                   help=f"default: 8 ({batches}); built-in models only")
    c.add_argument("--seq", type=_positive_int, default=None,
                   help=f"default: 128 ({seqs}); tokens, mel frames (whisper-encoder), image side "
                        "(resnet50, convnext-tiny, efficientnet-b0) or latent side (vae-decoder)")
    c.add_argument("--dynamic-batch", action="store_true", help="export with a dynamic batch dim")
    c.add_argument("--tf32", action="store_true", help="allow fp32 GEMMs and convs to run as TF32")
    c.add_argument("--strict", action="store_true", help="error instead of falling back")
    c.add_argument("--build", default="sharded", choices=["sharded", "single", "per-region"],
                   help="build strategy (default: sharded)")
    c.add_argument("--jobs", type=_positive_int, default=0, help="parallel nvcc processes (default: by cores and memory)")
    c.add_argument("--executor", default="local", choices=["local", "ray"], help=EXECUTOR_HELP)
    c.add_argument("--ray-address", default=None, help=RAY_ADDRESS_HELP)
    c.add_argument("-q", "--quiet", action="store_true",
                   help="no build progress (by default: a bar on a terminal, one line per "
                        "finished unit otherwise, on stderr)")
    c.add_argument("--tune", action="store_true",
                   help="profile a few candidate kernels per distinct GEMM problem on the visible GPU "
                        "and keep the fastest (remembered in the tuning cache)")
    _glue_args(c, default="auto", saved="")
    c.add_argument("--norms", default="auto", choices=["auto", "all", "group", "none"],
                   help="which norms become regions (auto: layer / RMS norms left to Inductor "
                        "when the glue is Inductor, which fuses them with their neighbours; else all)")
    c.add_argument("--no-combine-gemms", dest="combine_gemms", action="store_false",
                   help="keep sibling linears on one input (q / k / v projections) as GEMMs of "
                        "their own instead of one GEMM over their concatenated weights, and a gate "
                        "and an up linear as two GEMMs instead of one with a GLU epilogue")
    c.add_argument("--no-decompose-wide-attention", dest="decompose_wide_attention",
                   action="store_false",
                   help="keep an attention of head dim above 256 as one fused region instead of "
                        "two GEMMs and a softmax (partition/wide_attention.py)")
    c.set_defaults(fn=_cmd_compile)
    r = sub.add_parser("run", help="run a compiled folder on the GPU against PyTorch")
    r.add_argument("dir", help="an output folder written by compile (--out)")
    r.add_argument("--json", default=None, help="write the results here")
    r.add_argument("--tolerance", type=_positive_float, default=1e-2,
                   help="max relative error (exit 1 above; default 1e-2)")
    r.add_argument("--verify", action="store_true",
                   help="check each region against PyTorch on its first call; fall back where it disagrees")
    _glue_args(r, default=None, saved=" (default: the folder's, saved by compile)")
    r.set_defaults(fn=_cmd_run)
    from .prebuild import DEFAULT_EPILOGUES
    b = sub.add_parser("prebuild", help="compile the GEMM kernels (and with --attention / --convs the "
                                         "attention / conv kernels) a target's heuristic can choose "
                                         "into the cache, so later compiles build only their launchers")
    b.add_argument("--arch", default=None, help="sm_90a or sm_80 (default: the visible GPU)")
    b.add_argument("--dtype", default="fp16,bf16", help="comma-separated: fp16, bf16 (default: both)")
    b.add_argument("--epilogues", default=",".join(DEFAULT_EPILOGUES),
                   help="comma-separated epilogue tags (default: " + ",".join(DEFAULT_EPILOGUES) + ")")
    b.add_argument("--layouts", default="col", help="B layouts: col (a Linear weight; the default), row")
    b.add_argument("--attention", action="store_true",
                   help="sm_90a: also the Hopper attention kernels select can choose (the example's "
                        "configs and the learned table's, unmasked and causal)")
    b.add_argument("--convs", action="store_true",
                   help="sm_90a: also the TMA conv kernels select can choose (the rule's tiles and "
                        "the learned conv table's choices) for the common conv epilogues")
    b.add_argument("--models", default="",
                   help="comma-separated model names (built-ins or package.module:factory): "
                        "compile the kernels `compile MODEL` selects for them (every kind, every "
                        "norm offloaded) instead of the generic GEMM set; --attention / --convs "
                        "still add theirs")
    b.add_argument("--batch", type=_positive_int, default=None,
                   help="with --models: the built-in models' batch, as compile's (default: theirs)")
    b.add_argument("--seq", type=_positive_int, default=None,
                   help="with --models: the built-in models' --seq, as compile's (default: theirs)")
    b.add_argument("--list", action="store_true", help="print the kernels and build nothing")
    b.add_argument("--jobs", type=_positive_int, default=0,
                   help="parallel nvcc processes (default: by cores and memory)")
    b.add_argument("--executor", default="local", choices=["local", "ray"], help=EXECUTOR_HELP)
    b.add_argument("--ray-address", default=None, help=RAY_ADDRESS_HELP)
    b.add_argument("-q", "--quiet", action="store_true", help="no build progress")
    b.set_defaults(fn=_cmd_prebuild)
    k = sub.add_parser("cache", help="inspect, clear, export or import the build cache",
                       description="info: where the cache is and its size; clear: remove the folders "
                       "the cache writes there (other files stay); "
                       "export FILE: pack its compiled units and kernel index into a tar file "
                       "(.tar, .tar.gz, .tgz, .tar.xz, .tar.bz2) for a machine that shares no "
                       "cache folder (linked libraries are not carried: relinked in a moment); "
                       "import FILE: publish such a file's units into this cache "
                       "(build/cache_transfer.py)")
    k.add_argument("action", choices=["info", "clear", "export", "import"])
    k.add_argument("file", nargs="?", default=None, help="the tar file of export / import")
    k.set_defaults(fn=_cmd_cache)
    a = p.parse_args(argv)
    if a.cmd == "compile" and not a.dry_run and (a.out is None or a.json):
        c.error("--json goes with --dry-run (a compile's folder holds report.json)" if a.json
                else "the following arguments are required: --out (or --dry-run)")
    from .config import knobs
    try:
        cache = knobs().cache_dir   # every variable checked before any work, and before -q sets one
        if cache.exists() and not cache.is_dir():
            raise CutlassOffloadError(f"the build cache {cache} (CUTLASS_OFFLOAD_CACHE_DIR, or its "
                                      "default) is a file, not a folder")
        return a.fn(a)
    except CaptureError as e:
        # torch.export's message runs to dozens of lines (hints, links, the failing
        # frame); its first line names the problem
        first = str(e).splitlines()[0]
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(\S[^\n]*)', str(e))
        if not frames and e.__cause__ is not None:
            # the model's own error (not an export refusal): its traceback's last frame
            # outside torch and this package is the user's line
            import traceback
            frames = [(f.filename, f.lineno, f.name, f.line or "")
                      for f in traceback.extract_tb(e.__cause__.__traceback__)
                      if f"{os.sep}torch{os.sep}" not in f.filename
                      and f"{os.sep}cutlass_offload{os.sep}" not in f.filename]
        where = (f"at {Path(frames[-1][0]).name}:{frames[-1][1]} in {frames[-1][2]}: "
                 f"{frames[-1][3].strip()}; " if frames else "")
        print(f"error: {first} ({where}torch.export's whole message: co.compile from Python "
              "raises CaptureError with it as its __cause__)", file=sys.stderr)
        return 2
    except (CutlassOffloadError, ValueError, ImportError) as e:   # one clear line for the user
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        # a path the user gave or set (--out, CUTLASS_OFFLOAD_CACHE_DIR) that cannot be
        # written: a file where a folder should be, no permission, a read-only mount
        if e.filename is None:
            raise
        where = (" (in the build cache: CUTLASS_OFFLOAD_CACHE_DIR, or its default)"
                 if str(e.filename).startswith(str(knobs().cache_dir)) else "")
        print(f"error: cannot use {e.filename}{where}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # outputs and cache entries are published whole or not at all (folder.py,
        # build/cache.py); units that finished before the interrupt stay cached
        print("interrupted: the output folder is as it was before this command; the kernel "
              "cache holds only the units that finished compiling", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
