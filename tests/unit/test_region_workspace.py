"""RegionModule's reused workspace (no GPU: a CPU device stands in)."""
from types import SimpleNamespace

import torch

from cutlass_offload.runtime.region import RegionModule, unpooled_empty


def _module():
    region = SimpleNamespace(name="r0")
    kernel = SimpleNamespace(dtype="f16", name="k")
    return RegionModule(region, kernel, torch.fx.symbolic_trace(torch.nn.Identity()), lambda: None)


def test_workspace_grows_to_powers_of_two_and_keeps_the_replaced_buffers():
    m = _module()
    cpu = torch.device("cpu")
    a = m._workspace(100, cpu)
    assert a.numel() == 128 and a.dtype == torch.uint8
    assert m._workspace(128, cpu) is a and m._workspace(1, cpu) is a      # reused
    b = m._workspace(129, cpu)
    assert b.numel() == 256 and m._ws is b
    # a CUDA graph captured with the old buffer still launches with its address
    assert m._ws_retired == [a]


def test_unpooled_empty_on_cpu():
    t = unpooled_empty(64, torch.uint8, "cpu")
    assert t.shape == (64,) and t.dtype == torch.uint8 and t.device.type == "cpu"
