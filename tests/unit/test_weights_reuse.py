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


def test_weights_are_written_beside_the_compile_and_recorded_from_memory(env, monkeypatch):
    """co.compile(out_dir=...) writes weights.bin in a background thread begun right
    after the capture (before partition runs), hashes it from memory while writing,
    and the manifest's record is the file's real chunk digests."""
    import threading

    from cutlass_offload import api
    model, xs, out = env
    events = []
    real_write, real_partition = weights.write, api.partition

    def write(*a, **k):
        events.append(("write", threading.current_thread().name))
        return real_write(*a, **k)

    def partition(*a, **k):
        events.append(("partition", threading.current_thread().name))
        return real_partition(*a, **k)
    monkeypatch.setattr(weights, "write", write)
    monkeypatch.setattr(api, "partition", partition)
    real_begin = api.begin_save

    def begin(*a, **k):
        pending = real_begin(*a, **k)
        pending.wait()              # deterministic order for the check below
        return pending
    monkeypatch.setattr(api, "begin_save", begin)
    co.compile(model, xs, arch="sm_80", out_dir=out, glue="eager")
    assert [e for e, _ in events] == ["write", "partition"]
    assert events[0][1].startswith("co-weights") and events[1][1] == threading.current_thread().name
    import json
    rec = json.loads((out / "manifest.json").read_text())["files"][weights.BIN]
    integrity._digests.clear()          # forget the remembered digests: read the file
    assert rec["sha256_chunks"] == integrity.chunk_digests(out / weights.BIN, rec["chunk_bytes"])
    assert _same(_saved_values(out), model)


def test_a_compile_that_fails_after_capture_leaves_no_temporary_folder(env, monkeypatch):
    from cutlass_offload import api
    model, xs, out = env
    _compile(model, xs, out)
    before = (out / "manifest.json").read_text()

    def broken(*a, **k):
        raise RuntimeError("select failed: test")
    monkeypatch.setattr(api, "_compile_graph", broken)
    with pytest.raises(RuntimeError, match="select failed: test"):
        co.compile(model, xs, arch="sm_80", out_dir=out, glue="eager")
    assert (out / "manifest.json").read_text() == before
    assert not list(out.parent.glob(f".{out.name}.tmp-*"))
    check_folder(out)


def test_remembered_digests_must_fit_the_file(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(10000))
    with pytest.raises(ValueError, match="chunk digests"):
        integrity.remember_chunk_digests(p, 4096, ["0" * 64])
    integrity.remember_chunk_digests(p, 4096, ["a" * 64] * 3)
    assert integrity.chunk_digests(p, 4096) == ["a" * 64] * 3      # taken as the file's
    p.write_bytes(bytes(10001))                                       # changed: hashed again
    assert integrity.chunk_digests(p, 4096) != ["a" * 64] * 3


def test_a_discarded_save_cancels_the_weights_write(env, monkeypatch, tmp_path):
    """PendingSave.discard (a compile that failed) stops the background write between
    storages instead of waiting for the whole file, and removes the folder."""
    import threading

    from cutlass_offload import folder
    from cutlass_offload.capture import capture
    model, xs, out = env
    real_write, started = weights.write, threading.Event()

    def slow_write(tensors, tmp, previous=None, record=None, cancel=None):
        started.set()
        assert cancel is not None and cancel.wait(30), "never cancelled"
        raise weights.Cancelled("test")
    monkeypatch.setattr(weights, "write", slow_write)
    pending = folder.begin_save(capture(model, xs), xs, out)
    assert started.wait(30)
    pending.discard()                      # returns once cancelled, not after 30 s
    assert not pending.tmp.exists()
    # the real writer checks the event before each storage
    stop = threading.Event()
    stop.set()
    tensors = [("state_dict", k, v) for k, v in model.state_dict().items()]
    (tmp_path / "w").mkdir()
    with pytest.raises(weights.Cancelled):
        real_write(tensors, tmp_path / "w", cancel=stop)


def test_a_new_folder_links_a_recent_folders_identical_weights(env, tmp_path):
    """A save into a fresh folder links the weights.bin of a folder saved recently with
    the very bytes (recent_folders.py); changed bytes there, or the folder gone, and it
    writes them; either way the new folder checks and loads the model's values."""
    from cutlass_offload import recent_folders
    model, xs, out = env
    first = _compile(model, xs, out)
    other = tmp_path / "other"
    assert _compile(model, xs, other) == first           # linked from `out`
    assert _same(_saved_values(other), model)
    with open(out / weights.BIN, "r+b") as f:            # `out` damaged in place
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    third = tmp_path / "third"
    assert _compile(model, xs, third) != first             # the damaged file (both folders share it): written
    assert _same(_saved_values(third), model)
    recent = recent_folders._read(recent_folders._path())
    assert recent[0] == str(third.absolute())
    import shutil
    shutil.rmtree(third)
    shutil.rmtree(other)
    fourth = tmp_path / "fourth"
    _compile(model, xs, fourth)                            # gone folders are dropped from the list
    assert str(third.absolute()) not in recent_folders._read(recent_folders._path())
    assert _same(_saved_values(fourth), model)


def test_a_damaged_recent_list_is_ignored_and_rewritten(env, tmp_path):
    from cutlass_offload import recent_folders
    model, xs, out = env
    path = recent_folders._path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    _compile(model, xs, out)
    assert recent_folders._read(path) == [str(out.absolute())]
    _saved_values(out)
