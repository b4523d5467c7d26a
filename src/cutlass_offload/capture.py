"""Capture: nn.Module + example inputs -> ATen graph (torch.export), canonicalized."""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from .partition.canonicalize import canonicalize


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
    explicit ``dynamic_shapes`` is given. Raises whatever torch.export raises for
    a model it cannot capture.
    """
    model = model.eval()
    args = tuple(example_inputs)
    if dynamic_shapes is None and dynamic_batch:
        dynamic_shapes = _batch_dynamic(model, args)
    with torch.no_grad():
        ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes)
    return Captured(ep, from_exported(ep))


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
