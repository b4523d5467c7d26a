"""Fault tests (issue 20), without nvcc or a GPU: compiles killed with SIGKILL at
random points, two processes compiling one model into one cache and one output
folder at once, and a full disk. The fake nvcc (tests/fake_nvcc.py) writes its
outputs slowly, in chunks, so kills land inside writes; tests/fault_worker.py
forks the compiles from one process that imported torch once.

After any of these: every committed cache entry matches its recorded files, the
output folder is either absent, the one before, or complete and intact, and the
next compile gives the library an undisturbed compile gives.
Set CUTLASS_OFFLOAD_FAULT_SEED to replay one run's kill times."""
import collections
import errno
import json
import os
import random
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import cutlass_offload as co
from cutlass_offload.errors import DiskFullError
from fault_helpers import (LIB, TESTS, committed_entries, damaged_entries, fake_env, nvcc_calls,
                           small_model)


class Worker:
    def __init__(self, folder: Path):
        env = dict(os.environ, **fake_env(folder, delay=0.2))
        self.err = open(folder / "worker.err", "w")
        self.proc = subprocess.Popen([sys.executable, str(TESTS / "fault_worker.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, env=env)
        assert self._reply(120)["ready"]

    def _reply(self, timeout) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        assert line, f"fault worker gave no answer: {Path(self.err.name).read_text()[-2000:]}"
        return json.loads(line)

    def __call__(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._reply(300)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.err.close()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = Worker(tmp_path_factory.mktemp("worker"))
    yield w
    w.close()


def _env(root: Path) -> dict:
    # TMPDIR too: a compile killed with SIGKILL cannot remove its scratch folders
    # (co_nvcc_<pid>_*: build/scratch.py; a later build sweeps them only after an
    # hour) nor the fake nvcc's host compiler its cc* files, so they go under the
    # test's tmp_path instead of the system's /tmp
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    return {"CUTLASS_OFFLOAD_CACHE_DIR": str(root / "cache"), "FAKE_NVCC_LOG": str(root / "nvcc.log"),
            "TMPDIR": str(root / "tmp")}


def _dead_scratch_dirs() -> set:
    """nvcc's scratch folders in the system temp dir whose process is gone."""
    from cutlass_offload.build.scratch import _alive, _pid
    return {p for p in Path(tempfile.gettempdir()).glob("co_nvcc_*")
            if (pid := _pid(p.name[len("co_nvcc_"):])) is not None and not _alive(pid)}


def _folder_state(out: Path) -> str:
    """"absent" or "intact"; anything else fails the check."""
    if not out.exists():
        return "absent"
    co.check_folder(out)
    return "intact"


def test_kill_9_at_random_points_then_recompile(worker, tmp_path):
    leaked_before = _dead_scratch_dirs()
    seed = int(os.environ.get("CUTLASS_OFFLOAD_FAULT_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    # the reference duration: the faster of two undisturbed cold compiles (the first
    # child also reads the modules torch imports lazily from disk: slower than the rest)
    refs = [worker(op="run", out=str(tmp_path / f"ref{j}"), env=_env(tmp_path / f"ref_cache{j}"))
            for j in range(2)]
    for ref in refs:
        assert ref["exit"] == 0 and not ref["killed"], Path(worker.err.name).read_text()[-2000:]
    ref = min(refs, key=lambda r: r["seconds"])
    want = (tmp_path / "ref0" / LIB).read_bytes()
    assert (tmp_path / "ref1" / LIB).read_bytes() == want
    out = tmp_path / "out"
    shutil.copytree(tmp_path / "ref0", out)           # kills during save meet an earlier folder
    rounds, killed = 6, 0
    for i in range(rounds):
        # one point in each sixth of the last 70% of a cold compile (the first part is
        # torch.export's capture, which writes nothing): shards, launchers, link, save
        share = 0.3 + 0.7 * (i + rng.random()) / rounds
        delay = ref["seconds"] * share
        root = tmp_path / f"round{i}"
        r = worker(op="run", out=str(out), delay=delay, env=_env(root))
        if not r["killed"]:
            # this compile outran the reference: once more, at the same share of its time
            root = tmp_path / f"round{i}b"
            delay = r["seconds"] * share * 0.95
            r = worker(op="run", out=str(out), delay=delay, env=_env(root))
        killed += r["killed"]
        what = f"seed {seed}, round {i}, killed after {delay:.2f} of {ref['seconds']:.2f} s"
        assert damaged_entries(root / "cache") == [], what
        assert all(meta.get("ok") for _, meta, _ in committed_entries(root / "cache")), what
        _folder_state(out)                            # the earlier folder or the new one, whole
        again = worker(op="run", out=str(out), env=_env(root))
        assert again["exit"] == 0 and not again["killed"], what
        assert _folder_state(out) == "intact", what
        assert (out / LIB).read_bytes() == want, what
        assert damaged_entries(root / "cache") == [], what
    assert killed >= rounds // 2, f"seed {seed}: most compiles ended before their kill"
    co.load(out)
    assert _dead_scratch_dirs() <= leaked_before     # the killed compiles' went under tmp_path


def test_two_processes_compile_one_model_into_one_cache_and_folder(worker, tmp_path):
    root, out = tmp_path / "both", tmp_path / "out"
    r = worker(op="together", outs=[str(out), str(out)], env=_env(root))
    assert r["exits"] == [0, 0], Path(worker.err.name).read_text()[-2000:]
    calls = collections.Counter(nvcc_calls(root))
    assert calls and all(n == 1 for n in calls.values()), calls     # one compiled, the other waited
    assert damaged_entries(root / "cache") == []
    assert not list((root / "cache").glob("*/.staging-*"))
    co.check_folder(out)
    assert not list(tmp_path.glob(".out.*"))          # the temporary folders of both saves gone
    co.load(out)


# -- a full disk ---------------------------------------------------------------------

@pytest.fixture
def fake(tmp_path, monkeypatch):
    for k, v in fake_env(tmp_path / "tool").items():
        monkeypatch.setenv(k, v)
    return tmp_path / "tool"


def _nothing_cached(tool: Path):
    assert committed_entries(tool / "cache") == []
    assert not list((tool / "cache").glob("*/.staging-*"))


def test_disk_full_in_nvcc_is_a_clear_error_and_caches_nothing(fake, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NVCC_ENOSPC", "1")
    model, x = small_model()
    with pytest.raises(DiskFullError, match=r"out of disk space writing \S+/cache/obj; .* failed with "
                                            r"\"No space left on device\"; free space there, or point "
                                            r"CUTLASS_OFFLOAD_CACHE_DIR"):
        co.compile(model, x, arch="sm_80", out_dir=tmp_path / "out")
    _nothing_cached(fake)                 # in particular no "failed to compile" entry
    assert not (tmp_path / "out").exists()
    monkeypatch.delenv("FAKE_NVCC_ENOSPC")
    co.compile(model, x, arch="sm_80", out_dir=tmp_path / "out")  # room again: it just works
    co.check_folder(tmp_path / "out")


def test_disk_full_while_publishing_leaves_no_entry(fake, monkeypatch):
    real = Path.write_text

    def full(self, *a, **k):
        if self.name == "meta.json.tmp":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)
    monkeypatch.setattr(Path, "write_text", full)
    model, x = small_model()
    with pytest.raises(DiskFullError, match="out of disk space writing .*nothing was cached"):
        co.compile(model, x, arch="sm_80")
    _nothing_cached(fake)


def test_no_room_for_the_folder_leaves_the_earlier_one(fake, tmp_path, monkeypatch):
    model, x = small_model()
    out = tmp_path / "out"
    co.compile(model, x, arch="sm_80", out_dir=out)
    before = json.loads((out / "manifest.json").read_text())["save_id"]

    class Stat:                  # a writable disk file system with 64 KiB free
        f_frsize, f_bavail, f_blocks, f_flag = 4096, 16, 1 << 20, 0
    monkeypatch.setattr(os, "statvfs", lambda p: Stat)        # checked before anything is written
    with pytest.raises(DiskFullError, match=f"out of disk space writing {out}; the folder needs about "
                       r"0\.\d MiB, plus 64 MiB kept free"):
        co.compile(model, x, arch="sm_80", out_dir=out)
    assert json.loads((out / "manifest.json").read_text())["save_id"] == before
    co.check_folder(out)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_disk_full_during_save_leaves_the_earlier_folder(fake, tmp_path, monkeypatch):
    """The disk fills while the folder is written: torch's own writer on a full
    device (/dev/full) fails as on a real full disk; statvfs then says so."""
    import torch
    model, x = small_model()
    out = tmp_path / "out"
    co.compile(model, x, arch="sm_80", out_dir=out)
    before = json.loads((out / "manifest.json").read_text())["save_id"]
    real_save, calls = torch.save, []

    def statvfs(p):
        calls.append(p)

        class S:
            f_frsize, f_bavail = 4096, (1 << 30) if len(calls) == 1 else 1
            f_blocks, f_flag = 1 << 30, 0
        return S
    monkeypatch.setattr(os, "statvfs", statvfs)
    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: real_save(obj, "/dev/full"))
    with pytest.raises(DiskFullError, match=f"out of disk space writing {out}; free space"):
        co.compile(model, x, arch="sm_80", out_dir=out)
    assert json.loads((out / "manifest.json").read_text())["save_id"] == before
    co.check_folder(out)
    assert not list(tmp_path.glob(".out.*"))


def test_a_missing_folder_is_named_as_missing(tmp_path):
    """co.load / check_folder of a path that does not exist say so; an existing folder
    without a manifest is "not a complete output folder"."""
    import cutlass_offload as co
    from cutlass_offload.errors import CutlassOffloadError
    with pytest.raises(CutlassOffloadError, match="does not exist"):
        co.load(tmp_path / "nowhere")
    with pytest.raises(CutlassOffloadError, match="does not exist"):
        co.check_folder(tmp_path / "nowhere")
    with pytest.raises(CutlassOffloadError, match="not a complete cutlass-offload output folder"):
        co.load(tmp_path)


def test_a_parent_of_output_folders_names_them(tmp_path):
    """``cutlass-offload run out`` for out/mlp: the error names the folders inside."""
    import cutlass_offload as co
    from cutlass_offload.errors import CutlassOffloadError
    (tmp_path / "mlp").mkdir()
    (tmp_path / "mlp" / "manifest.json").write_text("{}")
    (tmp_path / "other").mkdir()                                 # no manifest: not named
    with pytest.raises(CutlassOffloadError, match=r"not an output folder itself .* holds .*mlp: pass one") as e:
        co.load(tmp_path)
    assert "other" not in str(e.value)
