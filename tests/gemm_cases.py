"""GEMM test cases: the matmul cases of the conformance suite (Apache TVM's Relax
CUTLASS tests restated for PyTorch) plus extra epilogues and odd sizes, and one
model holding them all so a whole suite needs a single library build."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

CONFORMANCE = Path(__file__).parent / "conformance" / "tvm_cutlass_cases.json"

ACT = {"none": None, "bias": None, "relu": torch.relu, "gelu": F.gelu, "silu": F.silu,
       "sigmoid": torch.sigmoid, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def conformance_cases() -> list:
    data = json.loads(CONFORMANCE.read_text())
    cases = list(data["matmul_offload_fp16_tol_1e-2"])
    # Extra cases: odd sizes (K=15, N=105, M=1), epilogues the suite lacks.
    cases += [
        {"x": [1, 15], "w": [15, 105], "transpose_w": True, "epilogue": "bias", "residual": "none"},
        {"x": [7, 24], "w": [24, 40], "transpose_w": False, "epilogue": "silu", "residual": "none"},
        {"x": [2, 9, 64], "w": [64, 64], "transpose_w": True, "epilogue": "sigmoid", "residual": "mul"},
        {"x": [33, 128], "w": [128, 128], "transpose_w": True, "epilogue": "gelu_tanh", "residual": "mul_relu"},
        {"x": [256, 64], "w": [64, 192], "transpose_w": True, "epilogue": "bias", "residual": "none"},
        # partial batch broadcast ((5, 1) x (5, 3), (3, 1, 1) x (2, 1)): both operands expanded
        {"x": [5, 1, 32, 16], "w": [5, 3, 16, 24], "transpose_w": False, "epilogue": "bias", "residual": "none"},
        {"x": [3, 1, 1, 8, 64], "w": [2, 1, 64, 40], "transpose_w": True, "epilogue": "relu", "residual": "none"},
    ]
    for c in data["matmul_3d_bias_fp16_tol_1e-2"]:   # bias of the full output shape
        cases.append({"x": c["x"], "w": c["w"], "transpose_w": False, "epilogue": "bias",
                      "residual": "none", "bias_shape": c["bias"]})
    return cases


def case_id(i, c) -> str:
    shp = lambda s: "x".join(map(str, s))
    return f"{i}-{shp(c['x'])}@{shp(c['w'])}{'T' if c.get('transpose_w') else ''}-{c['epilogue']}-{c['residual']}"


def concrete(shape, dims: dict) -> tuple:
    return tuple(dims[d] if isinstance(d, str) else d for d in shape)


def case_inputs(c, dims: dict, dtype, device="cpu", gen=None) -> tuple:
    """(x, w_stored, [bias]) random in [-1, 1) (fresh per call)."""
    x = torch.rand(concrete(c["x"], dims), generator=gen) * 2 - 1
    w = concrete(c["w"], dims)
    if c.get("transpose_w"):
        w = w[:-2] + (w[-1], w[-2])
    w = (torch.rand(w, generator=gen) * 2 - 1) / math.sqrt(c["x"][-1])
    out = [x, w]
    if c["epilogue"] != "none":
        out.append(torch.rand(c.get("bias_shape") or [c["w"][-1]], generator=gen) * 2 - 1)
    return tuple(t.to(device=device, dtype=dtype) for t in out)


def case_forward(c, x, w, bias=None):
    wl = w.transpose(-1, -2) if c.get("transpose_w") else w
    y = torch.matmul(x, wl)
    if bias is not None:
        y = y + bias
    act = ACT[c["epilogue"]]
    if act is not None:
        y = act(y)
    res = c["residual"]
    if res.startswith("add"):
        y = y + x
    elif res.startswith("mul"):
        y = y * x
    if res.endswith("_relu"):
        y = torch.relu(y)
    return y


class CaseModel(torch.nn.Module):
    """One case; inputs (x, w, [bias])."""

    def __init__(self, case):
        super().__init__()
        self.case = case

    def forward(self, *xs):
        return case_forward(self.case, *xs)


class SuiteModel(torch.nn.Module):
    """All cases side by side: inputs are the cases' inputs concatenated."""

    def __init__(self, cases):
        super().__init__()
        self.cases = cases
        self.arity = [3 if c["epilogue"] != "none" else 2 for c in cases]

    def forward(self, *xs):
        outs, i = [], 0
        for c, n in zip(self.cases, self.arity):
            outs.append(case_forward(c, *xs[i:i + n]))
            i += n
        return tuple(outs)


def suite_inputs(cases, dims_per_case, dtype, device="cpu") -> tuple:
    return tuple(t for c, d in zip(cases, dims_per_case) for t in case_inputs(c, d, dtype, device))


def suite_dynamic_shapes(cases) -> tuple:
    """Dims named by letters become torch.export Dims, one set per case."""
    specs = []
    for i, c in enumerate(cases):
        dims = {}

        def spec(shape):
            s = {}
            for axis, d in enumerate(shape):
                if isinstance(d, str):
                    dims.setdefault(d, torch.export.Dim(f"c{i}_{d}", min=2, max=64))
                    s[axis] = dims[d]
            return s or None
        specs.append(spec(c["x"]))
        w = list(c["w"])
        if c.get("transpose_w"):
            w = w[:-2] + [w[-1], w[-2]]
        specs.append(spec(w))
        if c["epilogue"] != "none":
            specs.append(None)
    return (tuple(specs),)   # forward(*xs): one varargs entry


def example_dims(cases, value=16) -> list:
    return [{d: value for d in c["x"] + c["w"] if isinstance(d, str)} for c in cases]
