"""torch.compile backend: ``torch.compile(model, backend="cutlass_offload", mode=..., options=...)``
(the name is registered as a torch_dynamo_backends entry point), or
``backend=cutlass_offload.make_backend(...)``.

Inference graphs only: call the model under ``torch.no_grad()`` (a graph that
needs gradients is compiled by plain Inductor, with a warning). The target is the
visible GPU unless ``make_backend(arch=...)`` says.

Inductor glue (the default with a GPU and Triton): Dynamo's graph goes through
Inductor's ``compile_fx`` with two changes.

* Decompositions: Inductor's table minus the ops the partitioner anchors on or
  fuses (``KEEP_FOR_PARTITION``: native_layer_norm, native_group_norm, gelu,
  silu, softmax, the GEMMs, masks, casts), so the AOTAutograd graph still shows
  them. What AOTAutograd makes of the rest: ``linear`` -> ``permute + addmm``
  (offloaded as addmm regions), ``layer_norm`` -> ``native_layer_norm`` (offloaded),
  ``scaled_dot_product_attention`` -> a backend op such as
  ``_scaled_dot_product_flash_attention`` and ``group_norm`` -> ``native_group_norm``
  (both put back in composite form for the partitioner: partition/aot_forms.py).
  A batch norm after a conv is not folded (AOTAutograd's graph holds the weights
  as inputs, not constants): Inductor fuses it into the glue instead.
* ``inner_compile``: partition + select the forward graph, start the library
  build in a background thread, replace each region by a
  ``torch.ops.cutlass_offload.region_*`` call (runtime/ops.py), trace the result
  again with Inductor's full decomposition table (what was not offloaded is
  decomposed as plain Inductor would), then ``compile_fx_inner``: Inductor's
  codegen and Triton compiles run while nvcc builds the kernels; the first call
  waits for the library. AOTAutograd's cache is off for these graphs (a hit would
  skip this step, and with it the region modules the graph calls).

``mode`` / ``options`` are torch.compile's: "reduce-overhead" = Inductor's CUDA
graphs around the whole forward, regions included.

Eager glue (``make_backend(glue="eager")``, or "auto" without a GPU / Triton):
AOTAutograd's graph with the regions as region modules, every other op eager.
"""
from __future__ import annotations

import contextlib
import warnings

import torch

from .config import CompileOptions, options_for_glue
from .errors import DeviceError


def _keep_for_partition() -> tuple:
    aten = torch.ops.aten
    names = ("native_layer_norm.default", "native_group_norm.default", "gelu.default",
             "silu.default", "_softmax.default", "softmax.int", "addmm.default", "mm.default",
             "bmm.default", "_to_copy.default", "masked_fill.Scalar", "masked_fill.Tensor",
             "tril.default", "triu.default", "full.default", "ones.default", "zeros.default",
             "t.default", "transpose.int", "_unsafe_view.default", "pad.default", "type_as.default")
    ops = []
    for name in names:
        packet, overload = name.split(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            ops.append(op)
    return tuple(ops)


KEEP_FOR_PARTITION = _keep_for_partition()


def partition_decompositions() -> dict:
    """Inductor's decomposition table without ``KEEP_FOR_PARTITION``."""
    from torch._inductor.decomposition import select_decomp_table
    keep = set(KEEP_FOR_PARTITION)
    return {op: fn for op, fn in select_decomp_table().items() if op not in keep}


def make_backend(arch: str | None = None, allow_tf32: bool = False, strict: bool = False,
                 glue: str = "auto", mode: str | None = None, options: dict | None = None):
    """A torch.compile backend with fixed options. Its ``compiled`` list holds a
    CompiledModel per graph it compiled (plan, report, region modules; it also
    keeps the regions its Inductor graphs call alive).

    glue: "inductor", "eager" or "auto" (Inductor when a GPU and Triton are
    present). mode / options: defaults for torch.compile's ``mode`` / ``options``
    (those passed to torch.compile win). Raises ValueError for an unknown glue,
    mode or option; DeviceError when ``arch`` is None and no GPU is visible.
    """
    from .runtime.glue import check_glue_args
    check_glue_args(glue, mode, options)

    def _backend(gm, example_inputs, mode=mode, options=options):
        from .api import resolve_arch
        from .runtime.glue import check_glue_args, resolve_glue
        check_glue_args(glue, mode, options)
        if arch is None and not torch.cuda.is_available():    # resolve_arch's advice is the CLI's
            raise DeviceError("no GPU visible to pick the target from: pass it to the backend, "
                              "torch.compile(model, backend=cutlass_offload.make_backend("
                              "arch='sm_90a'))")
        copts = CompileOptions(arch=resolve_arch(arch), allow_tf32=allow_tf32, strict=strict)
        if resolve_glue(glue) == "eager":
            if mode not in (None, "default") or options:
                warnings.warn("cutlass_offload backend: eager glue (no GPU / Triton for Inductor): "
                              "mode and options are ignored", RuntimeWarning, stacklevel=2)
            return _eager(gm, example_inputs, options_for_glue(copts, "eager"), _backend.compiled)
        return _inductor(gm, example_inputs, options_for_glue(copts, "inductor"), mode, options,
                         _backend.compiled)
    _backend.compiled = []
    return _backend


_default = {}


def backend(gm, example_inputs, mode=None, options=None):
    """The default backend (target from the visible GPU, glue "auto"); one per
    process, so its ``compiled`` list keeps the graphs' regions alive."""
    if "backend" not in _default:
        _default["backend"] = make_backend()
    return _default["backend"](gm, example_inputs, mode=mode, options=options)


def _eager(gm, example_inputs, copts, record):
    from torch._dynamo.backends.common import aot_autograd

    from .api import _compile_graph, _Phases
    from .partition.canonicalize import canonicalize

    def fw_compiler(aten_gm, inputs):
        compiled = _compile_graph(canonicalize(aten_gm), copts, _Phases())
        record.append(compiled)
        return compiled.graph_module

    return aot_autograd(fw_compiler=fw_compiler)(gm, example_inputs)


def _needs_grad(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def _inductor(gm, example_inputs, copts, mode, options, record):
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    from .runtime.glue import mode_options
    patches = mode_options(mode, options)
    if _needs_grad(example_inputs):
        warnings.warn("cutlass_offload backend: this graph needs gradients (call the model under "
                      "torch.no_grad() for inference); it is compiled by Inductor without offload",
                      RuntimeWarning, stacklevel=3)
        return compile_fx(gm, example_inputs, config_patches=patches)

    def inner_compile(aten_gm, inputs, **kwargs):
        if kwargs.get("is_backward"):
            return compile_fx_inner(aten_gm, inputs, **kwargs)
        graph = offload_for_inductor(aten_gm, inputs, copts, record)
        return compile_fx_inner(graph, inputs, **kwargs)

    with _no_autograd_cache():
        return compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=patches,
                          decompositions=partition_decompositions())


@contextlib.contextmanager
def _no_autograd_cache():
    cfg = torch._functorch.config
    if hasattr(cfg, "enable_autograd_cache"):
        with cfg.patch(enable_autograd_cache=False):
            yield
    else:
        yield


def offload_for_inductor(aten_gm, inputs, copts: CompileOptions, record: list):
    """An AOTAutograd forward graph -> the graph compile_fx_inner gets: regions
    offloaded as op calls (their library building in the background), the rest
    decomposed with Inductor's table. Appends a CompiledModel (the graph with
    region modules, for inspection; it keeps the op graph's registry entries
    alive) to ``record``. Raises CutlassOffloadError when ``copts.strict`` and an
    offloadable op falls back."""
    from .api import _check_strict, _PendingBuild
    from .runtime.glue import ops_graph
    from .partition import partition
    from .partition.aot_forms import op_counts, restore, to_composite
    from .partition.canonicalize import canonicalize
    from .report import Report
    from .runtime import fast_call
    from .runtime.compiled_model import CompiledModel, offload
    from .select import select

    canonicalize(aten_gm)
    rewrites = to_composite(aten_gm)
    from .partition.flops import node_flops
    from .partition.graph_utils import module_paths
    part = partition(aten_gm, copts)
    flops = node_flops(aten_gm)
    modules = module_paths(aten_gm)
    plan = select(part, copts.arch, copts)
    _check_strict(copts, plan)
    pending = None
    if plan.regions:
        if torch.cuda.is_available():        # no region runs here otherwise (api.py)
            fast_call.prefetch()
        pending = _PendingBuild(plan, copts)
        offload(aten_gm, plan, pending.library)
    restored = restore(aten_gm, rewrites)
    compiled = CompiledModel(aten_gm, plan, Report.from_plan(plan, flops, modules), None)
    compiled.report.glue = {"glue": "inductor", "note": "torch.compile backend",
                            "composite_forms": op_counts(rewrites), "restored": restored}
    og = ops_graph(aten_gm)
    compiled.__dict__["_ops_graph"] = og          # the registry entries live as long as this
    compiled.__dict__["_pending_build"] = pending
    record.append(compiled)
    return retrace(og.graph_module, inputs)


def retrace(gm, inputs):
    """``gm`` traced again (make_fx, under the inputs' fake mode) with Inductor's
    full decomposition table: ops kept for the partitioner and not offloaded are
    decomposed as Inductor expects, and every node (the region op calls included)
    gets its ``meta['val']``."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx
    fake_mode = detect_fake_mode(inputs)
    with (fake_mode if fake_mode is not None else contextlib.nullcontext()), enable_python_dispatcher():
        return make_fx(gm, decomposition_table=select_decomp_table())(*inputs)
