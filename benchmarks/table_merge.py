"""Merge the winners of a ``kernels_bench.py --search fitted|full --write-table`` run
into the packaged learned table (select/tables/sm90a_h200.json), shape by shape,
where that run timed its winner faster than the table's own kernel.

``kernels_bench.py --merge-table`` keeps every winner of a run and only on the GPU the
table names; this takes a run from another GPU of the same SM count too (an H100
for the H200's table: the same 132-SM die, other memory), and only where the run
itself measured the gain: every corpus problem of the shape (each epilogue) ran the
new table's kernel at least ``--min-gain`` times faster than the packaged table's
(the run's ``table_heuristic_us`` against its ``old_heuristic_us``), and the winner
differs from the packaged entry (config, launch knobs or the source-C winner). A
merged entry from another GPU is marked ``measured_on`` with the gains; the table's
note gets one line naming the run. The write is atomic.

    python benchmarks/table_merge.py RUN.json RUN_TABLE.json [--into TABLE]
        [--min-gain 1.02] [--dry-run]

RUN.json: the run's ``--json``; RUN_TABLE.json: its ``--write-table`` file; TABLE
defaults to the packaged table. Prints one line per shape of the run. Exits 2 when
the run's SM count differs from the table's (a table is used only for its SM count).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cutlass_offload.ir import GemmLaunch, config_from_dict
from cutlass_offload.select.sm90 import TABLE_FILE as PACKAGED
MIN_GAIN = 1.02      # a few percent is what these kernels move between runs (docs/status.md)


def shape_key(e: dict) -> tuple:
    """(M, N, K, batch, B layout, A layout) of a table entry or a run row."""
    return (e["m"], e["n"], e["k"], e.get("batch", 1) or 1, e["layout_b"], e.get("layout_a", "row"))


def _choice(e: dict):
    """An entry's winner (and its source-C winner) as select/sm90.py's Table reads them:
    the config classes fill the fields a newer writer adds (e.g. ``swap_ab``)."""
    def one(w):
        return None if w is None else (config_from_dict(w["config"]), GemmLaunch(**w.get("launch", {})))
    return one(e), one(e.get("residual"))


def merge(table: dict, run: dict, run_table: dict, min_gain: float = MIN_GAIN, source: str = "") -> tuple:
    """(merged table, [(shape key, verdict, gains)]) for ``run`` (kernels_bench.py's
    JSON: ``gpu``, ``num_sms``, ``rows``) and its written ``run_table``; ``table`` is
    not modified. A verdict is "merged", "same choice" or "gain below min_gain".
    Raises ValueError when the SM counts differ."""
    if int(run["num_sms"]) != int(table["num_sms"]):
        raise ValueError(f"the run's GPU has {run['num_sms']} SMs, the table's {table['num_sms']}: "
                         "a table is used only for the SM count it was measured on")
    other_gpu = run["gpu"] != table["gpu"]
    rows = {}
    for r in run["rows"]:
        if r.get("kind", "gemm") == "gemm" and r.get("old_heuristic_us") and r.get("table_heuristic_us"):
            rows.setdefault(shape_key(r), []).append(r)
    out = json.loads(json.dumps(table))
    index = {shape_key(e): i for i, e in enumerate(out["entries"])}
    verdicts, merged = [], []
    for entry in run_table["entries"]:
        key = shape_key(entry)
        gains = [(r["epilogue"], r["old_heuristic_us"] / r["table_heuristic_us"], r.get("old_heuristic"),
                  r.get("table_heuristic")) for r in rows.get(key, [])]
        old = out["entries"][index[key]] if key in index else None
        if old is not None and _choice(old) == _choice(entry):
            verdicts.append((key, "same choice", gains))
            continue
        if not gains or min(g for _, g, _, _ in gains) < min_gain:
            verdicts.append((key, "gain below min_gain", gains))
            continue
        new = dict(entry)
        if other_gpu:
            new["measured_on"] = (f"{run['gpu']}, not the table's GPU: "
                                  + "; ".join(f"{ep} {o} -> {n}, {g:.2f}x" for ep, g, o, n in gains))
        if old is None:
            out["entries"].append(new)
        else:
            out["entries"][index[key]] = new
        merged.append(key)
        verdicts.append((key, "merged", gains))
    if merged:
        shapes = ", ".join(f"{k[0]}x{k[1]}x{k[2]}" for k in merged)
        out["note"] = (out.get("note", "") + f"; {shapes} merged from {source or 'a kernels_bench.py run'}"
                       f" ({run['gpu']}, {str(run.get('date', ''))[:10]}), each at least {min_gain:.2f}x"
                       " the table's kernel on every epilogue of its shape in that run")
    return out, verdicts


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="the kernels_bench.py run's --json")
    p.add_argument("run_table", type=Path, help="the run's --write-table file")
    p.add_argument("--into", type=Path, default=PACKAGED, help="the table to merge into (default: packaged)")
    p.add_argument("--min-gain", type=float, default=MIN_GAIN)
    p.add_argument("--dry-run", action="store_true", help="print the verdicts, write nothing")
    args = p.parse_args(argv)
    table = json.loads(args.into.read_text())
    try:
        out, verdicts = merge(table, json.loads(args.run.read_text()), json.loads(args.run_table.read_text()),
                              args.min_gain, source=args.run.name)
    except ValueError as e:
        print(f"table_merge.py: {e}", file=sys.stderr)
        return 2
    for key, verdict, gains in verdicts:
        detail = "; ".join(f"{ep} {o} -> {n} {g:.2f}x" for ep, g, o, n in gains) or "no row of the run"
        print(f"{key[0]}x{key[1]}x{key[2]} B {key[4]} A {key[5]}: {verdict} ({detail})")
    if not args.dry_run and any(v == "merged" for _, v, _ in verdicts):
        _write(args.into, out)
        print(f"-> {args.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
