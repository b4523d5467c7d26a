"""Conv2d test cases: the conformance cases (tests/conformance/tvm_cutlass_cases.json,
restated for PyTorch) plus strided, dilated, asymmetric padding, 'same' padding,
1x1, 7x7 and odd channel counts. One SuiteModel runs every case, so one library
holds all their kernels (one build)."""
import json
from pathlib import Path

import torch
import torch.nn.functional as F

SUITE = json.loads((Path(__file__).parent / "conformance" / "tvm_cutlass_cases.json").read_text())

ACT = {"none": None, "bias": None, "relu": torch.relu, "silu": F.silu, "sigmoid": torch.sigmoid}


def conformance_cases() -> list:
    """Dicts: x (N, C, H, W), w (K, C, R, S), bias, act, residual ('none', 'add', 'mul',
    'add_relu', 'mul_relu' with the conv's own input as the residual; 'channel' = a
    (1, K, 1, 1) tensor added after the activation), pad (top, bottom, left, right),
    stride, dilation, data ('int' = drawn from {-1, 0}, exact in fp16; 'randn')."""
    cases = []
    for c in SUITE["conv2d_offload_fp16_tol_1e-5"]:
        cases.append(dict(x=c["data_nchw"], w=c["weight_oihw"], bias=c["epilogue"] != "none",
                          act=c["epilogue"], residual=c["residual"], pad=(1, 1, 1, 1),
                          stride=(1, 1), dilation=(1, 1), data="int"))
    for c in SUITE["conv2d_residual_broadcast_fp16_tol_1e-5"]:
        cases.append(dict(x=c["data_nchw"], w=c["weight_oihw"], bias=True, act="relu",
                          residual="channel", pad=(1, 1, 1, 1), stride=(1, 1), dilation=(1, 1),
                          data="int"))
    return cases


def extra_cases() -> list:
    base = dict(bias=True, act="relu", residual="none", stride=(1, 1), dilation=(1, 1), data="randn")
    return [
        dict(base, x=[4, 32, 17, 19], w=[64, 32, 3, 3], pad=(1, 1, 1, 1), stride=(2, 2)),   # strided
        dict(base, x=[2, 16, 20, 20], w=[32, 16, 3, 3], pad=(2, 2, 2, 2), dilation=(2, 2)),  # dilated
        dict(base, x=[2, 16, 15, 13], w=[16, 16, 3, 3], pad=(2, 1, 1, 0), act="silu"),     # asymmetric
        dict(base, x=[2, 24, 12, 12], w=[40, 24, 4, 4], pad="same", act="none"),           # 'same', even R
        dict(base, x=[4, 64, 14, 14], w=[128, 64, 1, 1], pad=(0, 0, 0, 0), residual="none"),  # 1x1
        dict(base, x=[2, 3, 56, 56], w=[64, 3, 7, 7], pad=(3, 3, 3, 3), stride=(2, 2)),    # C=3 stem
        dict(base, x=[2, 9, 16, 16], w=[24, 9, 3, 3], pad=(1, 1, 1, 1), act="none"),       # C=9
        dict(base, x=[2, 4, 32, 32], w=[320, 4, 3, 3], pad=(1, 1, 1, 1), act="none"),      # SD conv_in
        dict(base, x=[2, 320, 16, 16], w=[4, 320, 3, 3], pad=(1, 1, 1, 1), act="none"),    # SD conv_out
        dict(base, x=[2, 64, 16, 16], w=[128, 64, 1, 1], pad=(0, 0, 0, 0), stride=(2, 2),
             act="none"),                                   # 1x1 stride 2, even H (ResNet shortcut)
        dict(base, x=[2, 8, 10, 10], w=[72, 8, 3, 3], pad=(1, 1, 1, 1), act="sigmoid"),    # C=8 < tile K
        dict(base, x=[2, 16, 9, 9], w=[24, 16, 3, 3], pad=(1, 1, 1, 1), residual="channel_mul"),
    ]


def case_id(c) -> str:
    pad = c["pad"] if isinstance(c["pad"], str) else "p" + "".join(map(str, c["pad"]))
    return (f"x{'x'.join(map(str, c['x']))}_w{'x'.join(map(str, c['w']))}_{pad}"
            f"_s{c['stride'][0]}_d{c['dilation'][0]}_{c['act']}_{c['residual']}")


def _draw(shape, data, dtype, device, gen):
    if data == "int":     # {-1, 0}: every product and sum is a small integer, exact in fp16
        return (torch.randint(-1, 1, shape, generator=gen)).to(dtype).to(device)
    return (torch.randn(shape, generator=gen) * 0.5).to(dtype).to(device)


def case_inputs(c, dtype, device="cpu", seed=0):
    """(x, weight, bias or None, channel residual or None), x in channels_last."""
    gen = torch.Generator().manual_seed(seed)
    x = _draw(c["x"], c["data"], dtype, device, gen).contiguous(memory_format=torch.channels_last)
    w = _draw(c["w"], c["data"], dtype, device, gen)
    b = _draw([c["w"][0]], c["data"], dtype, device, gen) if c["bias"] else None
    r = (_draw([1, c["w"][0], 1, 1], c["data"], dtype, device, gen)
         if c["residual"].startswith("channel") else None)
    return x, w, b, r


def case_forward(c, x, w, b, r):
    """The case's computation in plain PyTorch (any dtype)."""
    if isinstance(c["pad"], str):
        y = F.conv2d(x, w, b, stride=c["stride"], padding=c["pad"], dilation=c["dilation"])
    else:
        top, bottom, left, right = c["pad"]
        if top == bottom and left == right:
            y = F.conv2d(x, w, b, stride=c["stride"], padding=(top, left), dilation=c["dilation"])
        else:
            y = F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride=c["stride"],
                         dilation=c["dilation"])
    act = ACT[c["act"]]
    if act is not None:
        y = act(y)
    res = c["residual"]
    if res == "channel":
        y = y + r
    elif res == "channel_mul":
        y = y * r
    elif res != "none":
        y = y + x if res.startswith("add") else y * x
        if res.endswith("_relu"):
            y = torch.relu(y)
    return y


class SuiteModel(torch.nn.Module):
    """Runs every case; weights and biases are module parameters (as in a real model)."""

    def __init__(self, cases, dtype, seed=0):
        super().__init__()
        self.cases = cases
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        self.channel = torch.nn.ParameterList()
        for i, c in enumerate(cases):
            _, w, b, r = case_inputs(c, dtype, seed=seed + i)
            self.weights.append(torch.nn.Parameter(w, requires_grad=False))
            self.biases.append(torch.nn.Parameter(b if b is not None else torch.zeros(0, dtype=dtype),
                                                  requires_grad=False))
            self.channel.append(torch.nn.Parameter(r if r is not None else torch.zeros(0, dtype=dtype),
                                                   requires_grad=False))

    def forward(self, *xs):
        outs = []
        for i, (c, x) in enumerate(zip(self.cases, xs)):
            b = self.biases[i] if c["bias"] else None
            r = self.channel[i] if c["residual"].startswith("channel") else None
            outs.append(case_forward(c, x, self.weights[i], b, r))
        return tuple(outs)


def suite_inputs(cases, dtype, device="cpu", seed=0):
    return tuple(case_inputs(c, dtype, device, seed=1000 * seed + 7 * i)[0] for i, c in enumerate(cases))
