"""folder.load_exported: torch.export.load with typing.get_type_hints memoized for
the call. The program loaded is the one saved, the real function is asked once per
distinct class instead of once per node field, and torch's serializer reads the
real typing module again afterwards, also after a failed load."""
import typing

import pytest
import torch
import torch.nn as nn
from torch._export.serde import serialize

from cutlass_offload.folder import load_exported


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).softmax(-1)


@pytest.fixture()
def saved(tmp_path):
    torch.manual_seed(0)
    ep = torch.export.export(Small(), (torch.randn(4, 16),))
    path = tmp_path / "m.pt2"
    torch.export.save(ep, str(path))
    return ep, path


def _counting(monkeypatch) -> list:
    calls = []
    real = typing.get_type_hints

    def counted(obj, *args, **kwargs):
        calls.append(obj)
        return real(obj, *args, **kwargs)
    monkeypatch.setattr(typing, "get_type_hints", counted)
    return calls


def test_loads_the_saved_program_asking_each_class_once(saved, monkeypatch):
    ep, path = saved
    calls = _counting(monkeypatch)
    torch.export.load(str(path))
    plain = len(calls)
    calls.clear()
    got = load_exported(path)
    assert len(calls) == len(set(map(id, calls))) < plain       # once per class
    assert got.graph_module.code == ep.graph_module.code
    x = torch.randn(4, 16)
    torch.testing.assert_close(got.module()(x), ep.module()(x))
    assert serialize.typing is typing


def test_the_serializer_gets_typing_back_after_a_failed_load(tmp_path):
    with pytest.raises(Exception):
        load_exported(tmp_path / "missing.pt2")
    assert serialize.typing is typing
