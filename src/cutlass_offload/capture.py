"""Capture: nn.Module + example inputs -> ATen graph (torch.export), canonicalized."""
from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass

import torch

from .partition.canonicalize import canonicalize
from .partition.graph_utils import BATCH_DOUBLED


@dataclass
class Captured:
    """exported: the ExportedProgram (saved next to the library for ``run``).
    graph_module: its unlifted GraphModule (weights as get_attr), canonicalized."""

    exported: torch.export.ExportedProgram
    graph_module: torch.fx.GraphModule


def capture(model: torch.nn.Module, example_inputs: tuple, *, dynamic_batch: bool = False,
            dynamic_shapes=None) -> Captured:
    """Export ``model`` (put in eval mode) with ``torch.export.export``.

    dynamic_batch: mark dim 0 of every tensor input dynamic (Dim.AUTO), unless an
    explicit ``dynamic_shapes`` is given. torch.export specializes a size-1 dim
    (its 0/1 specialization), so when every tensor input has batch 1 the export
    traces a batch-2 copy of them (rows repeated) to keep the batch dynamic; if that
    export fails, the batch-1 one is kept (static batch, as torch.export decides).
    Raises whatever torch.export raises for a model it cannot capture.
    """
    model = model.eval()
    args = tuple(example_inputs)
    if dynamic_shapes is None and dynamic_batch:
        dynamic_shapes = _batch_dynamic(model, args)
        doubled = _batch_two(args)
        if doubled is not None:
            try:
                with torch.no_grad():
                    ep = torch.export.export(model, doubled, dynamic_shapes=dynamic_shapes)
                gm = from_exported(ep)
                gm.meta[BATCH_DOUBLED] = True      # the report says what was traced
                return Captured(ep, gm)
            except Exception:  # noqa: BLE001 - the model may depend on batch 1: export it as given
                pass
    with torch.no_grad():
        ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    return Captured(ep, from_exported(ep))


def dtype_mismatch(model: torch.nn.Module, example_inputs) -> str | None:
    """A warning's text when the floating example inputs have another dtype than the
    one floating dtype of ``model``'s parameters (``model.half()`` forgotten: unless
    the model casts its inputs itself, PyTorch's matmuls refuse the mixed operands,
    and no GEMM on them is offloaded); None otherwise."""
    params = {p.dtype for p in model.parameters() if p.is_floating_point()}
    inputs = {t.dtype for t in example_inputs if isinstance(t, torch.Tensor) and t.is_floating_point()}
    if len(params) != 1 or not inputs - params:
        return None
    name = lambda d: str(d).replace("torch.", "")  # noqa: E731
    (param,) = params
    return (f"the example inputs are {', '.join(sorted(map(name, inputs - params)))} but the model's "
            f"parameters are {name(param)}: unless the model casts its inputs, PyTorch's own "
            f"matmuls refuse such mixed operands (those stay in PyTorch); cast one to "
            f"the other (e.g. model.to(torch.{name(next(iter(inputs - params)))}))")


# What to do about torch.export's refusals a user meets most, by the exception's class
# name (torch's own text follows the hint: it names the user's line that raised).
_CAPTURE_HINTS = {
    "GuardOnDataDependentSymNode": (
        "the forward branches on, sizes a tensor by, or reads into Python (.item(), int(t)) "
        "a tensor's values, which torch.export cannot trace: decide it outside forward (a "
        "Python argument), use torch.cond, or compile the submodules around it "
        "(co.compile(model.block, ...))"),
}


# ... and by words of the message, for refusals whose class is a generic one
_CAPTURE_MESSAGE_HINTS = (
    (("cache_utils", "register a pytree"),
     "the model returns a transformers cache object (decoders default to use_cache=True): "
     "build it with use_cache=False (in its config, or as a forward argument), or wrap it "
     "to return only the tensors"),
)


def capture_hint(error: BaseException) -> str | None:
    """What to do about ``error``, an exception torch.export raised for a model it
    cannot capture, when its class (or that of one it was raised from) is a known
    refusal, or its message holds a known refusal's words; None otherwise."""
    seen, whole = set(), str(error)
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if (hint := _CAPTURE_HINTS.get(type(error).__name__)) is not None:
            if "torch.float16" in whole or "torch.float16" in str(error):
                # transformers' fp16 overflow checks (BART and kin: "if hidden_states.dtype
                # == torch.float16 and not torch.isfinite(...)") branch only in fp16
                hint += ("; the branch tests for float16 (an fp16 overflow check, as in "
                         "transformers' BART): a bf16 model (--dtype bf16) does not take it")
            return hint
        text = str(error)
        for words, hint in _CAPTURE_MESSAGE_HINTS:
            if all(w in text for w in words):
                return hint
        error = error.__cause__ or error.__context__
    return None


def _batch_two(args) -> tuple | None:
    """``args`` with every tensor's dim 0 repeated to 2, when every tensor input has
    dim 0 of size 1 (a batch of one); None otherwise."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors or any(t.dim() == 0 or t.shape[0] != 1 for t in tensors):
        return None
    return tuple(torch.cat([a, a]) if isinstance(a, torch.Tensor) else a for a in args)


def _batch_dynamic(model, args) -> tuple:
    """Dim 0 of every tensor argument dynamic, shaped like forward's signature
    (a ``*args`` parameter takes one nested tuple for all its arguments)."""
    specs = [{0: torch.export.Dim.AUTO} if isinstance(a, torch.Tensor) else None for a in args]
    params = list(inspect.signature(model.forward).parameters.values())
    fixed = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return tuple(specs[:len(fixed)]) + (tuple(specs[len(fixed):]),)
    return tuple(specs)


def from_exported(ep: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """The canonicalized, unlifted GraphModule of an ExportedProgram."""
    return canonicalize(ep.module())


class Reference:
    """``ep.module()`` (the program unlifted, as PyTorch runs it), built on first use:
    about 0.3 s of sd-unet's load on 2 cores that a load whose caller never runs the
    reference need not pay. Calling it calls that module; any other attribute is the
    module's (so ``.to(...)`` returns the module itself); ``module()`` returns it."""

    def __init__(self, ep: torch.export.ExportedProgram):
        self._ep, self._module, self._lock = ep, None, threading.Lock()

    def module(self) -> torch.fx.GraphModule:
        with self._lock:
            if self._module is None:
                self._module, self._ep = self._ep.module(), None
            return self._module

    def __call__(self, *args, **kwargs):
        return self.module()(*args, **kwargs)

    def __getattr__(self, name):
        # only for names not found on the object; never for its own (copy / pickle
        # probe an instance without them)
        if name.startswith("__") or name in ("_ep", "_module", "_lock"):
            raise AttributeError(name)
        return getattr(self.module(), name)
