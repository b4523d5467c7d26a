"""The learned choice of sm90a conv2d kernel: per conv problem of the kernel corpus,
the fastest ``ir.ConvChoice`` of the conv search space (select/conv.py
``search_space``: TMA implicit-GEMM tiles, clusters and stage counts, and for
small outputs the im2col lowering with split-K), from an H200 search
(``benchmarks/kernels_bench.py --kinds conv --dtypes fp16 --search full
--write-conv-table FILE``), as data like the GEMM and attention tables.

A row is keyed by the problem's sizes with the batch at its example size (N, H,
W, C, K, R, S, padding, stride, dilation); one row serves every epilogue and both
16-bit dtypes (wgmma runs fp16 and bf16 at one rate). Only exact shapes are looked
up: a conv's speed turns on its tile count and K depth, which a nearby shape does
not share. The table applies only to the SM count it was measured on.

File (JSON): {"gpu", "num_sms", "date", "cutlass", "source", "rows": {key:
{"choice": ConvChoice.to_dict(), "us", "default_us", "anchor_us"}}}.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ..ir import ConvChoice, ConvProblem

TABLE_FILE = Path(__file__).with_name("conv_sm90_table.json")


def key_of(n, h, w, c, k, r, s, pad, stride, dilation) -> str:
    """The table's key of a conv of these sizes (a string: JSON keys)."""
    return (f"n{n}_h{h}_w{w}_c{c}_k{k}_r{r}_s{s}_pad{'-'.join(map(str, pad))}"
            f"_st{'-'.join(map(str, stride))}_dil{'-'.join(map(str, dilation))}")


def class_key(problem: ConvProblem) -> str:
    """The table's key of ``problem`` (the batch at its example size)."""
    n = problem.n if problem.n is not None else problem.n_hint
    return key_of(n, problem.h, problem.w, problem.c, problem.k, problem.r, problem.s, problem.pad,
                  problem.stride, problem.dilation)


@lru_cache(maxsize=1)
def _load() -> tuple:
    """(num_sms, {key: ConvChoice}) of TABLE_FILE; (0, {}) when it is missing or not
    the expected JSON (warned: the shape rules choose)."""
    if not TABLE_FILE.exists():
        return 0, {}
    try:
        data = json.loads(TABLE_FILE.read_text())
        return int(data["num_sms"]), {k: ConvChoice.from_dict(v["choice"])
                                      for k, v in data["rows"].items()}
    except (ValueError, KeyError, TypeError) as e:
        import warnings
        warnings.warn(f"{TABLE_FILE} unreadable ({e}); sm90a convs use the shape rules")
        return 0, {}


def lookup(problem: ConvProblem, num_sms: int) -> ConvChoice | None:
    """The measured choice for ``problem`` on a device of ``num_sms`` SMs, or None."""
    sms, rows = _load()
    return rows.get(class_key(problem)) if sms == num_sms else None


def choices() -> tuple:
    """The distinct choices the table holds (any SM count; prebuild lists them)."""
    return tuple(dict.fromkeys(_load()[1].values()))


def use_table(path) -> None:
    """Read the table from ``path`` from now on (a search that has just written one;
    tests)."""
    global TABLE_FILE
    TABLE_FILE = Path(path)
    _load.cache_clear()
