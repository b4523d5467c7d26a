"""A recompile into the same output folder links the folder's weights.bin instead of
writing it again when it holds the very bytes (weights.write ``previous``), and
writes them when the weights changed or the old file is damaged; each folder then
passes its checks and loads the model's current values. No GPU, the fake nvcc."""
import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from cutlass_offload import integrity, weights
from cutlass_offload.folder import check_folder, load_exported
from fault_helpers import fake_env


@pytest.fixture
def env(tmp_path, monkeypatch):
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    # this model's half a megabyte counts as large: chunked records, several chunks
    monkeypatch.setattr(integrity, "PARALLEL_MIN", 1 << 16)
    monkeypatch.setattr(integrity, "CHUNK_BYTES", 1 << 14)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).half()
    return model, (torch.randn(4, 256).half(),), tmp_path / "out"


def _saved_values(out):
    check_folder(out)                       # every file as its manifest records it
    ep = load_exported(out / "model.pt2")
    weights.attach(ep, out)
    return ep.state_dict


def _compile(model, xs, out):
    co.compile(model, xs, arch="sm_80", out_dir=out, glue="eager")
    return (out / weights.BIN).stat().st_ino


def _same(saved, model):
    return all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_unchanged_weights_are_linked_changed_or_damaged_ones_written(env):
    model, xs, out = env
    first = _compile(model, xs, out)
    assert _compile(model, xs, out) == first            # the same file, not written again
    assert _same(_saved_values(out), model)
    with torch.no_grad():
        model[0].weight[3, 5] += 1.0                    # one value changed: written anew
    changed = _compile(model, xs, out)
    assert changed != first and _same(_saved_values(out), model)
    with open(out / weights.BIN, "r+b") as f:           # damaged in place, manifest unchanged
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0xFF]))
    assert _compile(model, xs, out) != changed          # not linked: written from memory
    assert _same(_saved_values(out), model)
