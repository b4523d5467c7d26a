"""The steps of a compile before its partition, shared by ``compile`` (api.py) and
``explain`` (the dry run, dry_run.py): the argument checks, the options, and
torch.export's failures as CaptureError."""
from __future__ import annotations

import contextlib
import inspect
import io
import logging
import sys

import torch

from .capture import capture_hint
from .config import CompileOptions, knobs, options_for_glue
from .errors import CaptureError, InputsError


def checked_inputs(model, example_inputs, dynamic_batch: bool, dynamic_shapes):
    """``example_inputs`` as the capture takes them (one tensor stands for a tuple of
    one). Raises TypeError for a model that is not an nn.Module or inputs that are
    not a tuple, list or tensor; InputsError (a TypeError) for inputs its forward
    cannot take positionally; ValueError for dynamic_batch with dynamic_shapes."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__} "
                        "(wrap a function in a Module whose forward calls it)")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise TypeError(f"example_inputs must be a tuple of the forward's positional arguments "
                        f"(or one tensor), got {type(example_inputs).__name__}")
    if dynamic_batch and dynamic_shapes is not None:      # torch.export takes the latter as given
        raise ValueError("dynamic_batch=True with dynamic_shapes: mark the batch in "
                         "dynamic_shapes instead ({0: torch.export.Dim.AUTO} for each input)")
    _check_signature(model, example_inputs)
    return example_inputs


def _check_signature(model, example_inputs) -> None:
    """InputsError (a TypeError), naming the parameters, where forward cannot take ``example_inputs``
    positionally: a keyword-only parameter without a default (the inputs are
    positional), or more inputs than positional parameters (torch.export's own text
    names neither)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):      # a builtin or C++ forward: torch.export decides
        return
    required_kw = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if required_kw:
        raise InputsError(f"{type(model).__name__}.forward has keyword-only parameter(s) "
                        f"{', '.join(required_kw)} without a default, and example inputs are "
                        "positional: wrap the model in a Module whose forward takes them "
                        "positionally and passes them on by keyword")
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(example_inputs) > len(positional):
        raise InputsError(f"{len(example_inputs)} example inputs for {type(model).__name__}.forward, "
                        f"which takes {len(positional)} positional parameter(s) "
                        f"({', '.join(positional) or 'none'}); keyword arguments (a dict among the "
                        "inputs included) are not taken: wrap the model to take them positionally")


def compile_options(glue, **fields) -> CompileOptions:
    """CompileOptions of ``fields`` (arch resolved) with the environment's grouped_conv
    and per_sample_add, for ``glue`` (a runtime.glue.GlueSpec): config.options_for_glue
    of its resolved and planned glue. Raises ValueError for a bad field."""
    return options_for_glue(CompileOptions(grouped_conv=knobs().grouped_conv,
                                           per_sample_add=knobs().per_sample_add, **fields),
                            glue.resolved(), glue.planned())


@contextlib.contextmanager
def capture_errors():
    """Around a ``capture.capture`` call: an exception it raises (the model's own, or
    torch.export's refusal) becomes CaptureError, with a hint where one is known,
    the original as its ``__cause__`` and what torch printed meanwhile as its
    ``torch_output`` (a failed export prints the graph it traced, twice: the error's,
    not the user's console's); a successful export's warnings are printed after it."""
    printed = io.StringIO()
    try:
        with _stderr_into(printed):
            yield
    except Exception as e:  # noqa: BLE001 - the model's own error, or torch.export's refusal
        hint = capture_hint(e)
        error = CaptureError(f"torch.export could not capture the model on its example inputs: "
                             f"{hint + '. ' if hint else ''}{type(e).__name__}: {e}".rstrip())
        error.torch_output = printed.getvalue()
        raise error from e
    sys.stderr.write(printed.getvalue())     # a successful export's warnings, as they were


@contextlib.contextmanager
def _stderr_into(buffer):
    """sys.stderr, and the stream of torch's logging handlers that write to it (they
    keep the stream they were made with), into ``buffer`` meanwhile."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name == "torch" or name.startswith("torch.")]
    handlers = {h for lg in loggers for h in lg.handlers
                if isinstance(h, logging.StreamHandler) and h.stream is sys.stderr}
    for h in handlers:
        h.setStream(buffer)
    try:
        with contextlib.redirect_stderr(buffer):
            yield
    finally:
        for h in handlers:
            h.setStream(sys.stderr)
