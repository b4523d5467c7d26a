"""A process that forks compiles for tests/unit/test_faults.py to kill.

Imports torch once, then reads JSON commands on stdin, one a line, and answers
each with one JSON line on stdout:

* {"op": "run", "out": DIR, "delay": S, "env": {...}}: fork a child that sets
  ``env`` (e.g. CUTLASS_OFFLOAD_CACHE_DIR, FAKE_NVCC_LOG, TMPDIR) and compiles
  fault_helpers.small_model() into DIR (nvcc and the rest from the environment);
  after S seconds (none: wait) SIGKILL its process group (the child and the fake
  nvcc processes it started) unless it has ended. Answers {"killed", "exit",
  "seconds"}: seconds from the fork to the end of an unkilled compile.
* {"op": "together", "outs": [DIR, ...], "env": {...}}: fork one such child per DIR
  at once, wait for all. Answers {"exits": [...]}.
"""
import json
import os
import signal
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import cutlass_offload as co  # noqa: E402
from fault_helpers import small_model  # noqa: E402


def _child(out: str, env: dict) -> None:
    os.setpgid(0, 0)                # its own group: the kill reaches the nvcc it started
    code = 1
    try:
        os.environ.update(env)
        tempfile.tempdir = None     # read $TMPDIR again (the test points it at its tmp_path)
        torch.set_num_threads(1)    # forked: no OpenMP pool inherited in use
        model, x = small_model()
        co.compile(model, x, arch="sm_80", out_dir=out)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _fork(out: str, env: dict) -> int:
    pid = os.fork()
    if pid == 0:
        _child(out, env)
    try:
        os.setpgid(pid, pid)        # here too: a kill may come before the child's own call
    except (PermissionError, ProcessLookupError):    # the child was first (or is gone)
        pass
    return pid


def _run(out: str, delay, env: dict) -> dict:
    t0 = time.monotonic()
    pid = _fork(out, env)
    status = None
    while delay is None or time.monotonic() - t0 < delay:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        time.sleep(0.002)
    seconds = time.monotonic() - t0
    killed = status is None
    if killed:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    return {"killed": killed, "exit": os.waitstatus_to_exitcode(status), "seconds": seconds}


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "run":
            reply = _run(cmd["out"], cmd.get("delay"), cmd.get("env", {}))
        elif cmd["op"] == "together":
            pids = [_fork(out, cmd.get("env", {})) for out in cmd["outs"]]
            reply = {"exits": [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]}
        else:
            reply = {"error": f"unknown op {cmd['op']!r}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
