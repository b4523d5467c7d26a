"""co.load(device="cuda") moves the saved program to the indexed CUDA device: the
move pass writes the device it is given verbatim into the graph's
``_assert_tensor_metadata`` checks (from ``.to(dtype)``), which compare devices
exactly, so "cuda" failed against tensors on "cuda:0" when Inductor traced the glue
of a loaded sd-unet / llama / vae-decoder (H200, 2026-12-02). No GPU here: the
device resolution, and the pass's verbatim copy on the meta device. The GPU case:
tests/gpu/test_load_inductor_glue.py."""
import torch
import torch.nn as nn
from torch.export.passes import move_to_device_pass

from cutlass_offload.api import _indexed


class Casts(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        return self.lin(x).to(torch.float32).softmax(-1).to(torch.float16)


def test_cuda_without_an_index_becomes_the_current_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert _indexed("cuda") == torch.device("cuda", 1)
    assert _indexed(torch.device("cuda")) == torch.device("cuda", 1)
    assert _indexed("cuda:0") == torch.device("cuda", 0)       # an index given stays
    assert _indexed("cpu") == torch.device("cpu")


def test_the_move_pass_writes_the_given_device_into_metadata_checks():
    ep = torch.export.export(Casts().half(), (torch.randn(4, 64).half(),))
    checks = lambda p: [n.kwargs["device"] for n in p.graph.nodes  # noqa: E731
                        if n.target is torch.ops.aten._assert_tensor_metadata.default]
    assert len(checks(ep)) == 2
    moved = move_to_device_pass(ep, _indexed("meta"))
    assert [torch.device(d) for d in checks(moved)] == [torch.device("meta")] * 2


def test_a_glue_failure_names_the_innermost_cause():
    from cutlass_offload.runtime.glue import _describe
    try:
        try:
            raise AssertionError("Tensor device mismatch! Expected: cuda, Got: cuda:0")
        except AssertionError as inner:
            raise RuntimeError("RuntimeError when making fake tensor call\n\nfrom user code:") from inner
    except RuntimeError as e:
        text = _describe(e)
    assert text == ("RuntimeError: RuntimeError when making fake tensor call; caused by "
                    "AssertionError: Tensor device mismatch! Expected: cuda, Got: cuda:0")
    assert _describe(ValueError("alone")) == "ValueError: alone"


def test_a_glue_failure_keeps_dynamos_explanation():
    from cutlass_offload.runtime.glue import _describe
    e = RuntimeError("RuntimeError when making fake tensor call\n  Explanation: Dynamo failed to run "
                     "FX node with fake tensors: got AssertionError('mismatch')\n  Hint: check")
    assert _describe(e) == ("RuntimeError: RuntimeError when making fake tensor call; Dynamo failed "
                            "to run FX node with fake tensors: got AssertionError('mismatch')")
