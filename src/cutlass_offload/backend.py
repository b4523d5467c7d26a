"""torch.compile backend: ``torch.compile(model, backend=cutlass_offload.backend)``.

Dynamo's graph is lowered to ATen by AOTAutograd (inference graphs: call the model
under ``torch.no_grad()``); the same partition/select/emit/build stages then run
on it. The target is the visible GPU unless ``make_backend(arch=...)`` says.
"""
from __future__ import annotations

from .config import CompileOptions


def make_backend(arch: str | None = None, allow_tf32: bool = False, strict: bool = False):
    """A torch.compile backend with fixed options. Its ``compiled`` list holds the
    CompiledModel of every graph it compiled (plans and reports, for inspection)."""
    def _backend(gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        from .api import _compile_graph, _Phases, resolve_arch
        from .partition.canonicalize import canonicalize

        options = CompileOptions(arch=resolve_arch(arch), allow_tf32=allow_tf32, strict=strict)

        def fw_compiler(aten_gm, inputs):
            compiled = _compile_graph(canonicalize(aten_gm), options, _Phases())
            _backend.compiled.append(compiled)
            return compiled.graph_module

        return aot_autograd(fw_compiler=fw_compiler)(gm, example_inputs)
    _backend.compiled = []
    return _backend


def backend(gm, example_inputs):
    """The default backend (target from the visible GPU)."""
    return make_backend()(gm, example_inputs)
