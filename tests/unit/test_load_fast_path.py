"""What ``co.load`` now builds on first use computes what it did (no GPU, the fake
nvcc): the reference module and the regions' fallback modules."""
import pytest
import torch
import torch.fx as fx

import cutlass_offload as co
from cutlass_offload import integrity
from cutlass_offload.capture import Reference
from cutlass_offload.runtime.region import RegionModule
from fault_helpers import fake_env


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A model whose weights.bin is recorded in several chunks (as sd-unet's 1.7 GB
    are), compiled into ``out``; the process's memo of digests emptied, so a load
    hashes the files again."""
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(integrity, "PARALLEL_MIN", 1 << 16)
    monkeypatch.setattr(integrity, "CHUNK_BYTES", 1 << 14)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256)).half()
    x = torch.randn(4, 256).half()
    out = tmp_path / "out"
    co.compile(model, (x,), arch="sm_80", out_dir=out, glue="eager")
    monkeypatch.setattr(integrity, "_digests", {})
    return model, x, out


def _spy(monkeypatch, owner, name):
    calls = []
    real = getattr(owner, name)

    def spy(*args, **kwargs):
        got = real(*args, **kwargs)
        calls.append(got)
        return got
    monkeypatch.setattr(owner, name, spy)
    return calls


def test_the_reference_is_built_on_first_use(env, monkeypatch):
    model, x, out = env
    built = _spy(monkeypatch, torch.export.ExportedProgram, "module")
    _, ref, inputs = co.load(out)
    assert isinstance(ref, Reference) and len(built) == 1    # the compiled model's unlift
    torch.testing.assert_close(ref(*inputs), model(*inputs))
    torch.testing.assert_close(ref(*inputs), model(*inputs))
    assert len(built) == 2 and ref.module() is built[1]
    assert {n for n, _ in ref.named_parameters()} == {n for n, _ in built[1].named_parameters()}


class _ViaFallbacks(fx.Interpreter):
    """Runs a compiled graph with each region module's fallback in its place."""

    def call_module(self, target, args, kwargs):
        m = self.fetch_attr(target)
        return m.fallback(*args) if isinstance(m, RegionModule) else super().call_module(target, args, kwargs)


def test_region_fallbacks_generate_their_code_on_first_use(env):
    model, x, out = env
    loaded, _, inputs = co.load(out)
    regions = loaded.region_modules()
    assert len(regions) == 2
    lazy = pytest.importorskip("torch.fx._lazy_graph_module")._LazyGraphModule
    assert all(isinstance(m.fallback, lazy) for m in regions)
    with torch.no_grad():
        got = _ViaFallbacks(loaded.graph_module).run(*inputs)
    torch.testing.assert_close(got, model(*inputs))
    assert all("linear" in m.fallback.code for m in regions)
