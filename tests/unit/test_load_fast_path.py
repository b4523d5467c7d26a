"""What ``co.load`` now defers or moves aside keeps its guarantees (no GPU, the fake
nvcc): weights.bin is hashed by a child process while the program deserializes,
and a damaged one is still found before any of it is attached (a child's failed or
malformed answer is never taken: the file is hashed here); the reference module
and the regions' fallback modules are built on first use and compute what they
did; the garbage collector is paused only while a load runs."""
import gc
import os
import sys

import pytest
import torch
import torch.fx as fx

import cutlass_offload as co
from cutlass_offload import api, integrity, weights
from cutlass_offload.capture import Reference
from cutlass_offload.errors import DamagedFileError
from cutlass_offload.runtime.region import RegionModule
from fault_helpers import fake_env

CHUNK = integrity.MIN_CHUNK_BYTES


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


def test_weights_are_hashed_by_a_child_and_the_folder_loads(env, monkeypatch):
    model, x, out = env
    answers = _spy(monkeypatch, integrity, "_digests_in_child")
    rec = integrity.record(out / weights.BIN)
    monkeypatch.setattr(integrity, "_digests", {})
    loaded, ref, inputs = co.load(out)
    assert answers == [tuple(rec["sha256_chunks"])]      # the child answered, and rightly
    assert "check files (beside the program)" in loaded.load_phases
    torch.testing.assert_close(ref(*inputs), model(*inputs))


def test_a_corrupted_weights_file_is_found_and_never_attached(env, monkeypatch):
    _, _, out = env
    with open(out / weights.BIN, "r+b") as f:             # one byte, in place
        f.seek(3 * (1 << 14) + 7)
        b = f.read(1)
        f.seek(3 * (1 << 14) + 7)
        f.write(bytes([b[0] ^ 0xFF]))
    answers = _spy(monkeypatch, integrity, "_digests_in_child")
    attached = _spy(monkeypatch, weights, "attach")
    with pytest.raises(DamagedFileError, match="is corrupted") as e:
        co.load(out)
    assert e.value.path == str(out / weights.BIN)
    assert answers and answers[0] is not None and attached == []


def test_the_damage_is_reported_when_the_program_load_fails_too(env, monkeypatch):
    _, _, out = env
    with open(out / weights.BIN, "r+b") as f:
        f.truncate(5000)

    def broken(path):
        raise RuntimeError("the program could not be read")
    monkeypatch.setattr(api, "load_exported", broken)
    with pytest.raises(DamagedFileError, match="is truncated"):
        co.load(out)


@pytest.mark.parametrize("child", [
    "import sys; sys.exit(3)",                                   # fails
    "print('0' * 64)",                                           # too few digests
    "import sys; print('\\n'.join(['xyz'] * -(-int(sys.argv[2]) // int(sys.argv[3]))))",  # not digests
])
def test_a_child_that_fails_or_answers_wrongly_is_not_taken(tmp_path, monkeypatch, child):
    data = os.urandom(5 * CHUNK + 100)
    path = tmp_path / "blob"
    path.write_bytes(data)
    want = integrity.chunk_digests(path, CHUNK)
    script = tmp_path / "child.py"
    script.write_text(child)
    monkeypatch.setattr(integrity, "_CHILD", str(script))
    monkeypatch.setattr(integrity, "_digests", {})
    with open(path, "rb") as f:
        assert integrity._digests_in_child(f.fileno(), len(data), CHUNK) is None
    assert integrity.chunk_digests(path, CHUNK, in_child=True) == want     # hashed here


def test_a_child_maps_only_what_the_file_holds(tmp_path, monkeypatch):
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(3 * CHUNK))
    with open(path, "rb") as f:
        got = integrity._digests_in_child(f.fileno(), 3 * CHUNK, CHUNK)
        assert list(got) == integrity.chunk_digests(path, CHUNK)
        # a file cut short since its size was taken: the child fails, not this process
        assert integrity._digests_in_child(f.fileno(), 4 * CHUNK, CHUNK) is None
    monkeypatch.setattr(sys, "executable", "/usr/bin/not-a-python")     # embedded interpreters
    with open(path, "rb") as f:
        assert integrity._digests_in_child(f.fileno(), 3 * CHUNK, CHUNK) is None


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


def test_load_leaves_the_garbage_collector_as_it_found_it(env, monkeypatch):
    _, _, out = env
    seen = []
    real = api._load_once

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)
    monkeypatch.setattr(api, "_load_once", spy)
    assert gc.isenabled()
    co.load(out, reference=False)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(co.CutlassOffloadError):
        co.load(out.parent / "absent")
    assert gc.isenabled()
    gc.disable()
    try:
        co.load(out, reference=False)
        assert not gc.isenabled()
    finally:
        gc.enable()
