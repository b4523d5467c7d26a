"""Load / run: put region modules into the graph and wrap the result."""
from __future__ import annotations

import threading
from pathlib import Path

import torch
import torch.fx as fx
from torch.export._unlift import _check_input_constraints_pre_hook

from ..abi import region_symbol
from ..errors import CutlassOffloadError
from ..ir import AttentionRegion, ConvRegion, GemmRegion, GroupNormRegion, NormRegion, Plan
from .attention_region import AttentionRegionModule
from .conv_region import ConvRegionModule
from .gemm_region import GemmRegionModule
from .graphed import GraphedModel
from .group_norm_region import GroupNormRegionModule
from .library import CO_CANNOT_IMPLEMENT, Library
from .norm_region import NormRegionModule
from .region import RegionModule

try:        # generates its code on first use: most region fallbacks never run
    from torch.fx._lazy_graph_module import _LazyGraphModule as _graph_module
except ImportError:       # a torch without it: code generated at once
    _graph_module = fx.GraphModule


class LazyLibrary:
    """Loads the .so on first use, so a compiled model can be built and inspected
    on a machine without a GPU.

    source: the library's path (None: no library was built), or a callable that
    waits for a build still running and returns ``(path, dropped)``: ``dropped``
    names the regions whose kernel failed to compile; their launchers refuse every
    call, so those regions run PyTorch. The callable's exception (a failed build)
    is raised to every caller.
    """

    def __init__(self, source):
        self._pending = source if callable(source) else None
        self.path = None if self._pending is not None or not source else Path(source)
        self._lib = None
        self._lock = threading.Lock()

    def __call__(self) -> Library:
        with self._lock:
            if self._lib is None:
                dropped = ()
                if self._pending is not None:
                    path, dropped = self._pending()
                    self.path = Path(path) if path else None
                if self.path is None:
                    raise CutlassOffloadError("no library was built for this model")
                lib = Library(self.path)
                self._lib = _WithoutDropped(lib, dropped) if dropped else lib
            return self._lib


def _refuse(args, stream) -> int:
    return CO_CANNOT_IMPLEMENT


def _no_workspace(args) -> int:
    return 0


class _WithoutDropped:
    """A Library whose regions in ``dropped`` (kernel not in the library) have
    launchers that refuse every call (the region module then runs PyTorch)."""

    def __init__(self, lib: Library, dropped):
        self._lib, self._dropped = lib, {region_symbol(name) for name in dropped}

    def launcher(self, symbol: str, args_type=None):
        if symbol in self._dropped:
            return _refuse, _no_workspace
        return self._lib.launcher(symbol, args_type) if args_type is not None else self._lib.launcher(symbol)

    def __getattr__(self, name):
        return getattr(self._lib, name)


# One row per region kind: the module that runs it (its ``operand_nodes`` name the
# region's inputs by role; ``attach`` does any one-time work on the graph).
MODULES = {GemmRegion: GemmRegionModule, ConvRegion: ConvRegionModule,
           AttentionRegion: AttentionRegionModule, NormRegion: NormRegionModule,
           GroupNormRegion: GroupNormRegionModule}


def offload(gm: fx.GraphModule, plan: Plan, library_path) -> fx.GraphModule:
    """Replace each region's nodes in ``gm`` by a call to a region module
    (GemmRegionModule / ConvRegionModule / NormRegionModule / GroupNormRegionModule /
    AttentionRegionModule). ``library_path``: what LazyLibrary takes (a path, None,
    or a callable waiting for a build still running).

    The region's original subgraph is kept as the module's ``fallback`` (a
    GraphModule whose code is generated on its first use). Conv
    weights held by ``gm`` are prepacked to channels_last (KRSC) once. Mutates
    and returns ``gm``.
    """
    if not plan.regions:
        return gm
    lib = LazyLibrary(library_path)
    graph = gm.graph
    by_name = {n.name: n for n in graph.nodes}
    for i, (region, kernel) in enumerate(plan.pairs):
        nodes = [by_name[name] for name in region.nodes]
        sub, inputs = _extract(gm, nodes)
        cls = MODULES[type(region)]
        roles = {role: inputs.index(by_name[name]) for role, name in cls.operand_nodes(region) if name}
        module = cls(region, kernel, sub, roles, lib)
        module.attach(gm, by_name)
        target = f"region_{i}"
        gm.add_submodule(target, module)
        out = nodes[-1]
        with graph.inserting_before(out):
            call = graph.call_module(target, tuple(inputs))
        call.meta = dict(out.meta)
        out.replace_all_uses_with(call)
        for n in reversed(nodes):
            graph.erase_node(n)
        by_name[out.name] = call
    graph.lint()
    gm.recompile()
    return gm


def _extract(gm: fx.GraphModule, nodes: list):
    """A GraphModule computing ``nodes`` (last one is the output) and its inputs:
    the external nodes the region reads, in first-use order. Placeholders keep the
    input nodes' names."""
    inside = set(nodes)
    inputs = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in inside and a not in inputs:
                inputs.append(a)
    sub = fx.Graph()
    env = {}
    for a in inputs:
        env[a] = sub.placeholder(a.name)
        env[a].meta = dict(a.meta)
    for n in nodes:
        env[n] = sub.node_copy(n, lambda x: env[x])
    sub.output(env[nodes[-1]])
    return _graph_module(gm, sub), inputs


class _Unhashable(Exception):
    pass


class CompiledModel(torch.nn.Module):
    """A model whose offloaded regions call the CUTLASS library; the rest is PyTorch.

    Call it like the original model. ``plan`` lists regions and kernels,
    ``report`` what was offloaded and the phase times. Regions run on the GPU only
    (a CPU input raises DeviceError); move the model with ``.to("cuda")``.

    Glue (``set_glue``): "eager" runs ``graph_module`` as it is, every op not
    offloaded as its own PyTorch kernel; "inductor" runs it through
    torch.compile(backend="inductor") with the regions as opaque custom ops
    (runtime/glue.py), compiled on the first call; "auto" is Inductor where a GPU and
    Triton are present (eager if Inductor then fails to compile), else eager.
    ``load_phases``: for a model from ``co.load``, the load's seconds by phase; else None.
    """

    def __init__(self, graph_module: fx.GraphModule, plan: Plan, report, library_path):
        super().__init__()
        self.graph_module = graph_module
        self.plan = plan
        self.report = report
        self.library_path = library_path
        self._validated = set()      # input signatures torch.export's input check passed
        self.__dict__["_glue"] = None   # glue.InductorGlue or None (a plain attribute)
        self.load_phases = None

    # -- glue -----------------------------------------------------------------------
    def set_glue(self, glue: str | None = "auto", mode: str | None = None,
                 options: dict | None = None, dynamic: str = "exported") -> "CompiledModel":
        """Choose how the ops around the regions run: "eager", "inductor" or "auto"
        (None = "auto"); ``mode`` / ``options`` as torch.compile takes them (Inductor
        only; "reduce-overhead" = Inductor's CUDA graphs); ``dynamic``: which sizes
        Inductor's first compile is symbolic in (glue.InductorGlue). Nothing is
        compiled until the next call. Returns self. Raises ValueError for an unknown
        glue, mode, option or dynamic, or mode / options with eager glue."""
        from .glue import InductorGlue, check_glue_args, resolve_glue
        check_glue_args(glue, mode, options)
        chosen = resolve_glue(glue)
        self.__dict__["_glue"] = None if chosen == "eager" else InductorGlue(
            self.graph_module, mode, options, fallback_to_eager=(glue or "auto") == "auto",
            dynamic=dynamic)
        return self

    @property
    def glue(self) -> str:
        """"inductor" or "eager": what the next call runs (eager also after Inductor
        failed under "auto")."""
        g = self.__dict__.get("_glue")
        return "inductor" if g is not None and not g.failed else "eager"

    @property
    def inductor(self):
        """The glue.InductorGlue in use (mode, options, failed, first_call_s), or None."""
        return self.__dict__.get("_glue")

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        g = self.__dict__.get("_glue")
        if g is not None:
            g.reset()          # the op graph copy holds the tensors from before the move
        return out

    def forward(self, *args, **kwargs):
        gm = self.graph_module
        glue = self.__dict__.get("_glue")
        if glue is not None and not glue.failed:
            state = gm.__dict__
            if state.get("validate_inputs") is not True:
                return glue(gm, *args, **kwargs)
            self._validate(gm, args, kwargs)
            state["validate_inputs"] = False        # an eager run after a failure: checked here
            try:
                return glue(gm, *args, **kwargs)
            finally:
                state["validate_inputs"] = True
        if kwargs or gm.__dict__.get("validate_inputs") is not True:
            return gm(*args, **kwargs)
        # torch.export's forward pre-hook checks the inputs' structure and shape
        # constraints on every call (over 100 us of pytree work per forward): what it
        # checks depends on the signature only, so check each signature once
        try:
            self._validate(gm, args, {})
        except _Unhashable:                # an unhashable argument: checked every call
            return gm(*args)
        state = gm.__dict__          # a plain attribute: skip nn.Module.__setattr__'s cost
        state["validate_inputs"] = False
        try:
            return gm(*args)
        finally:
            state["validate_inputs"] = True

    def _validate(self, gm, args, kwargs) -> None:
        """torch.export's input check, once per input signature (every call with
        keyword arguments). Raises what the check raises; _Unhashable when the
        signature cannot be cached and the caller should let ``gm`` check."""
        if kwargs:
            _check_input_constraints_pre_hook(gm, args, kwargs)
            return
        sig = tuple((type(a), a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor)
                    else (type(a), a) for a in args)
        try:
            seen = sig in self._validated
        except TypeError:
            if self.__dict__.get("_glue") is not None:
                _check_input_constraints_pre_hook(gm, args, {})
                return
            raise _Unhashable() from None
        if not seen:
            _check_input_constraints_pre_hook(gm, args, {})     # raises on a violation
            if len(self._validated) < 64:
                self._validated.add(sig)

    def verify(self, enabled: bool = True) -> "CompiledModel":
        """Verify mode: each region compares its first kernel call with PyTorch and
        falls back for good (with a RuntimeWarning naming it) where they disagree.
        Run one call before capturing the model into a CUDA graph: the comparison
        synchronizes. Returns self."""
        for m in self.region_modules():
            m.verify = enabled
        return self

    def region_modules(self):
        return [m for m in self.graph_module.modules() if isinstance(m, RegionModule)]

    def open_library(self) -> None:
        """Open the shared library now rather than at the first region call (no GPU
        needed): the model then keeps the library it was loaded with even if its
        file is replaced later (``load`` does this)."""
        modules = self.region_modules()
        if modules and self.library_path:
            modules[0]._library_getter()

    def cuda_graphed(self, max_graphs: int = 8) -> GraphedModel:
        """This model called through whole-model CUDA graphs (runtime/graphed.py):
        one capture per input signature, then input copy + replay + output clone,
        so the regions' host path is paid once per signature, not per call.
        Raises CutlassOffloadError when the Inductor glue already runs in Inductor's
        CUDA graphs (mode "reduce-overhead" / "max-autotune"): graphs do not nest."""
        g = self.__dict__.get("_glue")
        if g is not None and not g.failed and g.cuda_graphs:
            raise CutlassOffloadError(
                f"the Inductor glue (mode={g.mode!r}) already runs in Inductor's CUDA graphs; "
                "call the model directly, or set_glue('inductor') without CUDA graphs first")
        return GraphedModel(self, max_graphs=max_graphs)

    def layout_conversions(self) -> int:
        """Operands copied to NHWC by conv and group_norm regions so far (all calls):
        the layout conversions left in the model (0 when every input of theirs is
        channels_last)."""
        return sum(m.layout_conversions for m in self.region_modules()
                   if isinstance(m, (ConvRegionModule, GroupNormRegionModule)))

    def channel_pad_copies(self) -> int:
        """Operands copied into zero-padded C'-channel buffers by conv regions whose
        kernel runs more input channels than the model (ConvProblem.pad_c) so far
        (all calls): one per call for the input; the filter once per constant
        weight (per call for a weight that is a graph input)."""
        return sum(m.channel_pad_copies for m in self.region_modules()
                   if isinstance(m, ConvRegionModule))
