"""benchmarks/table_merge.py: a run's winners enter the learned table shape by shape
only where that run timed them faster than the table's kernel on every epilogue of
the shape; unchanged choices and small gains are left; another GPU's entries are
marked; another SM count is refused; the file is rewritten atomically."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import table_merge  # noqa: E402


def _cfg(tile, cluster=(1, 1, 1)):
    return {"family": "cutlass3x_sm90", "tile": list(tile), "stages": 0, "warp": [0, 0, 0],
            "instruction": [0, 0, 0], "cluster": list(cluster),
            "kernel_schedule": "KernelTmaWarpSpecializedCooperative", "epilogue_schedule": "",
            "tile_scheduler": "persistent"}


def _entry(m, n, k, tile, cluster=(1, 1, 1), pdl=False):
    return {"m": m, "n": n, "k": k, "batch": 1, "layout_b": "col", "config": _cfg(tile, cluster),
            "launch": {"raster": "heuristic", "swizzle": 1, "splits": 1, "decomposition": "heuristic", "pdl": pdl},
            "us": 1.0, "from": "f16 plain", "anchor_us": 1.0}


def _row(m, n, k, epilogue, old_us, new_us):
    return {"kind": "gemm", "m": m, "n": n, "k": k, "batch": 1, "layout_b": "col", "layout_a": "row",
            "epilogue": epilogue, "old_heuristic": "old", "old_heuristic_us": old_us,
            "table_heuristic": "new", "table_heuristic_us": new_us}


TABLE = {"gpu": "NVIDIA H200", "num_sms": 132, "note": "history",
         "entries": [_entry(512, 3840, 1280, (128, 64, 64)), _entry(1024, 768, 3072, (64, 96, 64)),
                     _entry(2048, 512, 2048, (64, 128, 64))]}
RUN = {"gpu": "NVIDIA H100 80GB HBM3", "num_sms": 132, "date": "2026-12-07T09:00:00",
       "rows": [_row(512, 3840, 1280, "plain", 12.0, 10.5),            # 1.14x: merged
                _row(1024, 768, 3072, "bias_resadd", 14.2, 12.1),      # 1.17x ...
                _row(1024, 768, 3072, "plain", 10.0, 9.95),            # ... but 1.005x here: kept
                _row(2048, 512, 2048, "plain", 9.8, 9.0),              # same choice: kept
                _row(4096, 512, 512, "bias", 7.0, 6.0)]}               # a new shape: added
RUN_TABLE = {"gpu": RUN["gpu"], "num_sms": 132,
             "entries": [_entry(512, 3840, 1280, (128, 128, 64), (4, 2, 1), pdl=True),
                         _entry(1024, 768, 3072, (64, 128, 64), (4, 1, 1)),
                         {**_entry(2048, 512, 2048, (64, 128, 64)),
                          "config": {**_cfg((64, 128, 64)), "swap_ab": False}},   # a newer writer's field
                         _entry(4096, 512, 512, (64, 128, 64))]}


def test_only_measured_gains_on_every_epilogue_enter():
    out, verdicts = table_merge.merge(TABLE, RUN, RUN_TABLE, source="run.json")
    by_shape = {k[:3]: v for k, v, _ in verdicts}
    assert by_shape == {(512, 3840, 1280): "merged", (1024, 768, 3072): "gain below min_gain",
                        (2048, 512, 2048): "same choice", (4096, 512, 512): "merged"}
    entries = {table_merge.shape_key(e)[:3]: e for e in out["entries"]}
    assert entries[(512, 3840, 1280)]["config"]["cluster"] == [4, 2, 1]
    assert "NVIDIA H100" in entries[(512, 3840, 1280)]["measured_on"]
    assert entries[(1024, 768, 3072)] == TABLE["entries"][1]        # kept as it was
    assert entries[(2048, 512, 2048)] == TABLE["entries"][2]
    assert (4096, 512, 512) in entries
    assert out["note"].startswith("history; ") and "512x3840x1280, 4096x512x512 merged from run.json" in out["note"]
    assert TABLE["entries"][0]["config"]["cluster"] == [1, 1, 1]     # the input is not modified
    same_gpu, _ = table_merge.merge(TABLE, {**RUN, "gpu": TABLE["gpu"]}, RUN_TABLE)
    assert all("measured_on" not in e for e in same_gpu["entries"])


def test_another_sm_count_is_refused():
    with pytest.raises(ValueError, match="114 SMs"):
        table_merge.merge(TABLE, {**RUN, "num_sms": 114}, RUN_TABLE)


def test_cli_writes_atomically_and_dry_run_writes_nothing(tmp_path, capsys):
    paths = {}
    for name, data in (("table", TABLE), ("run", RUN), ("run_table", RUN_TABLE)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    args = [str(paths["run"]), str(paths["run_table"]), "--into", str(paths["table"])]
    assert table_merge.main(args + ["--dry-run"]) == 0
    assert json.loads(paths["table"].read_text()) == TABLE
    assert "512x3840x1280 B col A row: merged" in capsys.readouterr().out
    assert table_merge.main(args) == 0
    merged = json.loads(paths["table"].read_text())
    assert len(merged["entries"]) == 4 and not list(tmp_path.glob("*.tmp"))
    paths["run"].write_text(json.dumps({**RUN, "num_sms": 114}))
    assert table_merge.main(args) == 2
