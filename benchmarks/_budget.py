"""A time budget for benchmarks run in rented slices of GPU time (runtime.py,
cold_build.py): ``--budget-s S`` starts no step after S seconds; the caller writes
what it measured and exits 3 so that ``--resume`` continues."""
from __future__ import annotations

import time


class Budget:
    """Stops the run before a step once ``seconds`` have passed since it started;
    the first step of a run always starts (each run makes progress). ``seconds``
    None: no limit."""

    def __init__(self, seconds):
        self.seconds, self.t0 = seconds, time.perf_counter()
        self.started = False

    def exhausted(self) -> bool:
        return (self.started and self.seconds is not None
                and time.perf_counter() - self.t0 > self.seconds)


class OutOfBudget(Exception):
    """Raised before a step once the budget is spent; its message names the step."""


def finish(result: dict, incomplete, write, report: str, path, budget_s) -> int:
    """End a run: record ``incomplete`` (the step it stopped before, or None) in
    ``result``, ``write()`` it, print ``report`` and where it went; the exit status:
    3 when the budget stopped the run (run again with --resume), else 0."""
    result["incomplete"] = incomplete
    write()
    print(report)
    print(f"wrote {path}")
    if incomplete:
        print(f"stopped before {incomplete} (--budget-s {budget_s:g}): run again with --resume")
        return 3
    return 0
