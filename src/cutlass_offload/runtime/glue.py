"""Inductor compiles the glue: everything around the offloaded regions.

With eager glue every op that is not offloaded runs as its own PyTorch kernel
(llama's RoPE alone is ~160 elementwise launches per forward). With Inductor
glue the offloaded graph, its regions as ``torch.ops.cutlass_offload.region_*``
calls (runtime/ops.py: opaque extern kernels to Inductor), is compiled by
``torch.compile(backend="inductor")``: the glue becomes fused Triton kernels,
and ``mode="reduce-overhead"`` puts the whole forward, regions included, in
Inductor's CUDA graphs.

* ``ops_graph(gm)``: a copy of an offloaded GraphModule whose region modules are
  op calls (the region modules are shared, not copied);
* ``InductorGlue``: that copy under torch.compile, compiled on its first call
  (Dynamo guards recompile on new shapes; the dims the exported program has
  dynamic are marked dynamic from the first call, so a second batch size reuses
  the compiled graph);
* ``resolve_glue``: what "auto" means here.

Glue choices: "inductor", "eager", or "auto" (the default: Inductor when a CUDA
GPU and Triton are present, else eager; if Inductor then fails to compile the
graph, a warning and eager glue for good).
"""
from __future__ import annotations

import json

import threading
import time
import warnings

import torch
import torch.fx as fx
from torch.utils._pytree import tree_leaves

from . import fast_call, glue_binaries
from .glue_passes import rewrite_for_sdpa

GLUES = ("auto", "inductor", "eager")
GLUE_DYNAMIC = ("exported", "auto")
# True: default mode compiles CUDA glue with Inductor's C++ wrapper unless the caller
# chose (InductorGlue.compile_options). On since session 30: with the region ops'
# StableIValue schema (ops.py) it calls them from C++ through the dispatcher, and on
# the H200 (torch 2.11) it took ours from 0.70x to 0.38x of torch.compile's forward on
# efficientnet-b0 and from 0.74x to 0.60x on whisper-encoder (interleaved rounds);
# its cost is the first call's C++ compile (78 s against 28 s on efficientnet-b0).
# Session 20 had it off: the Tensor[] schema sent every region call back through
# Python (docs/measured.md, sessions 20 and 30).
CPP_WRAPPER_IN_DEFAULT_MODE = True
# Inductor options added with our cpp_wrapper choice. cpp_wrapper_build_separate: the
# wrapper's entry is compiled apart from any C++ kernels, at -O1 (cpp_builder's
# min_optimize; pytorch#148773). A GPU wrapper holds no kernels, so this only lowers
# its -O3 to -O1: torch 2.11 compiles it at -O3 (sd-unet's first call 122 s against
# 30 s with the Python wrapper, H200, session 33); torch 2.13 already uses -O1 on GPU
# (pytorch#182089). On the CPU machine bert-base's wrapper took 9.0 s at -O3, 3.3 s at
# -O1 (g++ 12; docs/measured.md, session 33).
# aot_inductor.compile_wrapper_opt_level "O0" (since session 44): that entry at -O0. On an
# H100 host sd-unet's first call after a load took 63.6 s against 90.2 s at -O1 (the
# Python wrapper: 18.8 s), its forward 6.2 against 7.1-7.3 ms (one round set each, not
# interleaved); bert-base's wrapper on 2 cores 1.4 s against 4.4 s. The wrapper only calls
# shims and launches: its own instructions are a small part of a call's host time.
# Not among them: cpp.vec_isa_ok False, which would skip torch 2.11's check of the host
# CPU's vector ISAs for the wrapper's flags (a test program compiled and loaded per ISA:
# 10.3 of bert-base's 47.5 s cold first call on an H100 host in session 46; about 1 s once
# Inductor's cache holds them). Tried in session 49: a glue graph with C++ kernels then
# fails to compile (kernels generated for the ISA picked earlier in the process, the
# wrapper built without it: "at::vec has not been declared"), and torch 2.13 skips the
# check by itself where the source does not need it (_resolve_needs_vec_isa).
SHIM_OPTION = "aot_inductor.custom_ops_to_c_shims"
CPP_WRAPPER_EXTRA_OPTIONS = {"cpp_wrapper_build_separate": True,
                             "aot_inductor.compile_wrapper_opt_level": "O0"}
# True: a C++ wrapper calls the region ops through their C shims (ops.c_shims, Inductor's
# aot_inductor.custom_ops_to_c_shims: a direct call into the C++ call path) instead of
# the dispatcher (aoti_torch_call_dispatcher: an op lookup by name, the arguments boxed
# as StableIValues, the dispatch). Arities beyond the exported shims keep the dispatcher.
# On since session 46 ($CUTLASS_OFFLOAD_C_SHIMS=0 turns it off): bert-base's default-mode
# forward 1.067x faster than through the dispatcher on an H100; the session-45 segfaults
# most likely came from the extension exporting inline c10 symbols, now kept local by
# csrc/fast_call.map (docs/design_notes.md, "Glue", has the figures).
REGION_C_SHIMS = True
# True: the glue copy drops layout copies that feed only SDPA and folds a query's
# constant factor into SDPA's scale before Inductor compiles it (glue_passes.py:
# whisper-encoder's head split, three copy kernels a layer, and its head merge's copy,
# a no-op once SDPA writes the query's layout).
SDPA_REWRITES = True


def cpp_wrapper_in_default_mode() -> bool:
    """``CPP_WRAPPER_IN_DEFAULT_MODE``, or ``$CUTLASS_OFFLOAD_CPP_WRAPPER`` (1 / 0)
    where set (config.knobs, read at compile time)."""
    from ..config import knobs
    chosen = knobs().cpp_wrapper
    return CPP_WRAPPER_IN_DEFAULT_MODE if chosen is None else chosen


def region_c_shims() -> bool:
    """``REGION_C_SHIMS``, or ``$CUTLASS_OFFLOAD_C_SHIMS`` (1 / 0) where set (config.knobs,
    read at compile time)."""
    from ..config import knobs
    chosen = knobs().c_shims
    return REGION_C_SHIMS if chosen is None else chosen


def _inductor_config_keys() -> set:
    from torch._inductor import config as inductor_config
    return set(inductor_config.get_config_copy())


def inductor_available() -> bool:
    """Whether Inductor can compile CUDA glue here: a visible GPU and Triton."""
    if not torch.cuda.is_available():
        return False
    try:
        from torch.utils._triton import has_triton
        return bool(has_triton())
    except ImportError:
        return False


def resolve_glue(glue: str | None) -> str:
    """"inductor" or "eager" from a glue choice (None means "auto").

    Raises ValueError for an unknown choice.
    """
    glue = glue or "auto"
    if glue not in GLUES:
        raise ValueError(f"glue must be one of {', '.join(GLUES)}, got {glue!r}")
    if glue == "auto":
        return "inductor" if inductor_available() else "eager"
    return glue


def mode_options(mode: str | None, options: dict | None) -> dict:
    """Inductor config patches of a torch.compile ``mode`` plus explicit ``options``
    (as torch.compile merges them). Raises ValueError for an unknown mode or option."""
    from torch._inductor import list_mode_options
    patches = {}
    if mode and mode != "default":
        try:
            patches.update(list_mode_options(mode))
        except RuntimeError as e:
            raise ValueError(str(e)) from None
    known = _inductor_config_keys()
    for key, val in (options or {}).items():
        name = key.replace("-", "_")
        if name not in known:
            raise ValueError(f"unknown Inductor option {key!r}")
        patches[name] = val
    return patches


def uses_cuda_graphs(mode: str | None, options: dict | None) -> bool:
    """Whether Inductor runs the compiled graph in CUDA graphs under this mode/options."""
    return bool(mode_options(mode, options).get("triton.cudagraphs", False))


def _input_values(gm: fx.GraphModule, node: fx.Node) -> list:
    vals = []
    for a in node.args:
        v = a.meta.get("val") if isinstance(a, fx.Node) else a
        if v is None and isinstance(a, fx.Node) and a.op == "get_attr":
            v = _attr(gm, a.target)
        vals.append(v)
    return vals


def _attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


class OpsGraph:
    """A copy of an offloaded GraphModule with its regions as op calls.

    graph_module: the copy (shares parameters, buffers and region modules).
    entries: the runtime/ops.py registry entries its op calls name (keep this
      object alive while the graph may run). inlined: names of regions whose inputs
      the op cannot express (a non-int scalar): their PyTorch subgraph is inlined
      instead, so Inductor compiles it with the rest.
    """

    def __init__(self, graph_module, entries, inlined):
        self.graph_module, self.entries, self.inlined = graph_module, entries, inlined


def ops_graph(gm: fx.GraphModule) -> OpsGraph:
    """``gm`` (an offloaded GraphModule: runtime/compiled_model.offload) with each
    region module call replaced by its arity's region op
    (``torch.ops.cutlass_offload.region_<T>t_<I>i``) on the region's registered key.
    torch.export's in-graph input guard (``_guards_fn``) is left out: CompiledModel
    checks each input signature once before the call.
    ``gm`` is not modified."""
    from .ops import input_kinds, register, region_op
    from .region import RegionModule
    graph = fx.Graph()
    graph._codegen = gm.graph._codegen       # the pytree in/out handling of exported modules
    env, entries, inlined = {}, [], []
    for n in gm.graph.nodes:
        if n.op == "call_module":
            mod = gm.get_submodule(n.target)
            if isinstance(mod, RegionModule):
                kinds = input_kinds(_input_values(gm, n))
                if kinds is None:
                    env[n] = _inline(graph, mod.fallback, [env[a] for a in n.args])
                    inlined.append(mod.region.name)
                    continue
                entry = register(mod, kinds)
                entries.append(entry)
                tensors = [env[a] for a, k in zip(n.args, kinds) if k == "tensor"]
                ints = [env[a] if isinstance(a, fx.Node) else a for a, k in zip(n.args, kinds) if k == "int"]
                op = region_op(len(tensors), len(ints))
                env[n] = graph.call_function(op, (*tensors, *ints, entry.id))
                if "val" in n.meta:         # the region's output, for glue_passes' checks
                    env[n].meta["val"] = n.meta["val"]
                continue
            if n.target.startswith("_guards_fn") and not n.users:
                continue
        env[n] = graph.node_copy(n, lambda x: env[x])
    out = fx.GraphModule(gm, graph)
    for attr in ("_in_spec", "_out_spec"):
        if attr in gm.__dict__:
            setattr(out, attr, gm.__dict__[attr])
    return OpsGraph(out, entries, inlined)


def _inline(graph: fx.Graph, sub: fx.GraphModule, args: list):
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    val_map = dict(zip(placeholders, args))
    return graph.graph_copy(sub.graph, val_map)


def dynamic_dims(gm: fx.GraphModule) -> list:
    """Per flat input of ``gm`` (its placeholders, in order): the dims that are
    symbolic in the graph (torch.export's dynamic dims), or () for none / a non-tensor."""
    dims = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            dims.append(tuple(i for i, d in enumerate(v.shape) if isinstance(d, torch.SymInt)))
        else:
            dims.append(())
    return dims


class InductorGlue:
    """An offloaded GraphModule called through torch.compile(backend="inductor").

    gm: the offloaded GraphModule (region modules as call_module). mode / options:
    as ``torch.compile`` takes them (mode "reduce-overhead" and "max-autotune" run
    the compiled forward in Inductor's CUDA graphs). fallback_to_eager: when
    Dynamo or Inductor fails to compile, warn and run ``gm`` (eager glue) from then
    on instead of raising (``failed`` says why); errors raised by the model itself
    are raised either way.

    Call it as ``glue(gm, *args, **kwargs)``: ``gm`` is what runs after a failure.
    Calls run under ``torch.no_grad()`` (offloaded regions have no backward). The
    copy with op calls and its torch.compile are made on the first call, and again
    after ``reset()`` (CompiledModel calls it when the model is moved, so the copy
    sees the moved tensors).

    dynamic: "exported" (the default) marks the dims the exported program has
    dynamic on the first call's inputs, so the first compile is already symbolic in
    them and a second batch size reuses it; "auto" is torch.compile's own default:
    the first compile specializes every size, and a size that changes later is made
    dynamic by one recompile (Dynamo's automatic dynamic shapes).

    Raises ValueError for an unknown mode, option or dynamic.
    """

    def __init__(self, gm: fx.GraphModule, mode: str | None = None, options: dict | None = None,
                 fallback_to_eager: bool = False, dynamic: str = "exported"):
        if dynamic not in GLUE_DYNAMIC:
            raise ValueError(f"dynamic must be one of {', '.join(GLUE_DYNAMIC)}, got {dynamic!r}")
        self.dynamic = dynamic
        self.mode, self.options = mode, dict(options or {})
        self.cuda_graphs = uses_cuda_graphs(mode, self.options)    # validates both
        self.fallback_to_eager = fallback_to_eager
        self.failed = None
        self._source = gm
        self._dynamic = dynamic_dims(gm)
        self._lock = threading.Lock()
        self._state = None          # (compiled callable, OpsGraph)
        self._marked = False
        self.first_call_s = None    # seconds of the first call (Dynamo + Inductor compile)
        self.cpp_wrapper_keys = set()   # Inductor's C++ wrappers of the first call (glue_binaries)
        self.used_options = None    # the Inductor options of the compiled glue (compile_options)
        self.cpp_wrapper_failed = None   # why the C++ wrapper we chose failed to compile, if it did
        self.shims_failed = None    # why the C++ wrapper with the region ops' C shims failed, if it did
        self.rewrites = {}          # glue_passes.rewrite_for_sdpa's counts of the compiled copy
        if self._may_use_cpp_wrapper() and torch.cuda.is_available():
            from . import isa_prefetch
            isa_prefetch.start()    # torch 2.11's CPU-ISA check, long before the wrapper's compile

    def _chooses_cpp_wrapper(self) -> bool:
        """Whether we choose Inductor's C++ wrapper for a compile on CUDA: the caller did
        not set ``cpp_wrapper``, and default mode without CUDA graphs."""
        return ("cpp_wrapper" not in self.options and cpp_wrapper_in_default_mode()
                and not self.cuda_graphs and self.mode in (None, "default"))

    def _may_use_cpp_wrapper(self) -> bool:
        """Whether a compile on CUDA may use Inductor's C++ wrapper (compile_options)."""
        return bool(self.options.get("cpp_wrapper")) or self._chooses_cpp_wrapper()

    @property
    def inlined(self) -> list:
        return self._state[1].inlined if self._state is not None else []

    def reset(self) -> None:
        """Drop the compiled glue; the next call compiles again (Inductor's caches
        may serve it)."""
        with self._lock:
            self._state, self._marked = None, False

    def compile_options(self, on_cuda: bool, arities=()) -> dict:
        """The Inductor options the glue is compiled with: the caller's, plus (while
        ``cpp_wrapper_in_default_mode()``) ``cpp_wrapper`` on a CUDA graph without CUDA
        graphs (default mode) unless the caller set it. Why: the plain forward is
        host-bound on small models, and Inductor's C++ wrapper launches the Triton
        kernels from C++, where the Python wrapper pays ~10-20 us of Python per kernel
        (the host profiles of glue_profile.py --host-profile), and calls the region ops
        through the dispatcher (``aoti_torch_call_dispatcher``: their schema is tensors
        and ints alone, ops.py), straight into the op's C++ kernel; or, with
        ``region_c_shims()``, on a CUDA graph the C++ wrapper compiles, through the ops'
        C shims for ``arities`` ((T, I) pairs of the graph's region ops) unless the caller
        set ``aot_inductor.custom_ops_to_c_shims``."""
        options = dict(self.options)
        if on_cuda and self._chooses_cpp_wrapper() and self.cpp_wrapper_failed is None:
            options["cpp_wrapper"] = True
            known = _inductor_config_keys()
            options.update({k: v for k, v in CPP_WRAPPER_EXTRA_OPTIONS.items()
                            if k in known and k not in self.options})
        if (on_cuda and options.get("cpp_wrapper") and region_c_shims() and arities
                and SHIM_OPTION not in options and self.shims_failed is None):
            from .ops import c_shims
            table = c_shims(arities)
            if table is not None:
                options[SHIM_OPTION] = table
        return options

    def _compiled(self, on_cuda: bool = False):
        with self._lock:
            if self._state is None:
                og = ops_graph(self._source)
                if SDPA_REWRITES:
                    self.rewrites = rewrite_for_sdpa(og.graph_module)
                _mark_buffers_static(og.graph_module)
                options = self.compile_options(on_cuda, [(e.n_tensors, e.n_ints) for e in og.entries])
                mode = None if options and self.mode == "default" else self.mode
                fn = torch.compile(og.graph_module, backend="inductor", mode=mode,
                                   options=options or None)
                self._state = (fn, og)
                self.used_options = options
            return self._state[0]

    def _mark_dynamic(self, args, kwargs):
        """Mark the exported program's dynamic dims on this call's inputs (first call
        only: Dynamo remembers), so the first compile is already dynamic in them."""
        self._marked = True
        if self.dynamic == "auto":
            return
        leaves = tree_leaves((list(args), kwargs))
        if len(leaves) != len(self._dynamic):
            return
        for t, dims in zip(leaves, self._dynamic):
            if dims and isinstance(t, torch.Tensor):
                for d in dims:
                    if t.shape[d] > 1:        # 0 and 1 are specialized by Dynamo anyway
                        torch._dynamo.maybe_mark_dynamic(t, d)

    def __call__(self, gm, *args, **kwargs):
        if self.failed:
            return gm(*args, **kwargs)
        first = not self._marked
        fn = self._compiled(first and any(
            isinstance(t, torch.Tensor) and t.is_cuda for t in tree_leaves((list(args), kwargs))))
        if first:
            self._mark_dynamic(args, kwargs)
        t0 = time.perf_counter()
        before = glue_binaries.cpp_wrapper_keys() if first else None
        try:
            with torch.no_grad():
                out = fn(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:
            used = self.used_options or {}
            # an option we chose failed: drop it and compile again (the shims first, then
            # the C++ wrapper itself, e.g. no working host compiler) before giving up
            for chosen, failed, instead in (
                    (SHIM_OPTION in used and SHIM_OPTION not in self.options, "shims_failed",
                     "could not call the region ops' C shims ({}); compiling it with dispatcher calls"),
                    (used.get("cpp_wrapper") and "cpp_wrapper" not in self.options, "cpp_wrapper_failed",
                     "could not compile the glue ({}); compiling it with the Python wrapper")):
                if chosen:
                    setattr(self, failed, _describe(e))
                    warnings.warn("cutlass_offload: Inductor's C++ wrapper "
                                  + instead.format(getattr(self, failed)), RuntimeWarning, stacklevel=3)
                    self.reset()
                    return self(gm, *args, **kwargs)
            if not self.fallback_to_eager:
                raise
            self.failed = _describe(e)
            warnings.warn(f"cutlass_offload: Inductor could not compile the glue ({self.failed}); "
                          "the model runs with eager glue", RuntimeWarning, stacklevel=3)
            return gm(*args, **kwargs)
        except RuntimeError as e:
            # a region op's C shim failed: the wrapper raised only "API call failed"
            cause = fast_call.take_shim_error()
            if cause is None:
                raise
            raise cause from e
        if first:
            self.first_call_s = time.perf_counter() - t0
            self.cpp_wrapper_keys |= glue_binaries.cpp_wrapper_keys() - before
        return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _describe(e: BaseException) -> str:
    """``e``'s first line, with what Dynamo says stopped it: its wrappers ("RuntimeError
    when making fake tensor call") give the failing node and error on an
    "Explanation:" line, or chain the error as ``__cause__`` (the innermost one's
    first line is added)."""
    text = _first_line(e)
    for line in str(e).splitlines()[1:]:
        if line.strip().startswith("Explanation:"):
            explanation = line.strip()[len("Explanation:"):].strip()
            text += f"; {explanation[:400]}"
            break
    root, seen = e, {id(e)}
    while root.__cause__ is not None and id(root.__cause__) not in seen:
        root = root.__cause__
        seen.add(id(root))
    return text if root is e else f"{text}; caused by {_first_line(root)}"


def _mark_buffers_static(gm: fx.GraphModule) -> None:
    """The module's buffers are constants of the compiled model (folded BatchNorm
    weights, prepacked conv filters, transformers' position ids), but Inductor's
    CUDA graph trees copy every graph input that is not a parameter into a static
    buffer on each replay; marking them static keeps them in place (ResNet-50's
    folded weights: about 50 MB of copies per forward otherwise)."""
    for buf in gm.buffers():
        torch._dynamo.mark_static_address(buf)


def check_glue_args(glue: str | None, mode: str | None, options: dict | None) -> None:
    """Raise ValueError for an unknown glue / mode / option, or mode / options with
    eager glue."""
    if glue is not None and glue not in GLUES:
        raise ValueError(f"glue must be one of {', '.join(GLUES)}, got {glue!r}")
    if (mode not in (None, "default") or options) and glue == "eager":
        raise ValueError("a torch.compile mode or options configure the Inductor glue: they need the "
                         "inductor or auto glue, not eager (--glue / glue=)")
    mode_options(mode, options)


__all__ = ["GLUES", "GLUE_DYNAMIC", "InductorGlue", "OpsGraph", "check_glue_args", "dynamic_dims", "inductor_available",
           "mode_options", "ops_graph", "resolve_glue", "uses_cuda_graphs"]


class GlueSpec:
    """A glue choice as the user gave it: glue ("auto" / "inductor" / "eager"), mode
    and options (torch.compile's). Raises ValueError for an unknown one."""

    def __init__(self, glue: str | None = "auto", mode: str | None = None, options: dict | None = None):
        check_glue_args(glue, mode, options)
        self.glue, self.mode, self.options = glue or "auto", mode, dict(options or {})

    def resolved(self) -> str:
        return resolve_glue(self.glue)

    def planned(self) -> str:
        """The glue the compiled model is meant to run with, which sets the "auto"
        norm choice (config.options_for_glue): ``resolved()`` where a GPU is visible;
        without one, "inductor" for "auto", the glue a GPU host with Triton resolves
        it to when it loads the folder (a CPU compile's own model cannot call its
        regions, so its eager glue here says nothing about how the folder runs)."""
        if self.glue == "auto" and not torch.cuda.is_available():
            return "inductor"
        return self.resolved()

    def apply(self, compiled):
        compiled.set_glue(self.glue, self.mode, self.options)
        if compiled.report is not None:
            compiled.report.glue = {"requested": self.glue, "glue": compiled.glue, "mode": self.mode,
                                    "options": self.options}
            planned = self.planned()
            if planned != compiled.glue:
                compiled.report.glue["note"] = (f"no GPU here: on a GPU host with Triton the model "
                                                f"runs with {planned} glue")
        return compiled

    def to_json(self) -> dict:
        """For the manifest. Raises ValueError when an option value is not JSON."""
        try:
            json.dumps(self.options)
        except TypeError as e:
            raise ValueError(f"Inductor options must be JSON values to be saved: {e}") from None
        return {"glue": self.glue, "mode": self.mode, "options": self.options}
