"""GraphedModel without a GPU: signature keys, LRU eviction, CPU inputs refused."""
import pytest
import torch

from cutlass_offload.errors import DeviceError
from cutlass_offload.runtime.graphed import GraphedModel


class _FakeGraph:
    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


def test_capture_once_per_signature_and_evict_least_recent(monkeypatch):
    g = GraphedModel(torch.nn.Identity(), max_graphs=2)
    captured = []

    def fake_capture(args):
        captured.append(tuple(args[0].shape))
        return _FakeGraph(), tuple(a.clone() for a in args), args[0] * 2

    monkeypatch.setattr(g, "_capture", fake_capture)
    a, b, c = torch.ones(2), torch.ones(3), torch.ones(4)
    for x in (a, a, b, a, c, b):      # c evicts b (a was used more recently), b recaptures
        out = g(x)
        assert torch.equal(out, x * 2)
    assert captured == [(2,), (3,), (4,), (3,)]


def test_signature_includes_dtype_and_non_tensor_args(monkeypatch):
    g = GraphedModel(torch.nn.Identity())
    keys = []
    monkeypatch.setattr(g, "_capture", lambda args: (keys.append(len(keys)) or _FakeGraph(),
                                                       args, args[0]))
    g(torch.ones(2), 1)
    g(torch.ones(2, dtype=torch.float16), 1)
    g(torch.ones(2), 2)
    g(torch.ones(2), 1)
    assert len(keys) == 3


def test_cpu_inputs_are_refused():
    with pytest.raises(DeviceError, match="CUDA"):
        GraphedModel(torch.nn.Identity())(torch.ones(2))
