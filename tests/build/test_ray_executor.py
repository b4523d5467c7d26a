"""Build tier: shard compiles as Ray tasks on a real loopback Ray cluster.

One module-scoped cluster (tests/ray_cluster.py): a head without CPUs (the test
process is its driver) and one worker node with one CPU, every address on
127.0.0.1. The worker's nvcc is a wrapper script whose behaviour a mode file
selects: "ok" runs the real nvcc, "mismatch" reports another CUDA release to
``nvcc --version``, "kill" kills the Ray worker process running the task a second
into the compile. The plans hold one small 2.x sm_80 GEMM kernel (about 20 s on 2
cores); the mismatch and kill builds reuse that kernel's cached shard and only
compile their own launchers.
"""
import ctypes
import importlib.util
import os
import re
import shutil
import stat
import struct
import subprocess

import pytest
import torch
from torch import nn

from cutlass_offload import emit
from cutlass_offload.build import build
from cutlass_offload.build.cache import BuildCache
from cutlass_offload.build.executor import LocalExecutor, RayExecutor
from cutlass_offload.capture import capture
from cutlass_offload.partition import partition
from cutlass_offload.select import select

pytestmark = [pytest.mark.build,
              pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                 reason="Ray is not installed: pip install 'cutlass_offload[ray]'")]

# cicc's per-compile names of internal-linkage device symbols (see the first test)

WRAPPER = """#!/bin/bash
# nvcc stand-in of the test's Ray worker: the mode file says how to misbehave
mode=$(cat '{mode}' 2>/dev/null)
if [ "$1" = "--version" ] && [ "$mode" = mismatch ]; then
  echo "nvcc: NVIDIA (R) Cuda compiler driver"
  echo "Cuda compilation tools, release 12.0, V12.0.140"
  echo "Build cuda_12.0.r12.0/compiler.32267302_0"
  exit 0
fi
if [ "$1" != "--version" ] && [ "$mode" = kill ]; then
  sleep 1
  kill -9 $PPID          # the Ray worker process running the task
  exit 1
fi
exec '{nvcc}' "$@"
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(address, mode file) of a running loopback cluster; stopped at the end."""
    import ray
    from ray._private import ray_constants
    from ray_cluster import LoopbackCluster
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    d = tmp_path_factory.mktemp("ray")
    mode = d / "nvcc_mode"
    mode.write_text("ok")
    wrapper = d / "nvcc"
    wrapper.write_text(WRAPPER.format(mode=mode, nvcc=nvcc))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    old_env = os.environ.get("RAY_USAGE_STATS_ENABLED")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # the driver's own node address: 127.0.0.1 (see tests/ray_loopback_node.py)
    old_mode, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    c = LoopbackCluster()
    try:
        c.start_head()
        c.add_worker({"CUTLASS_OFFLOAD_NVCC": str(wrapper)})
        ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
        c.wait_cpus(ray, 1)
        yield c.address, mode
    finally:
        ray.shutdown()
        c.stop()
        ray_constants.ENABLE_RAY_CLUSTER = old_mode
        if old_env is None:
            os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
        else:
            os.environ["RAY_USAGE_STATS_ENABLED"] = old_env


@pytest.fixture
def nvcc_mode(cluster):
    """Set the worker's nvcc mode for one test; back to "ok" after it."""
    _, mode = cluster

    def set_mode(m):
        mode.write_text(m)
    yield set_mode
    mode.write_text("ok")


def _plan(layers):
    """``layers`` Linear(64, 64) regions sharing one 2.x sm_80 kernel (bias epilogue)."""
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(layers)]).half()
    plan = select(partition(capture(model, (torch.randn(4, 64).half(),)).graph_module), "sm80")
    assert len(plan.distinct_kernels) == 1 and len(plan.regions) == layers
    return plan


@pytest.fixture(scope="module")
def ray_build(cluster, tmp_path_factory):
    """A one-kernel plan built through Ray into its own cache (jobs=1: one shard)."""
    root = tmp_path_factory.mktemp("ray_cache")
    res = build(_plan(1), "sharded", BuildCache(root), jobs=1, executor=RayExecutor(cluster[0]))
    return res, root


def _check_library(res):
    lib = ctypes.CDLL(str(res.library))
    for r in res.plan.regions:
        getattr(lib, emit.region_symbol(r.name))
        getattr(lib, emit.region_symbol(r.name) + "_workspace")


def test_build_through_ray_matches_a_local_build(ray_build, tmp_path, monkeypatch):
    """The library built through Ray has the same content as one built here.

    nvcc objects are not byte-reproducible even on one machine: two compiles of the
    same unit.cu in two folders differ (checked with nvcc 13.0) in (1) the host
    symbol nvcc names after its temporary file (``tmpxft_<pid>_...cudafe1.cpp``)
    and (2) the device line info (``-lineinfo``: DWARF .debug_line of the cubin
    records the compile folder and the source's mtime), (3) the names cicc gives
    internal-linkage device symbols and anonymous namespaces
    (``_INTERNAL_<hash>_7_unit_cu_<hash>_<n>``, ``_GLOBAL__N__<hash>_7_unit_cu_...``,
    in the cubin's .strtab). So "identical in content" is: the same exported symbols,
    the same host code (.text), and every cubin embedded in the library identical
    section by section, debug sections aside and those names normalized.
    """
    ray_res, _ = ray_build
    # the same compiler for every unit on both sides (a local build compiles its
    # launchers with the host compiler by default, a Ray build through nvcc)
    monkeypatch.setenv("CUTLASS_OFFLOAD_HOST_LAUNCHERS", "0")
    # and the same nvcc invocation: a Ray task runs nvcc as one command (a local build
    # runs its steps as a graph by default, build/nvcc_steps.py)
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC_STEPS", "0")
    local_res = build(_plan(1), "sharded", BuildCache(tmp_path / "local"), jobs=1,
                      executor=LocalExecutor())
    assert [u.executor.split(" ")[0] for u in ray_res.compiled] == ["ray"] * len(ray_res.compiled)
    assert {u.executor for u in local_res.compiled} == {"local"}
    assert sorted(u.name for u in ray_res.units) == sorted(u.name for u in local_res.units)
    assert _exports(ray_res.library) == _exports(local_res.library)
    ray_lib, local_lib = ray_res.library.read_bytes(), local_res.library.read_bytes()
    ray_text, local_text = _sections(ray_lib)[".text"], _sections(local_lib)[".text"]
    assert len(ray_text) == len(local_text)
    ray_host, local_host = _host_code(ray_res.library), _host_code(local_res.library)
    if ray_host is None:                      # no objdump: the bytes themselves
        assert ray_text == local_text
    else:
        assert ray_host and ray_host == local_host
    ray_dev, local_dev = _device_code(ray_lib), _device_code(local_lib)
    assert ray_dev and ray_dev == local_dev
    _check_library(ray_res)
    assert "executor" in ray_res.to_dict()["units"][0]
    assert "ray (" in ray_res.format()


def test_mismatched_worker_builds_the_unit_here(cluster, ray_build, nvcc_mode):
    """A worker whose nvcc reports another release: each task fails before compiling
    and the unit is built here, the reason in the report; the kernel shard built
    through Ray earlier is reused from the cache."""
    _, root = ray_build
    nvcc_mode("mismatch")
    res = build(_plan(2), "sharded", BuildCache(root), jobs=1, executor=RayExecutor(cluster[0]))
    (unit,) = res.compiled                          # the launchers; the kernel is cached
    assert unit.name == "launchers"
    assert unit.executor.startswith("local (ray: ToolchainMismatch")
    assert "release 12.0" in unit.executor or "12.0" in unit.executor
    meta = (BuildCache(root).root / "obj").glob("launchers.*/meta.json")
    assert any("ToolchainMismatch" in m.read_text() for m in meta)
    _check_library(res)


def test_killed_task_is_built_here(cluster, ray_build, nvcc_mode):
    """The Ray worker dies in the middle of the compile (after Ray's retry too):
    the unit is compiled here and the build finishes; nothing half-written is left."""
    _, root = ray_build
    nvcc_mode("kill")
    res = build(_plan(3), "sharded", BuildCache(root), jobs=1, executor=RayExecutor(cluster[0]))
    (unit,) = res.compiled
    assert unit.executor.startswith("local (ray: ") and "Mismatch" not in unit.executor
    _check_library(res)
    assert not list((root / "obj").glob(".staging-*"))


def test_ray_processes_use_only_the_loopback_address(cluster):
    """Every TCP socket of the cluster's processes (raylet, gcs_server, ray::
    workers) listens on and connects to 127.0.0.1 only."""
    ss = shutil.which("ss")
    if ss is None:
        pytest.skip("ss (iproute2) not installed")
    lines = subprocess.run([ss, "-tanp"], capture_output=True, text=True, check=True).stdout.splitlines()
    ours = [l for l in lines if any(p in l for p in ('"raylet"', '"gcs_server"', '"ray::'))]
    assert ours, "no Ray process sockets seen"
    # a listening socket's peer column is a wildcard: only its own address counts
    bad = [l for l in ours if any(not _loopback(a) for a in l.split()[3:4 if l.startswith("LISTEN") else 5])]
    assert not bad, "\n".join(bad)


def _loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "::ffff:127.0.0.1", "::1") or host.startswith("127.")


def _exports(path):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not installed")
    text = subprocess.run([nm, "-D", "--defined-only", str(path)], capture_output=True, text=True,
                          check=True).stdout
    return sorted(l.split()[-1] for l in text.splitlines() if l.split())


def _sections(data: bytes, base: int = 0) -> dict:
    """{name: bytes} of an ELF64 little-endian image starting at ``base``."""
    shoff, = struct.unpack_from("<Q", data, base + 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, base + 0x3A)
    heads = []
    for i in range(shnum):
        h = base + shoff + i * shentsize
        name, kind = struct.unpack_from("<II", data, h)
        off, size = struct.unpack_from("<QQ", data, h + 24)
        heads.append((name, kind, off, size))
    names = base + heads[shstrndx][2]
    out = {}
    for name, kind, off, size in heads:
        label = data[names + name:data.index(b"\0", names + name)].decode()
        out[label] = b"" if kind == 8 else data[base + off:base + off + size]   # 8: SHT_NOBITS
    return out


def _host_code(lib) -> list | None:
    """The library's host instructions (``objdump -d`` of .text) with every number
    written as X, or None without objdump. nvcc registers each kernel with the CUDA
    runtime by its name, and the names cicc gives internal-linkage symbols carry
    hashes that differ between compiles (see ``_device_code``), so those strings'
    lengths in .rodata, and with them the RIP-relative displacements in .text, can
    differ by a few bytes (one CI run of 2026-12-01: one byte at .text offset 633,
    0x3f against 0x27): the same code, not the same bytes."""
    objdump = shutil.which("objdump")
    if objdump is None:
        return None
    out = subprocess.run([objdump, "-d", "-j", ".text", "--no-show-raw-insn", str(lib)],
                         capture_output=True, text=True, check=True).stdout
    code = []
    for line in out.splitlines():
        if not re.match(r"\s+[0-9a-f]+:\t", line):
            continue
        insn = line.split(":", 1)[1].split("#", 1)[0]             # objdump's target comment
        insn = re.sub(r"\b[0-9a-f]+ <[^>]*>", "X", insn)          # call / jump targets
        code.append(re.sub(r"0x[0-9a-f]+", "X", insn).strip())    # displacements, immediates
    return code


# an internal name with the decimal length prefix a mangled name gives it: the temporary
# file's pid in it may have another number of digits on the other side
INTERNAL_NAME = re.compile(r"\d*(?:_INTERNAL|_GLOBAL__N_)_[0-9a-f]{8}_\d+_\w+?_cu_[0-9a-f]{8}_\d+")


def _device_code(lib: bytes) -> list:
    """Every cubin in the library's .nv_fatbin: its code sections (``.text.<kernel>``,
    internal names normalized). Not the symbol and string tables: a pid of another
    digit count in an internal name shifts every later string offset."""
    fatbin = _sections(lib)[".nv_fatbin"]
    cubins, at = [], fatbin.find(b"\x7fELF")
    while at >= 0:
        cubins.append({INTERNAL_NAME.sub("_INTERNAL_", k): v for k, v in _sections(fatbin, at).items()
                       if k.startswith(".text")})
        at = fatbin.find(b"\x7fELF", at + 4)
    return cubins
