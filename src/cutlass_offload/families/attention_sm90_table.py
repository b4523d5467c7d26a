"""The learned choice of Hopper attention config (families/attention_sm90.py): the
fastest config per problem class from an H200 search of the kernel corpus
(``benchmarks/kernels_bench.py --kinds attention --search full --write-attention-table``),
as data. A class is (head dim, causal, query-length bucket, key-length bucket);
buckets are powers of two (a length L falls in bucket 2**ceil(log2 L)), so a row
measured at 1500 tokens serves 1025..2048. Problems of no row get the example's
instantiation (attention_sm90.DEFAULT_BLOCK_KV, cooperative).
"""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

TABLE_FILE = Path(__file__).with_name("attention_sm90_table.json")


def bucket(length: int) -> int:
    """The power of two at or above ``length`` (>= 1)."""
    return 1 << max(0, math.ceil(math.log2(max(1, length))))


def class_key(head_dim: int, causal: bool, seq_q: int, seq_kv: int) -> str:
    """The table's key of a problem class (a string: JSON keys)."""
    return f"d{head_dim}_{'causal' if causal else 'full'}_q{bucket(seq_q)}_kv{bucket(seq_kv)}"


@lru_cache(maxsize=1)
def _rows() -> dict:
    """{class key: (head tile, block_kv, schedule, tile order, block_q)} of TABLE_FILE
    (a row without "tile_scheduler" is in the example's order, "persistent"; without
    "block_q", 128 queries per CTA); {} when it is
    missing or not the expected JSON (warned: the example's configs are used)."""
    if not TABLE_FILE.exists():
        return {}
    try:
        data = json.loads(TABLE_FILE.read_text())
        return {k: (int(v["head"]), int(v["block_kv"]), str(v["schedule"]),
                    str(v.get("tile_scheduler", "persistent")), int(v.get("block_q", 128)))
                for k, v in data["rows"].items()}
    except (ValueError, KeyError, TypeError) as e:
        import warnings
        warnings.warn(f"{TABLE_FILE} unreadable ({e}); Hopper attention uses the example's tiles")
        return {}


def lookup(head_dim: int, causal: bool, seq_q: int, seq_kv: int):
    """(head tile, block_kv, schedule, tile order, block_q) of the row for this problem
    class, or None."""
    return _rows().get(class_key(head_dim, causal, seq_q, seq_kv))


def rows() -> dict:
    """{class key: (head tile, block_kv, schedule, tile order, block_q)}: every row."""
    return dict(_rows())
