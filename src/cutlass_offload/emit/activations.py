"""Epilogue activations by name, for the CUTLASS emitters (evt_sm90.py, epilogue_sm80.py):
CUTLASS's own functors (cutlass/epilogue/thread/activation.h) and ours
(templates/activations.h, inlined into a unit only when one of its kernels uses them,
so no other kernel's source, and so none of their cache keys, changes).

Formulas: PyTorch's (torch.nn.functional.hardswish / hardsigmoid; quick_gelu is
x * sigmoid(1.702 x), OpenAI CLIP's and transformers' QuickGELUActivation).
"""
from __future__ import annotations

from pathlib import Path

THREAD = "cutlass::epilogue::thread::"
# ir activation -> functor template (None: no node / the identity)
FUNCTOR = {
    "identity": None,
    "relu": THREAD + "ReLu",
    "gelu_erf": "co_act::GELU",          # templates/activations.h: erfc without erff
    "gelu_tanh": THREAD + "GELU_taylor",
    "silu": "co_act::SiLU",              # templates/activations.h: ex2 and rcp, no IEEE divide
    "sigmoid": "co_act::Sigmoid",
    "hardswish": THREAD + "HardSwish",
    "hardsigmoid": "co_act::HardSigmoid",
    "quick_gelu": "co_act::QuickGELU",
}
# the ones CUTLASS marks kIsHeavy (its 2.x epilogues skip them for an all-zero source)
HEAVY = ("gelu_erf", "gelu_tanh", "silu", "sigmoid", "quick_gelu")

ACTIVATIONS_H = (Path(__file__).parent / "templates" / "activations.h").read_text()


def preamble(*activations) -> tuple:
    """The preamble blocks (KernelSource.preamble) a kernel applying ``activations`` needs."""
    return (ACTIVATIONS_H,) if any((FUNCTOR.get(a) or "").startswith("co_act::")
                                   for a in activations) else ()
