"""All knobs in one place. Nothing else in the package reads ``os.environ``.

Environment variables:
  (read strictly: an on / off variable takes 1 / on / yes / true or 0 / off / no / false,
  empty being off; a count, a whole number >= 0; any other value is an error naming
  the variable and its value: ValueError from the Python API, one line and exit 2
  from the CLI)
  CUTLASS_OFFLOAD_CACHE_DIR  build cache root (default: $XDG_CACHE_HOME/cutlass_offload
                             or ~/.cache/cutlass_offload)
  CUTLASS_OFFLOAD_NVCC       explicit path to nvcc (an error if it is not an executable)
  CUDA_HOME / CUDA_PATH      CUDA toolkit root (nvcc looked up in its bin/)
  CUTLASS_OFFLOAD_NVCC_THREADS  nvcc's -t for every compile (default: -t0, one per core,
                             for the single strategy's one nvcc; for shards, the cores
                             divided by the CUTLASS units compiling at once)
  CUTLASS_OFFLOAD_VERBOSE    1 prints each compile command
  CUTLASS_OFFLOAD_PROGRESS   build progress on stderr: auto (a bar on a terminal, one line
                             per finished unit otherwise; the default), bar, lines, or off
                             (the CLI's -q)
  CUTLASS_OFFLOAD_JOBS       parallel nvcc processes (default: cores, capped by memory)
  CUTLASS_OFFLOAD_NVCC_STEPS default 1: nvcc's steps of a unit run as a graph, cudafe++
                             beside cicc (build/nvcc_steps.py; local builds); 0: one nvcc
                             command per unit
  CUTLASS_OFFLOAD_GROUPED_CONV  default 1: grouped convs (channel groups: 1 < groups, not
                             depthwise) run CUTLASS 2.x grouped fprop kernels where
                             families/grouped_conv.py takes them; 0 keeps them all in PyTorch
                             (read at compile; a saved folder keeps its value)
  CUTLASS_OFFLOAD_PER_SAMPLE_ADD  default 0: 1 fuses a conv's add of a per-sample
                             (N, K, 1, 1) tensor (the UNet's time embedding) into the sm_90a
                             TMA conv's epilogue (emit/templates/per_sample_broadcast.h); off:
                             correct on the GPU but slower in sd-unet (session 35; read at
                             compile; a saved folder keeps it)
  CUTLASS_OFFLOAD_STAGED_EPILOGUE  default 0 (also off / no / false): 1 (also tma / on /
                             yes / true) compiles the sm_90a GEMMs', convs' and GLUs'
                             epilogues as plain class templates that stage their output in
                             shared memory (emit/staged.py and the GLU with TMA stores; the
                             Hopper attention stores O that way whatever it says, since
                             session 42): about 0.6x the cold build time and half its peak
                             nvcc memory; experimental: its
                             GEMMs correct on an H100 at 0.83x the TMA epilogue's speed
                             (session 41); rows: the GEMMs' and convs'
                             row-store form instead (an earlier version of it was correct on
                             an H100 at 0.87x the TMA epilogue's speed, session 38; the
                             current one has not run). Read at each sm_90a kernel's emission
                             (staged_epilogue()); the kernels' source, so the cache, differs;
                             a compile's report (report.json in a saved folder) names it
  CUTLASS_OFFLOAD_HOST_LAUNCHERS  0 compiles the launchers with nvcc, not the host C++
                             compiler (default 1 when nvcc's CUDA headers are found)
  CUTLASS_OFFLOAD_LINEINFO   1 compiles kernels with -lineinfo (CUDA source lines in
                             Nsight Compute; about 8% more cicc time); part of the cache key
  CUTLASS_OFFLOAD_FAST_CALL  0 turns off the C++ call path of offloaded regions
                             (runtime/fast_call.py); every call then maps in Python
  CXX                        the host C++ compiler that builds that path (default c++)
  CUTLASS_OFFLOAD_CPP_WRAPPER  1 / 0 (off, no, false): co.compile / load's default-mode
                             Inductor glue on CUDA compiled with Inductor's C++ wrapper or
                             not (unset: runtime/glue.py CPP_WRAPPER_IN_DEFAULT_MODE, on;
                             with it cpp_wrapper_build_separate: the wrapper at -O0);
                             a caller's cpp_wrapper option wins; the torch.compile backend
                             takes the caller's options only
  CUTLASS_OFFLOAD_C_SHIMS    1 / 0 (off, no, false): that C++ wrapper calls the region ops
                             through their C shims, not the dispatcher (unset:
                             runtime/glue.py REGION_C_SHIMS, on); read
                             when the glue compiles, not saved in a folder
"""
from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Knobs:
    cache_dir: Path
    nvcc: str | None
    cuda_home: str | None
    nvcc_threads: int
    verbose: bool
    progress: str
    jobs: int
    fast_call: bool
    cxx: str
    host_launchers: bool
    nvcc_steps: bool
    lineinfo: bool
    grouped_conv: bool = True
    per_sample_add: bool = False
    cpp_wrapper: bool | None = None       # None: glue.CPP_WRAPPER_IN_DEFAULT_MODE
    c_shims: bool | None = None           # None: glue.REGION_C_SHIMS


def knobs() -> Knobs:
    """Read the environment now (not at import time, so tests can change it)."""
    env = os.environ
    cache = env.get("CUTLASS_OFFLOAD_CACHE_DIR")
    if not cache:
        base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        cache = os.path.join(base, "cutlass_offload")
    return Knobs(
        cache_dir=Path(cache),
        nvcc=env.get("CUTLASS_OFFLOAD_NVCC") or None,
        cuda_home=env.get("CUDA_HOME") or env.get("CUDA_PATH") or None,
        nvcc_threads=_count(env, "CUTLASS_OFFLOAD_NVCC_THREADS"),
        verbose=_flag(env, "CUTLASS_OFFLOAD_VERBOSE", False),
        progress=_progress(env.get("CUTLASS_OFFLOAD_PROGRESS", "auto")),
        jobs=_count(env, "CUTLASS_OFFLOAD_JOBS"),
        fast_call=_flag(env, "CUTLASS_OFFLOAD_FAST_CALL", True),
        cxx=env.get("CXX") or "c++",
        host_launchers=_flag(env, "CUTLASS_OFFLOAD_HOST_LAUNCHERS", True),
        nvcc_steps=_flag(env, "CUTLASS_OFFLOAD_NVCC_STEPS", True),
        lineinfo=_flag(env, "CUTLASS_OFFLOAD_LINEINFO", False),
        cpp_wrapper=_tristate(env.get("CUTLASS_OFFLOAD_CPP_WRAPPER", ""), "CUTLASS_OFFLOAD_CPP_WRAPPER"),
        c_shims=_tristate(env.get("CUTLASS_OFFLOAD_C_SHIMS", ""), "CUTLASS_OFFLOAD_C_SHIMS"),
        grouped_conv=_flag(env, "CUTLASS_OFFLOAD_GROUPED_CONV", True),
        per_sample_add=_flag(env, "CUTLASS_OFFLOAD_PER_SAMPLE_ADD", False),
    )


_OFF = ("0", "off", "no", "false")
_ON = ("1", "on", "yes", "true")


def _flag(env, name: str, default: bool) -> bool:
    """An on / off variable: unset gives ``default``; empty or 0 / off / no / false,
    False; 1 / on / yes / true, True. Raises ValueError naming the variable otherwise
    (a typo must not silently pick one side)."""
    if name not in env:
        return default
    return bool(_tristate(env[name], name))


def _count(env, name: str) -> int:
    """A count variable (0 or unset: the default). Raises ValueError naming it unless
    it is a whole number >= 0."""
    raw = env.get(name, "").strip() or "0"
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"{name}={env[name]!r}: use a whole number >= 0 (0: the default)")
    return int(raw)


def staged_epilogue() -> str | None:
    """``$CUTLASS_OFFLOAD_STAGED_EPILOGUE`` read now: None (unset, 0, off, no, false),
    "tma" (1, on, yes, true, tma) or "rows". Read only where an sm_90a kernel is emitted
    (emit/staged.form), not by ``knobs()``, so a bad value stops a compile that would use
    it, not every command. Raises ValueError naming the variable and its value."""
    env = os.environ
    raw = env.get("CUTLASS_OFFLOAD_STAGED_EPILOGUE", "")
    value = raw.strip().lower()
    if value in ("",) + _OFF:
        return None
    if value in _ON + ("tma",):
        return "tma"
    if value == "rows":
        return "rows"
    raise ValueError(f"CUTLASS_OFFLOAD_STAGED_EPILOGUE={raw!r}: use 0 (off), 1 / tma, or rows")


def _tristate(value: str, name: str = "value") -> bool | None:
    """None for unset / empty, False for 0 / off / no / false, True for 1 / on / yes /
    true; ValueError naming ``name`` otherwise."""
    raw, value = value, (value or "").strip().lower()
    if not value:
        return None
    if value in _OFF or value in _ON:
        return value in _ON
    raise ValueError(f"{name}={raw!r}: use 1 / on / yes / true or 0 / off / no / false")


def _progress(value: str) -> str:
    """CUTLASS_OFFLOAD_PROGRESS: auto, bar, lines or off (also 0 / none / quiet / no /
    false); ValueError naming the variable otherwise."""
    raw, value = value, (value or "auto").strip().lower()
    if value in ("0", "off", "none", "quiet", "no", "false"):
        return "off"
    if value in ("auto", "bar", "lines"):
        return value
    raise ValueError(f"CUTLASS_OFFLOAD_PROGRESS={raw!r}: use auto, bar, lines or off")


@dataclass(frozen=True)
class CompileOptions:
    """User-facing options of one compile.

    arch: "sm90a" (CUTLASS 3.x TMA warp-specialized, H100/H200) or "sm80" (2.x), or an
      alias of one ("sm_90a", "sm_80", ...: target.py); None = from the visible GPU,
      else an error when no GPU is visible. Another name raises ValueError.
    allow_tf32: let fp32 GEMMs run as TF32 (10-bit mantissa inputs).
    strict: a region that falls back raises instead.
    num_sms: SM count used by tile selection (132 on H100/H200 SXM, 108 on A100).
    build_strategy: "sharded" (balanced parallel shards, cached per shard; the
      default), "single" (one translation unit, one nvcc) or "per-region" (one module
      per region compiled one after another: the old TVM way).
    executor: who compiles the objects (build/executor.py): "local" (this machine,
      the default) or "ray" (each shard a Ray task; needs the ``ray`` extra).
    ray_address: the Ray cluster for executor "ray", as ``ray.init`` takes it
      ("HOST:PORT", "auto", "ray://HOST:10001"); None = RAY_ADDRESS or a local one.
    jobs: parallel nvcc processes of the build; None = ``CUTLASS_OFFLOAD_JOBS`` or
      this machine's cores, capped by memory (build/shards.job_slots). At least 1.
    tune: profile candidate kernels and launch knobs per distinct GEMM problem on the
      visible GPU and keep the fastest (tune/: the sm90 search space, or four 2.x
      configs; results kept in the tuning cache under cache_dir/tuning, so a second
      compile profiles nothing).
    pytorch_when_faster: GEMM, conv2d and attention problems that PyTorch's own
      kernels (cuBLAS, cuDNN, SDPA) were measured to run faster on this target stay
      in PyTorch, with the times as the reason (select/pytorch_faster.py). Not with
      ``strict``.
    offload_norms: which norms become regions: "all", "group" (group norms only:
      layer / RMS norms stay in the graph), "none", or "auto": "group" with
      Inductor glue (Inductor fuses a layer / RMS norm with the residual add and
      casts around it, which an opaque region op prevents: measured on the H200 in
      reduce-overhead, bert-base 1.26 -> 0.95 ms, convnext-tiny 2.54 -> 2.36 ms;
      its group norm is not measured yet, so ours stays), "all" with eager glue
      or ``strict``. Resolved by ``options_for_glue`` before partitioning; a norm left
      to the glue is listed as kept with the reason.
    glue: what runs the graph around the regions, "eager" or "inductor" (set by
      ``options_for_glue`` from the compile's glue): measured-faster entries that hold
      only when Inductor compiles PyTorch's side (it pads a misaligned GEMM's
      output, for one) apply with "inductor" alone.
    combine_gemms: sibling linears on one input (attention's q / k / v projections)
      with nothing fused but a bias run as one GEMM over their concatenated weights,
      each output a slice of its output (partition/parallel_gemm.py); on sm90a a gate
      and an up linear on one input multiplied after an activation (SwiGLU, GEGLU) run
      as one GEMM over their weights interleaved in blocks of 8 rows, whose GLU
      epilogue writes only the product (partition/gated_gemm.py). The combined and
      interleaved weights are copies made at compile time (and again at load).
    grouped_conv: grouped convs (channel groups, not depthwise) become regions where
      families/grouped_conv.py takes them; None = ``$CUTLASS_OFFLOAD_GROUPED_CONV``
      (default on). ``compile`` resolves it, so a saved folder keeps the value it was
      compiled with whatever the environment says at load.
    per_sample_add: a conv's add of a per-sample (N, K, 1, 1) tensor joins its region
      on sm90a (the TMA conv's epilogue reads row n of the (N, K) vector) where the
      conv's kernel is that TMA conv; None = ``$CUTLASS_OFFLOAD_PER_SAMPLE_ADD``
      (default off); resolved and saved like ``grouped_conv``.
    decompose_wide_attention: an attention of head dim above 256 (the SD VAE's 512)
      runs as two GEMM regions and a softmax in the glue instead of the fused sm80
      kernel, which keeps O in global memory at such head dims, where its scores
      take at most 1 GiB (partition/wide_attention.py).
    """

    arch: str | None = None
    allow_tf32: bool = False
    strict: bool = False
    num_sms: int | None = None
    build_strategy: str = "sharded"
    executor: str = "local"
    ray_address: str | None = None
    jobs: int | None = None
    tune: bool = False
    pytorch_when_faster: bool = True
    offload_norms: str = "auto"
    combine_gemms: bool = True
    glue: str = "eager"
    grouped_conv: bool | None = None
    per_sample_add: bool | None = None
    decompose_wide_attention: bool = True

    def __post_init__(self):
        from .target import ALIASES
        if self.arch is not None and self.arch not in ALIASES:
            raise ValueError(f"arch must be one of {', '.join(sorted(ALIASES))} (or None), "
                             f"got {self.arch!r}")
        if self.build_strategy not in ("sharded", "single", "per-region"):
            raise ValueError(f"build_strategy must be sharded, single or per-region, "
                             f"got {self.build_strategy!r}")
        if self.executor not in ("local", "ray"):
            raise ValueError(f"executor must be local or ray, got {self.executor!r}")
        if self.jobs is not None and (isinstance(self.jobs, bool) or not isinstance(self.jobs, int)
                                      or self.jobs < 1):
            raise ValueError(f"jobs must be a positive int (or None), got {self.jobs!r}")
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError("a Ray address (--ray-address / ray_address=) is only used with the "
                             "ray executor (--executor ray / executor='ray')")
        if self.glue not in ("eager", "inductor"):
            raise ValueError(f"glue must be eager or inductor, got {self.glue!r}")
        if self.offload_norms not in NORM_CHOICES:
            raise ValueError(f"offload_norms must be one of {', '.join(NORM_CHOICES)}, "
                             f"got {self.offload_norms!r}")


NORM_CHOICES = ("auto", "all", "group", "none")


def options_for_glue(options: CompileOptions, glue: str, planned: str | None = None) -> CompileOptions:
    """``options`` for ``glue`` (the resolved glue, "inductor" or "eager"): its
    ``glue`` set, and ``offload_norms`` "auto" made concrete for ``planned`` (the glue
    the model is meant to run with, default ``glue``; runtime/glue.GlueSpec.planned):
    "group" with Inductor glue unless strict, else "all" (other values stay)."""
    options = replace(options, glue=glue)
    if options.offload_norms != "auto":
        return options
    planned = planned or glue
    return replace(options, offload_norms="group" if planned == "inductor" and not options.strict else "all")


@functools.lru_cache(maxsize=None)
def compiler_identity(cxx: str) -> str:
    """The first line of ``cxx --version`` ("unknown" when it cannot run): part of
    the cache key of whatever that compiler builds."""
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False,
                              timeout=60).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"
