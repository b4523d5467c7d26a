"""Scratch folders of builds (nvcc's steps, Ray tasks, tuning runs): removed on exit,
and the ones a killed process left are removed by the next build, never a live one's."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cutlass_offload.build import scratch


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _folder(root: Path, name: str, age_s: float) -> Path:
    d = root / name
    d.mkdir()
    (d / "unit.ii").write_bytes(b"x" * 100)
    t = time.time() - age_s
    os.utime(d, (t, t))
    return d


def test_sweep_removes_only_what_dead_processes_left(tmp_path):
    hour, day = scratch.MIN_AGE_S, scratch.STALE_SECONDS
    dead = _dead_pid()
    gone = [_folder(tmp_path, f"co_nvcc_{dead}_a1", hour + 60),
            _folder(tmp_path, "co_nvcc_oldstyle1", day + 60)]          # an older version's name
    kept = [_folder(tmp_path, f"co_nvcc_{dead}_b2", hour - 60),          # maybe a reused PID's
            _folder(tmp_path, f"co_nvcc_{os.getpid()}_c3", day + 60),    # this process
            _folder(tmp_path, f"co_nvcc_{os.getppid()}_d4", day + 60),   # a live process
            _folder(tmp_path, "co_nvcc_oldstyle2", day - 60),
            _folder(tmp_path, f"other_{dead}_e5", day + 60)]             # another prefix
    (tmp_path / f"co_nvcc_{dead}_file").write_text("not a folder")
    assert sorted(scratch.sweep(tmp_path, "co_nvcc_")) == sorted(gone)
    assert not any(p.exists() for p in gone) and all(p.exists() for p in kept)
    assert (tmp_path / f"co_nvcc_{dead}_file").exists()


def test_scratch_dir_is_named_for_its_process_and_removed_on_exit(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch.tempfile, "gettempdir", lambda: str(tmp_path))
    with pytest.raises(RuntimeError):
        with scratch.scratch_dir("co_nvcc_") as d:
            assert Path(d).parent == tmp_path and Path(d).name.startswith(f"co_nvcc_{os.getpid()}_")
            (Path(d) / "unit.o").write_bytes(b"\0")
            raise RuntimeError("nvcc failed")
    assert list(tmp_path.iterdir()) == []


def test_a_build_killed_with_sigkill_leaves_a_folder_the_next_one_removes(tmp_path):
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import tempfile; "
            "tempfile.tempdir = sys.argv[2]; from cutlass_offload.build import scratch\n"
            "with scratch.scratch_dir('co_nvcc_') as d:\n"
            "    open(d + '/unit.ii', 'w').write('x'); print(d, flush=True); time.sleep(60)\n")
    src = str(Path(scratch.__file__).resolve().parents[2])
    p = subprocess.Popen([sys.executable, "-c", code, src, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    left = Path(p.stdout.readline().strip())
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert left.exists()                                   # kill -9 skipped the cleanup
    assert scratch.sweep(tmp_path, "co_nvcc_") == []       # too young: maybe a reused PID
    assert scratch.sweep(tmp_path, "co_nvcc_", now=time.time() + scratch.MIN_AGE_S + 1) == [left]
    assert not left.exists()
