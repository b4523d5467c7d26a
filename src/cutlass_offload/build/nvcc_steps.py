"""nvcc's own steps for one translation unit, run as a graph instead of a chain.

``nvcc -c`` of a CUDA unit for one gencode runs seven tools one after another
(``nvcc --dryrun`` lists them): host preprocessing -> cudafe++ (the host side),
device preprocessing -> cicc -> ptxas -> fatbinary (the device side), then the host
compiler on cudafe++'s output, which includes the stub cicc writes and the fatbinary.
The two sides meet only there and in one small file: cudafe++ writes a module id
(a per-unit name suffix for internal-linkage entities) that cicc reads. Written
beforehand and read by both, it lets the host side (preprocessing and cudafe++:
14.5 s of a 3-kernel sm_90a GEMM unit's 76.3 s on 2 cores, cudafe++ 13.4 of them) run
beside cicc (49 s) instead of before it: that unit's steps took 66.8 s as a graph
(nvcc 13.0; benchmarks/results/mlp_build_2core_nvcc_steps_2026-12-01.txt).

``run`` executes exactly the commands ``nvcc --dryrun`` prints (its environment
too), with two changes: cudafe++ reads the module id instead of generating it, and
the two sides overlap. A recipe it does not recognise (several gencodes, another
step list, a wrapper without ``--dryrun``) returns None: the caller runs nvcc as
usual. The default for local builds (``CUTLASS_OFFLOAD_NVCC_STEPS=0`` turns it off):
the objects differ from nvcc's only in the module id string, so they share nvcc's
cache keys; kernels built this way passed the GPU tests of 2026-12-01 (session 11:
the Inductor glue, causal attention and conv-choice tests, cold).
"""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .scratch import scratch_dir

RECIPE = ("host_pp", "cudafe", "dev_pp", "cicc", "ptxas", "fatbinary", "host_cc")
# nvcc's environment lines the steps need (the others are nvcc's own bookkeeping)
_ENV = ("PATH", "LD_LIBRARY_PATH", "CICC_PATH", "NVVMIR_LIBRARY_DIR", "TOP", "_HERE_", "_THERE_")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_MODULE_ID = re.compile(r'--module_id_file_name\s+("[^"]+"|\S+)')


@dataclass(frozen=True)
class Steps:
    """The recipe's commands (shell text, RECIPE order), the environment they run
    in, and the module id file both sides read."""

    commands: tuple
    env: dict
    module_id_file: str


def _kind(cmd: str) -> str:
    tool = os.path.basename(shlex.split(cmd)[0].replace("$CICC_PATH/", ""))
    if tool in ("cudafe++", "cicc", "ptxas", "fatbinary"):
        return {"cudafe++": "cudafe"}.get(tool, tool)
    args = f" {cmd} "
    if " -E " in args:
        return "dev_pp" if "-D__CUDA_ARCH__=" in args else "host_pp"
    return "host_cc" if " -c " in args else "?"


def _expand(value: str, env: dict) -> str:
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), ""), value)


def parse_dryrun(text: str, base_env: dict) -> Steps | None:
    """Steps from ``nvcc --dryrun`` output (its ``#$`` lines), or None when they are
    not the one-gencode recipe (RECIPE) with a module id shared by cudafe++ and cicc."""
    env, commands = dict(base_env), []
    for line in text.splitlines():
        if not line.startswith("#$ "):
            continue
        line = line[3:].strip()
        m = _ASSIGN.match(line)
        if m:
            if m.group(1) in _ENV:
                env[m.group(1)] = _expand(m.group(2).strip().strip('"'), env)
            continue
        commands.append(line)
    kinds = [_kind(c) for c in commands]
    if sorted(kinds) != sorted(RECIPE):
        return None
    commands = [commands[kinds.index(k)] for k in RECIPE]
    ids = [_MODULE_ID.findall(commands[RECIPE.index(k)]) for k in ("cudafe", "cicc")]
    if len(ids[0]) != 1 or ids[0] != ids[1] or "--gen_module_id_file" not in commands[1]:
        return None
    commands[1] = commands[1].replace("--gen_module_id_file ", "")
    return Steps(tuple(commands), env, ids[0][0].strip('"'))


# nvcc executables whose --dryrun gave no recipe (a wrapper, a stand-in): asked once,
# then compiled as one command without asking again
_NO_RECIPE: set = set()


def plan(cmd: list, keep_dir: str) -> Steps | None:
    """The Steps of ``cmd`` (an ``nvcc -c``) with intermediates in ``keep_dir``. nvcc's
    own ``-t`` is left out: it would only redirect each step's output to files."""
    if cmd[0] in _NO_RECIPE:
        return None
    cmd = [a for a in cmd if not re.fullmatch(r"-t\d+|--threads(=\d+)?", a)]
    try:
        out = subprocess.run(cmd + ["--dryrun", "--keep", "--keep-dir", keep_dir],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    steps = parse_dryrun(out.stdout + out.stderr, dict(os.environ)) if out.returncode == 0 else None
    if steps is None:
        _NO_RECIPE.add(cmd[0])
    return steps


def module_id(source: Path) -> str:
    """A module id unique to the unit's source text, in nvcc's form
    (``_<hash>_<len>_<name>_<tag>``)."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", source.name)
    return f"_{digest}_{len(stem)}_{stem}_co"


@dataclass
class StepsResult:
    ok: bool
    seconds: float
    peak_rss: int        # bytes, the largest step process
    log: str
    returncodes: tuple   # per step run, RECIPE order (None: not run)


def run(cmd: list, source: Path, log_path: Path | None = None,
        keep_dir: Path | None = None) -> StepsResult | None:
    """Compile like ``cmd`` (``nvcc -c source -o obj`` for one gencode) with the host
    and device sides overlapped; None when the recipe is not recognised (run ``cmd``
    itself then). Intermediates go to a temporary folder, removed after, or to
    ``keep_dir`` (kept; tests, debugging)."""
    t0 = time.perf_counter()
    with scratch_dir("co_nvcc_") as tmp:
        keep = str(keep_dir) if keep_dir is not None else tmp
        steps = plan(cmd, keep)
        if steps is None:
            return None
        Path(steps.module_id_file).write_text(module_id(source))
        codes = [None] * len(RECIPE)
        logs = [""] * len(RECIPE)
        peak = [0]
        failed = threading.Event()

        def step(i):
            if failed.is_set():
                return False
            proc = subprocess.Popen(["bash", "-c", steps.commands[i]], env=steps.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            out = proc.stdout.read()
            _, status, usage = os.wait4(proc.pid, 0)
            codes[i] = os.waitstatus_to_exitcode(status)
            logs[i] = out.decode(errors="replace")
            peak[0] = max(peak[0], usage.ru_maxrss * 1024)
            if codes[i] != 0:
                failed.set()
            return codes[i] == 0

        def host_side():
            step(0) and step(1)

        host = threading.Thread(target=host_side)
        host.start()
        ok = step(2) and step(3) and step(4) and step(5)
        host.join()
        ok = ok and codes[1] == 0 and step(6)
    log = "".join(f"[{RECIPE[i]}] exit {c}\n{logs[i]}" if c else logs[i]
                  for i, c in enumerate(codes) if c is not None)
    if log_path is not None:
        Path(log_path).write_text(log)
    return StepsResult(ok, time.perf_counter() - t0, peak[0], log, tuple(codes))
