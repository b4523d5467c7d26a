"""The build tier's heavy sm_90a builds, run ahead of their tests in two worker processes.

A CUTLASS 3.x unit takes about a minute of one core on the 2-core CI machine (cicc is
one thread; nvcc -t2 barely helps), and the tier compiled them one after another
beside nothing: its user + sys time was 1.27x its wall time (18 min). conftest.py's
session fixture ``build_ahead`` starts two workers (this file run as a script) at the
tier's first test; they compile the builds in ITEMS, in that order, into the tier's
kernel cache while the tier's other tests run. A test that uses one calls
``Ahead.wait(item)`` and then runs its own build as before, which finds its kernel
units in the cache: the worker ran the test's own build function (the same plan), or
the same model compile, whose kernel units the test's compile reuses (the kernel
index, build.sharded) and whose launchers and library then hit the cache too.
Nothing is checked differently: a kernel that fails to compile in a worker is cached
as failed, as the test's own compile would cache it, and a worker that dies or
raises leaves the test to compile the rest itself. At most two 3.x compiles (about
6 GB each) run at once, beside the tier's small ones.

An item: (its users: test modules, or "module::test" for one test of a module; the
function that builds it). Items of tests the session does not run are not built. A
worker claims an item by creating ``<item>.claim`` (O_EXCL) holding its pid, runs it,
then writes ``<item>.done`` ("ok" or the traceback)."""
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKERS = 2


def _staged_forms(cache_dir):
    import staged_forms
    staged_forms.build(cache_dir)


def _hopper_fmha(cache_dir):
    import hopper_fmha
    hopper_fmha.build(cache_dir)


def _sm90a_wgmma(cache_dir):
    import test_build
    test_build.compile_sm90a()


def _conv_gemm(cache_dir):
    import test_conv_gemm_build
    test_conv_gemm_build.build_lowered(cache_dir)


def _per_sample(cache_dir):
    import test_per_sample_build
    test_per_sample_build.compile_time_embedding()


def _swap_ab(cache_dir):
    import test_swap_ab_build
    test_swap_ab_build.compile_projection()


def _cluster_gemm(cache_dir):
    import test_cluster_gemm_build
    test_cluster_gemm_build.compile_projection()


def _tune_candidates(cache_dir):
    import test_tune_build
    test_tune_build.build_candidates(cache_dir)


# in the order the workers take them: the staged forms first (its planner's memory
# estimate, about 12 GiB for one unit, is best met before anything else compiles),
# then about as the tests use them; the stream-K + persistent candidates (two units,
# the longest item) last, for the last test file. Users: test modules, or
# "module::test" for one test of a module.
ITEMS = {
    "staged_forms": (("test_glu_staged_build", "test_staged_epilogue_build"), _staged_forms),
    "hopper_fmha": (("test_attention_lpt_build", "test_attention_sm90_build",
                     "test_attention_staged_epilogue_build"), _hopper_fmha),
    "sm90a_wgmma": (("test_build::test_sm90a_kernel_compiles_to_wgmma",), _sm90a_wgmma),
    "conv_gemm": (("test_conv_gemm_build",), _conv_gemm),
    "per_sample": (("test_per_sample_build",), _per_sample),
    "swap_ab": (("test_swap_ab_build",), _swap_ab),
    "cluster_gemm": (("test_cluster_gemm_build",), _cluster_gemm),
    "tune_candidates": (("test_tune_build",), _tune_candidates),
}


class Ahead:
    """The workers of one session (``conftest.build_ahead``): ``tests`` are the
    session's tests of this folder as "module::test" names; ``workers`` 0 runs
    nothing ahead (every test compiles its own, as the tier did before)."""

    def __init__(self, cache_dir: Path, folder: Path, tests, workers: int = WORKERS):
        self.folder = folder
        tests = set(tests)
        modules = {t.split("::")[0] for t in tests}
        self.items = [name for name, (users, _) in ITEMS.items()
                      if workers > 0 and set(users) & (modules | tests)]
        self.procs = []
        if not self.items:
            return
        env = {**os.environ, "CUTLASS_OFFLOAD_CACHE_DIR": str(cache_dir)}
        for i in range(min(workers, len(self.items))):
            log = open(folder / f"worker{i}.log", "wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), str(cache_dir), str(folder), *self.items],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            log.close()

    def wait(self, item: str):
        """Until ``item`` is built, its worker is gone, or it was never run ahead."""
        if item not in self.items:
            return
        done, claim = self.folder / f"{item}.done", self.folder / f"{item}.claim"
        while not done.exists():
            alive = {str(p.pid) for p in self.procs if p.poll() is None}
            if not alive:
                return
            if claim.exists():
                owner = claim.read_text().strip()
                if owner and owner not in alive and not done.exists():
                    _kill_group(int(owner))          # its worker died: the nvcc it left
                    return
            time.sleep(0.5)

    def close(self):
        """Stop the workers still running and their nvcc processes (items whose tests
        did not run: deselected, or the session stopped early)."""
        for p in self.procs:
            if p.poll() is None:
                _kill_group(p.pid)
            p.wait()


def _kill_group(pid: int):
    """SIGKILL the process group a worker leads (itself, its nvcc and their children)."""
    import signal
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_with_the_session(parent: int):
    """Stop this worker and its nvcc processes (its process group) once the pytest
    process that started it is gone (killed: no ``Ahead.close``)."""
    import signal
    import threading

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os.killpg(os.getpgrp(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True).start()


def _work(cache_dir: Path, folder: Path, items):
    _exit_with_the_session(os.getppid())
    for name in items:
        try:
            fd = os.open(folder / f"{name}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue                               # the other worker has it
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        t0 = time.perf_counter()
        try:
            ITEMS[name][1](cache_dir)
            status = "ok"
        except Exception:                          # the test's own build reports it
            status = traceback.format_exc()
        print(f"build_ahead: {name} in {time.perf_counter() - t0:.1f} s: {status}", flush=True)
        tmp = folder / f"{name}.done.tmp"
        tmp.write_text(status)
        os.replace(tmp, folder / f"{name}.done")


if __name__ == "__main__":
    sys.path[:0] = [str(HERE), str(HERE.parent)]       # build_helpers, staged_forms; helpers
    _work(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
