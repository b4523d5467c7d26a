"""A Ray cluster on 127.0.0.1 made of processes this test session starts and stops.

Every Ray process runs with RAY_USAGE_STATS_ENABLED=0 and the single-machine mode
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's node address is then 127.0.0.1, see
ray_loopback_node.py), in a private --temp-dir, with a small object store. Each node
is one ``ray start --block`` in its own process group, stopped by signalling that
group: never ``ray stop`` (it stops every Ray on the machine).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCHER = str(Path(__file__).with_name("ray_loopback_node.py"))
LOOPBACK_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
OBJECT_STORE = str(200 * 2**20)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackCluster:
    """head (no CPUs: it schedules, the driver lives there) + worker nodes."""

    def __init__(self):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # short: Ray's unix socket paths live under it (108-byte limit)
        self.temp = tempfile.mkdtemp(prefix="co_ray_", dir="/tmp")
        self.procs = []

    def _start(self, args, env_extra=None, log="node"):
        env = dict(os.environ, **LOOPBACK_ENV, **(env_extra or {}))
        # the node writes to it until stop(): no context manager here
        out = open(os.path.join(self.temp, f"{log}.out"), "w")  # noqa: SIM115
        p = subprocess.Popen([sys.executable, LAUNCHER, "start", "--block", "--node-ip-address=127.0.0.1",
                              f"--object-store-memory={OBJECT_STORE}", "--disable-usage-stats", *args],
                             env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def start_head(self):
        self._start(["--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false",
                     f"--temp-dir={self.temp}"], log="head")
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"Ray head did not start (log: {self.temp}/head.out)")

    def add_worker(self, env_extra=None, cpus=1, name="worker"):
        return self._start([f"--address={self.address}", f"--num-cpus={cpus}"], env_extra, log=name)

    def wait_cpus(self, ray, cpus, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if ray.cluster_resources().get("CPU", 0) >= cpus:
                return
            time.sleep(0.2)
        raise RuntimeError(f"Ray workers did not join (logs: {self.temp})")

    def stop(self):
        """Stop every node this object started (nothing to drain: SIGTERM, 3 s, SIGKILL)."""
        for p in reversed(self.procs):          # workers first, then the head
            _signal_group(p, signal.SIGTERM)
        deadline = time.time() + 3
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:                     # what is left of our groups only
            _signal_group(p, signal.SIGKILL)
            p.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


def _signal_group(p, sig):
    try:
        os.killpg(p.pid, sig)       # the group of this `ray start` only (start_new_session)
    except ProcessLookupError:
        pass
