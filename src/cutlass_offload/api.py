"""Public entry points: ``compile`` (torch.export path) and ``load`` (an output
folder); ``backend`` (the torch.compile path) is backend.py. Both run the pipeline
stages in order; an output folder's format, writing and checks are folder.py."""
from __future__ import annotations

import contextlib
import gc
import json
import os
import threading
import time
import warnings
from pathlib import Path

import torch
from torch.export.passes import move_to_device_pass

from . import build as build_stage
from . import target, weights
from .capture import Captured, Reference, capture, dtype_mismatch, from_exported
from .config import CompileOptions, options_for_glue
from .errors import CutlassOffloadError, DamagedFileError, DeviceError
# the output folder's format (folder.py); check_folder is re-exported for the CLI
from .folder import MANIFEST, _checked_later, _fingerprint, begin_save, check_folder, check_out_dir, load_exported, no_folder_message, save  # noqa: F401
from .front import capture_errors, checked_inputs, compile_options
from .ir import Plan
from .partition import partition
from .partition.flops import node_flops
from .partition.graph_utils import input_summary, module_paths
from .report import Report
from .runtime import fast_call, glue_binaries
from .runtime.compiled_model import CompiledModel, offload
from .runtime.glue import GlueSpec
from .select import select

ARCH_ALIASES = target.ALIASES      # names a user may type (target.py)


def resolve_arch(arch: str | None) -> str:
    """'sm90a' or 'sm80' from an explicit name or the visible GPU.

    Raises DeviceError when arch is None and no GPU is visible, ValueError for an
    unknown name.
    """
    if arch is not None:
        if not isinstance(arch, str) or arch.lower() not in ARCH_ALIASES:
            raise ValueError(f"unknown arch {arch!r}: use sm_90a (Hopper: H100 / H200; sm_90 means "
                             "the same) or sm_80 (any compute capability 8.x GPU: A100, A10, L4, "
                             "RTX 30 / 40; sm_86 and sm_89 mean the same)")
        return ARCH_ALIASES[arch.lower()]
    if not torch.cuda.is_available():
        raise DeviceError("no GPU visible to pick the target from: pass --arch sm_90a or sm_80 "
                          "(arch='sm_90a' from Python)")
    major, minor = torch.cuda.get_device_capability()
    arch = target.for_capability((major, minor))
    if arch is not None:
        return arch
    raise DeviceError(f"GPU sm_{major}{minor} is not a supported target (sm_80/sm_90a)")


class _Phases:
    def __init__(self):
        self.seconds = {}

    @contextlib.contextmanager
    def __call__(self, name):
        t0 = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


def compile(model: torch.nn.Module, example_inputs: tuple, *, arch: str | None = None,
            allow_tf32: bool = False, dynamic_batch: bool = False, dynamic_shapes=None,
            out_dir: str | os.PathLike | None = None, strict: bool = False,
            num_sms: int | None = None, build_strategy: str = "sharded",
            verify: bool = False, executor: str = "local",
            ray_address: str | None = None, tune: bool = False,
            glue: str = "auto", mode: str | None = None,
            options: dict | None = None, offload_norms: str = "auto",
            combine_gemms: bool = True, jobs: int | None = None,
            phases_before: dict | None = None,
            decompose_wide_attention: bool = True) -> CompiledModel:
    """Offload ``model``'s GEMM, conv2d, attention and norm regions to CUTLASS kernels
    in one shared library. ``model`` is put in eval mode (``model.eval()``, in place,
    as for inference: dropout off, batch norm on its running statistics).

    example_inputs: a tuple of tensors as the model takes them (any device); a single
      tensor stands for a tuple of one.
    arch: "sm_90a" or "sm_80"; None = from the visible GPU.
    dynamic_batch: dim 0 of every tensor input dynamic (capture.py); dynamic_shapes:
      torch.export's, taken as given (ValueError with dynamic_batch too).
    build_strategy: "sharded" (default), "single" or "per-region" (see build/).
    executor: "local" (default) or "ray": each object compiled as a Ray task on the
      cluster at ``ray_address`` (None = RAY_ADDRESS / a local one; needs
      ``pip install 'cutlass_offload[ray]'``), published into the local cache and
      linked here.
    tune: profile a few candidate kernels per distinct GEMM problem on the visible GPU
      and keep the fastest (tune/; remembered in the tuning cache, so a second
      compile profiles nothing); the report's ``tuning`` lists every candidate.
    verify: compare each region's first kernel call with PyTorch and fall back
      (with a warning naming the region) where they disagree; see CompiledModel.verify.
    out_dir: if given, the library, its source, the exported program, the example
      inputs and the report are written there (atomically: a folder is either
      complete, with manifest.json, or absent) for ``load`` / ``cutlass-offload run``;
      manifest.json records each file's size and sha256. An existing output folder
      there is replaced; an existing file or a non-empty folder of anything else is
      refused before any work.
    glue: how the ops that are not offloaded run (runtime/glue.py): "inductor" (the graph,
      regions as opaque custom ops, compiled by torch.compile's Inductor into fused
      kernels), "eager" (one PyTorch kernel per op), or "auto" (the default:
      Inductor when a CUDA GPU and Triton are present, else eager). Saved with the
      folder; ``load`` may override it.
    mode, options: torch.compile's, for the Inductor glue ("reduce-overhead" runs
      the forward in Inductor's CUDA graphs; "max-autotune").
    offload_norms: which norms become regions ("all", "group", "none"); "auto"
      (the default) leaves layer / RMS norms to Inductor when the glue is Inductor
      (it fuses them with their neighbours; see CompileOptions), else "all". With
      glue "auto" on a machine without a GPU (a compile for a GPU host) that is the
      Inductor choice: the folder's load on a GPU with Triton runs Inductor glue.
    combine_gemms: run sibling linears on one input with nothing fused but a bias
      (attention's q / k / v projections) as one GEMM over their concatenated
      weights, and on sm_90a a gate and an up linear multiplied after an activation
      (SwiGLU / GEGLU) as one GEMM with a GLU epilogue over their interleaved
      weights; both weight copies are made now (partition/parallel_gemm.py,
      partition/gated_gemm.py).
    jobs: parallel nvcc processes (None: ``CUTLASS_OFFLOAD_JOBS`` or the cores,
      capped by memory); ValueError below 1.
    decompose_wide_attention: an attention of head dim above 256 runs as two GEMM
      regions and a softmax (partition/wide_attention.py); False: the fused sm80 kernel.
    phases_before: seconds of the caller's own steps before this call, by name (the
      CLI passes its model construction as {"model": s}); they come first in the
      report's phases, report.json's included (which also holds the save's seconds).
    With Inductor glue and CUDA example inputs on a GPU of ``arch``, the library
    is built in a background thread while the first call (Dynamo + Inductor's
    compile of the glue) runs on the example inputs; its regions wait for the
    library. Otherwise the glue is compiled on the model's first call.
    Returns a CompiledModel; its regions run on a GPU of ``arch``.
    Raises CaptureError when torch.export cannot capture the model (its forward
    raised on the example inputs, or the export refused it; the original error is its
    ``__cause__``), TypeError for a model that is not an nn.Module or example inputs
    that are not a tuple (or one tensor), InputsError (a TypeError) for inputs its
    forward cannot take positionally, DeviceError, ToolchainError, CompileError (nvcc failed: names the
    regions and kernels, keeps the source), CutlassOffloadError when ``strict`` and
    an offloadable op falls back or ``out_dir`` may not be written, DiskFullError
    when the cache's or out_dir's disk is full, ValueError for an unknown glue,
    mode or option.
    """
    example_inputs = checked_inputs(model, example_inputs, dynamic_batch, dynamic_shapes)
    glue_spec = GlueSpec(glue, mode, options)        # ValueError before any work
    options = compile_options(
        glue_spec, arch=resolve_arch(arch), allow_tf32=allow_tf32, strict=strict, num_sms=num_sms,
        build_strategy=build_strategy, executor=executor, ray_address=ray_address, tune=tune,
        offload_norms=offload_norms, combine_gemms=combine_gemms, jobs=jobs,
        decompose_wide_attention=decompose_wide_attention)
    _executor(options)      # a missing Ray extra fails now, not after the capture
    if out_dir is not None:
        check_out_dir(out_dir)      # and a path we must not replace, before any work
    if (mismatch := dtype_mismatch(model, example_inputs)) is not None:
        warnings.warn(mismatch, stacklevel=2)
    phases = _Phases()
    phases.seconds.update(phases_before or {})
    with phases("capture"), capture_errors():     # CaptureError, torch's output kept on it
        cap = capture(model, example_inputs, dynamic_batch=dynamic_batch, dynamic_shapes=dynamic_shapes)
    # the weights are final once captured: weights.bin is written while the rest runs
    pending = begin_save(cap, example_inputs, out_dir) if out_dir is not None else None
    try:
        compiled = _compile_graph(cap.graph_module, options, phases, glue=glue_spec,
                                  warm_inputs=_warm_inputs(example_inputs, options, glue_spec))
        compiled.verify(verify)
        if pending is not None:
            with phases("save"):
                save(compiled, cap, example_inputs, options, out_dir, glue_spec, pending=pending)
            compiled.report.phases = dict(phases.seconds)
    finally:
        if pending is not None:
            pending.discard()        # a failed compile leaves no temporary folder
    return compiled


def _warm_inputs(example_inputs, options: CompileOptions, glue: GlueSpec):
    """The example inputs when the Inductor glue can be compiled (and the library
    built meanwhile) during compile: CUDA tensors on a GPU that runs ``options.arch``."""
    if glue.resolved() != "inductor":
        return None
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if not tensors or not all(t.is_cuda for t in tensors):
        return None
    from .runtime.library import check_device
    try:
        check_device(options.arch, tensors[0].device)
    except DeviceError:
        return None
    return tuple(example_inputs)


def compile_captured(cap: Captured, options: CompileOptions, phases: _Phases | None = None,
                     glue: str = "eager", mode: str | None = None,
                     inductor_options: dict | None = None, tuned: dict | None = None) -> CompiledModel:
    """The stages after capture: partition, select, emit, build, load.

    Thread-safe for different ``cap`` objects (torch.export itself is not: capture
    in one thread, then build several captured models side by side).
    ``options.arch`` must be resolved ("sm90a" / "sm80"). glue / mode /
    inductor_options: as ``compile`` takes glue / mode / options, but the default
    is "eager" here (the building block for tests and tools that call a model with
    many shapes); the Inductor glue is compiled on the first call.
    tuned: kernel choices to use instead of the heuristic's (select.select's
    ``tuned``: GEMM winners, Hopper attention configs), e.g. a search's candidates.
    """
    spec = GlueSpec(glue, mode, inductor_options)
    return _compile_graph(cap.graph_module, options_for_glue(options, spec.resolved()),
                          phases or _Phases(), glue=spec, tuned=tuned)


def _compile_graph(gm, options: CompileOptions, phases: _Phases, library_path=None,
                   keep_regions=None, tuned=None, glue: GlueSpec | None = None,
                   warm_inputs=None) -> CompiledModel:
    """partition -> select (-> tune) -> build -> offload. With ``warm_inputs`` (see
    ``_warm_inputs``) and regions to build, the build runs in a background thread
    during the first call with the Inductor glue (``_overlapped``)."""
    with phases("partition"):
        part = partition(gm, options)
        flops = node_flops(gm)          # after partition's rewrites: region nodes are these
        modules = module_paths(gm)
        inputs = input_summary(gm)
    with phases("select"):
        plan = select(part, options.arch, options, tuned)
    tuning = None
    if options.tune and keep_regions is None and plan.regions:     # not on a reload
        with phases("tune"):
            tuning = _tune(plan, options)
        with phases("select"):
            plan = select(part, options.arch, options, tuning.winners)
    if keep_regions is not None:          # a reload: the regions that built last time
        plan = _restrict(plan, keep_regions)
    _check_strict(options, plan)
    if plan.regions and torch.cuda.is_available():
        # the C++ call path builds beside the kernels; without a GPU no region runs in
        # this process (a first call elsewhere builds it), and its ~35 s of one core
        # would slow a cold build on a small machine
        fast_call.prefetch()
    if plan.regions and library_path is None and warm_inputs is not None:
        return _overlapped(gm, plan, options, phases, tuning, glue, warm_inputs, flops, modules,
                           inputs)
    build_info = {}
    lib = library_path
    if plan.regions and lib is None:
        with phases("build"):
            res = _build(plan, options)
        lib, plan, build_info = res.library, res.plan, {**res.to_dict(), **_epilogue_forms(res.plan)}
        _check_strict(options, plan)
    report = Report.from_plan(plan, flops, modules, inputs)
    report.build = build_info
    if tuning is not None:
        report.tuning = tuning.to_dict()
    with phases("load"):
        gm = offload(gm, plan, lib)
    report.phases = dict(phases.seconds)
    compiled = CompiledModel(gm, plan, report, lib)
    return glue.apply(compiled) if glue is not None else compiled


class _PendingBuild:
    """The library build of ``plan`` in a background (daemon) thread: nvcc runs
    while the main thread compiles the glue. ``library()`` waits for it and is what
    LazyLibrary takes; ``result()`` waits and returns the BuildResult."""

    def __init__(self, plan: Plan, options: CompileOptions):
        self._plan, self._options = plan, options
        self._done = threading.Event()
        self._res = self._exc = None
        self.seconds = None
        threading.Thread(target=self._run, name="cutlass_offload-build", daemon=True).start()

    def _run(self):
        t0 = time.perf_counter()
        try:
            self._res = _build(self._plan, self._options)
        except BaseException as e:          # raised to whoever waits
            self._exc = e
        finally:
            self.seconds = time.perf_counter() - t0
            self._done.set()

    @property
    def failed(self) -> BaseException | None:
        """The build's exception once it has ended with one, else None."""
        return self._exc if self._done.is_set() else None

    def result(self):
        self._done.wait()
        if self._exc is not None:
            raise self._exc
        return self._res

    def library(self):
        """(library path, names of the regions whose kernel failed to compile).
        Raises the build's error, or CutlassOffloadError when ``strict`` and a
        region fell back."""
        res = self.result()
        _check_strict(self._options, res.plan)
        kept = {r.name for r in res.plan.regions}
        return res.library, [r.name for r in self._plan.regions if r.name not in kept]


def _overlapped(gm, plan: Plan, options: CompileOptions, phases: _Phases, tuning,
                glue: GlueSpec, warm_inputs, flops: dict | None = None,
                modules: dict | None = None, inputs: dict | None = None) -> CompiledModel:
    """Build the library in a background thread while the first call on
    ``warm_inputs`` compiles the Inductor glue (its region calls wait for the
    library). Regions whose kernel fails to compile run PyTorch (disabled)."""
    pending = _PendingBuild(plan, options)
    with phases("load"):
        gm = offload(gm, plan, pending.library)
    compiled = CompiledModel(gm, plan, Report.from_plan(plan, flops, modules, inputs), None)
    glue.apply(compiled)
    try:
        with phases("glue: compile + first call"), torch.no_grad():
            compiled(*warm_inputs)
    except BaseException:
        if pending.failed is not None:       # a region call raised the build's error
            raise pending.failed from None
        raise
    res = pending.result()
    phases.seconds["build (beside the glue)"] = pending.seconds
    _check_strict(options, res.plan)
    kept = {r.name for r in res.plan.regions}
    for m in compiled.region_modules():
        if m.region.name not in kept:
            m.disabled = "its kernel failed to compile when the library was built"
    report = Report.from_plan(res.plan, flops, modules, inputs)
    report.build = {**res.to_dict(), **_epilogue_forms(res.plan)}
    if tuning is not None:
        report.tuning = tuning.to_dict()
    ind = compiled.inductor
    wrapper = ""
    if ind is not None and ind.used_options is not None:
        wrapper = (" with Inductor's C++ wrapper" if ind.used_options.get("cpp_wrapper")
                   else " with Inductor's Python wrapper")
        if ind.cpp_wrapper_failed:
            wrapper += f" (the C++ wrapper failed: {ind.cpp_wrapper_failed[:200]})"
        if any(ind.rewrites.values()):
            wrapper += (f"; before SDPA {ind.rewrites['sdpa_input_copies_dropped']} layout copies "
                        f"dropped, {ind.rewrites['sdpa_scales_folded']} query factors folded into its scale")
    report.glue = {**compiled.report.glue, "glue": compiled.glue,
                   "note": (f"compiled during the first call{wrapper}, beside the library build "
                            f"({ind.first_call_s:.1f} s)" if ind is not None and ind.first_call_s
                            else f"compiled during the first call{wrapper}, beside the library build")}
    report.phases = dict(phases.seconds)
    compiled.plan, compiled.report, compiled.library_path = res.plan, report, res.library
    return compiled


def _tune(plan: Plan, options: CompileOptions):
    from . import tune as tune_stage
    return tune_stage.tune(plan, options, builder=lambda p, strategy: _build(p, options, strategy))


def _build(plan: Plan, options: CompileOptions, strategy: str | None = None):
    """build_stage.build of ``plan`` with ``options``' strategy (or ``strategy``), job
    count and executor."""
    return build_stage.build(plan, strategy or options.build_strategy, jobs=options.jobs,
                             executor=_executor(options))


def _epilogue_forms(plan: Plan) -> dict:
    """{"staged_epilogue": form} where an sm90a build emitted its kernels with the staged
    epilogues ($CUTLASS_OFFLOAD_STAGED_EPILOGUE: "tma" or "rows"), for the report (and
    a saved folder's report.json); {} otherwise."""
    from .emit import staged
    if plan.arch != "sm90a" or not plan.regions:
        return {}
    form = staged.form()
    return {"staged_epilogue": form} if form else {}


def _executor(options: CompileOptions):
    from .build.executor import make_executor
    return make_executor(options.executor, options.ray_address)


def _check_strict(options, plan):
    if options.strict and plan.fallbacks:
        raise CutlassOffloadError("strict mode: ops left in PyTorch:\n" + "\n".join(
            f"  {f.node} ({f.op}): {f.reason}" for f in plan.fallbacks))


def _restrict(plan: Plan, names) -> Plan:
    keep = set(names)
    return plan.keep(lambda r, k: r.name in keep,
                     lambda r, k: "its kernel failed to compile when the library was built")


def load(out_dir, device=None, glue: str | None = None, mode: str | None = None,
         options: dict | None = None, reference: bool = True) -> tuple:
    """(CompiledModel, reference, example inputs) from a compile's out_dir.

    device: where to put the model, its constants and the inputs (e.g. "cuda");
      None keeps them where they were exported (the CPU for the CLI).
    glue, mode, options: as ``compile`` takes them; None = the folder's (saved by
      ``compile``; "auto" for a folder saved before glue choices existed). The
      Inductor glue is compiled on the model's first call (Inductor's own caches
      may serve it); nothing is rebuilt with nvcc.
    reference: the second item is a ``capture.Reference``: the saved program
      unlifted again (``ep.module()``), built on its first call or attribute use
      (about 0.3 s for sd-unet on 2 cores); False returns None in its place.
    The CompiledModel's ``load_phases`` says where the load's time went (seconds
    by phase: the file checks, the program, the weights, ...).
    Every file is checked against the manifest (``check_folder``) before it is read:
    nothing damaged is loaded; weights.bin is hashed by a child process while the
    program is deserialized (folder.FileChecks).
    Re-partitions the saved ExportedProgram and checks that it gives the same
    regions and kernels as when the library was built (else CutlassOffloadError).
    Raises CutlassOffloadError for a missing or incomplete folder, DamagedFileError
    naming a damaged file and the fix, ValueError for an unknown glue, mode or option.
    """
    with _gc_paused():
        return _load(Path(out_dir), device, glue, mode, options, reference)


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic garbage collector off meanwhile, as it was after: the objects
    a load of sd-unet keeps set off two full passes over the whole heap, torch's
    included (0.3-0.4 s of its load on 2 cores); the first collections after it
    see the load's new objects once (about 0.1 s)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _load(out: Path, device, glue, mode, options, reference) -> tuple:
    override = (glue, mode, options) if (glue, mode, options) != (None, None, None) else None
    for attempt in range(5):
        # a compile may replace the folder meanwhile (save swaps it atomically): take
        # a snapshot whose manifest is the same before and after, library opened
        before = None
        try:
            before = (out / MANIFEST).read_text(errors="replace")
            phases = _Phases()
            with phases("check files"):
                # weights.bin is hashed in the background, beside the program's load
                manifest, later = _checked_later(out, before, {weights.BIN})
            loaded = _load_once(out, manifest, device, override, reference, phases, later)
            if (out / MANIFEST).read_text(errors="replace") == before:
                return loaded
        except (FileNotFoundError, NotADirectoryError):
            if attempt == 4 or not out.is_dir():
                raise CutlassOffloadError(no_folder_message(out)) from None
        except DamagedFileError:
            # files of a folder swapped in meanwhile look damaged against the old
            # manifest: only an unchanged manifest means real damage
            try:
                now = (out / MANIFEST).read_text(errors="replace")
            except OSError:
                now = None
            if now == before or attempt == 4:
                raise
        time.sleep(0.05 * (attempt + 1))
    raise CutlassOffloadError(f"{out} kept changing while it was loaded (a compile writing it?)")


def _saved_glue(manifest: dict, override) -> GlueSpec:
    saved = manifest.get("glue") or {}
    if override is None:
        return GlueSpec(saved.get("glue", "auto"), saved.get("mode"), saved.get("options"))
    glue, mode, options = override
    return GlueSpec(glue or saved.get("glue", "auto"), mode, options)


def _indexed(device) -> torch.device:
    """``device`` with its index: "cuda" is the current CUDA device. The move pass
    writes the device it is given into the graph's ``_assert_tensor_metadata``
    checks (from ``.to(dtype)`` calls), and those compare devices exactly: "cuda"
    against a tensor on "cuda:0" fails them (Inductor glue then could not trace a
    loaded sd-unet, llama or vae-decoder on the H200)."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return d


def _load_glue_cache(path: Path, saved_torch) -> None:
    """Hand a folder's Inductor cache artifacts (folder.GLUE_CACHE, checked with the
    folder's files) to ``torch.compiler.load_cache_artifacts``, so the glue's first
    compile can be served from them. Only for the torch version that wrote them; a
    failure is a warning (the first call then compiles the glue)."""
    load_artifacts = getattr(torch.compiler, "load_cache_artifacts", None)
    if load_artifacts is None or saved_torch != torch.__version__:
        return
    try:
        load_artifacts(path.read_bytes())
    except Exception as e:  # noqa: BLE001 - an optimization: never a reason not to load
        import warnings
        warnings.warn(f"cutlass_offload: {path} could not be handed to Inductor ({e}); the "
                      "glue compiles on the first call", RuntimeWarning, stacklevel=3)


def _load_once(out: Path, manifest: dict, device, override=None, reference=True,
               phases: _Phases | None = None, later=None) -> tuple:
    """``later``: folder.FileChecks of files not checked yet (weights.bin), waited
    for before any of them is read."""
    phases = phases or _Phases()
    # a folder saved before combine_gemms existed was partitioned without it, one saved
    # before grouped_conv was an option without grouped convs (off by default then), and
    # one saved before per_sample_add existed without that fusion, and one saved before
    # decompose_wide_attention with wide attentions fused
    options = CompileOptions(**{"combine_gemms": False, "grouped_conv": False, "per_sample_add": False,
                                "decompose_wide_attention": False, **manifest["options"]})
    glue = _saved_glue(manifest, override)
    device = None if device is None else _indexed(device)
    try:
        with phases("program"):
            ep = load_exported(out / "model.pt2")
    finally:      # a damaged weights.bin is the error to report, whatever else failed
        with phases("check files (beside the program)"):
            if later is not None:
                later.wait()
    with phases("weights"):
        if manifest.get("weights") is not None:       # raw weights beside the program
            weights.attach(ep, out, device)
    with phases("inputs and device move"):
        inputs = torch.load(out / "inputs.pt")
        if device is not None:
            # moves parameters, buffers, lifted constants and device= arguments alike
            ep = move_to_device_pass(ep, device)
            inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs)
    with phases("glue cache"):
        if manifest.get("glue_binaries") and glue.resolved() == "inductor":
            glue_binaries.install(out / manifest["glue_binaries"], manifest.get("torch"))
        # a cache hit whose C++ wrapper loads a kernel file that is not there fails on
        # its first call (glue_binaries.kernels_in_place): then the glue compiles
        if (manifest.get("glue_cache") and glue.resolved() == "inductor"
                and glue_binaries.kernels_in_place(manifest)):
            _load_glue_cache(out / manifest["glue_cache"], manifest.get("torch"))
    lib = out / build_stage.LIB_NAME
    from .tune.result import choice_from_dict
    tuned = {tid: choice_from_dict(c) for tid, c in manifest.get("tuned", {}).items()}
    with phases("unlift"):
        gm = from_exported(ep)
    with phases("partition, select, offload"):
        compiled = _compile_graph(gm, options, _Phases(),
                                  library_path=lib if lib.exists() else None,
                                  keep_regions=[name for name, _ in manifest["fingerprint"]],
                                  tuned=tuned)
    if _fingerprint(compiled.plan) != manifest["fingerprint"]:
        raise CutlassOffloadError(f"{out}: the saved model partitions differently now "
                                  "(package version changed since it was compiled?); compile it again")
    compiled.report = Report(**json.loads((out / "report.json").read_text()))
    with phases("glue and library"):
        glue.apply(compiled)
        compiled.open_library()
    with phases("reference"):
        ref = Reference(ep) if reference else None
    compiled.load_phases = dict(phases.seconds)
    return compiled, ref, inputs
