"""Inductor's check of the host CPU's vector ISAs, started early in background threads.

torch 2.11's Inductor picks the host CPU's vector ISA (``cpu_vec_isa.pick_vec_isa``)
for the compile flags of a C++ wrapper even when the graph has no C++ kernels: for
each ISA the CPU advertises it compiles a test program and loads it in a Python
subprocess, one after another (torch 2.13 skips this where the source does not need
it). With an empty Inductor cache that took 38.3 of bert-base's 51.1 s first call
through our glue's C++ wrapper on an H100 host (session 49,
``benchmarks/results/cpp_wrapper_isa_check_bert_2026-12-07_h100_s49.txt``; 10.3 of
47.5 s in session 46's profile). Skipping the check (``cpp.vec_isa_ok=False``) broke
glue graphs with C++ kernels, so it is run instead, earlier and in parallel: one
daemon thread per ISA evaluates ``bool(isa)``, which Inductor caches per ISA
(``VecISA.__bool__impl``), so the compile that needs the answer finds it computed
or waits on the check's own file lock. ``start`` returns at once and runs the
threads once per process; a failure in a thread is left to Inductor's own check.
Measured (session 50, H100 host, torch 2.11, ``benchmarks/wrapper_first_call.py``):
bert-base's first call after ``co.load`` 26.2 s with the threads against 80.3 s
without (``wrapper_first_call_isa_prefetch_bert_2026-12-07_h100_s50.jsonl``); in
session 51, run in the other order, 27.8 against 44.0 s, the same ISA picked either
way and no thread alive after the first call. The first round of 20 forwards after
the first call ran 1.10-1.11 ms in both processes; with the threads two more rounds
stayed at 1.03-1.08 ms, then (after a 5 s pause) 0.74-0.80 ms, as without them from
the second round on (``wrapper_first_call_isa_rounds_bert_2026-12-07_h100_s51.jsonl``):
session 50's slower forwards with the threads were a settling time after a shorter
first call, not a slower steady state.
"""
from __future__ import annotations

import platform
import threading

_lock = threading.Lock()
_threads: list = []


def candidates() -> list:
    """The ISAs Inductor would check on this host (its x86 filter: every flag of the
    ISA's name among the CPU's), or [] where it checks none or the API is not there."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    try:
        from torch._inductor import cpu_vec_isa
        flags = cpu_vec_isa.x86_isa_checker()
        return [isa for isa in cpu_vec_isa.supported_vec_isa_list
                if all(f in flags for f in str(isa).split())]
    except Exception:  # noqa: BLE001 - another torch: Inductor checks as it always did
        return []


def _check(isa) -> None:
    try:
        bool(isa)
    except Exception:  # noqa: BLE001 - Inductor's own call will raise or decide
        pass


def start() -> list:
    """Start the checks (once per process); returns their threads."""
    with _lock:
        if not _threads:
            for isa in candidates():
                t = threading.Thread(target=_check, args=(isa,), daemon=True,
                                     name=f"cutlass_offload-isa-{isa}")
                t.start()
                _threads.append(t)
        return list(_threads)
