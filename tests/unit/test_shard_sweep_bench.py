"""benchmarks/shard_sweep.py with the fake nvcc (no CUTLASS, no GPU): each build
is cold (a fresh cache: every unit compiled), the rows carry the unit breakdown and
the children's CPU time, more job slots never give fewer units, and the JSON holds
every row."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import shard_sweep  # noqa: E402
from fault_helpers import fake_env  # noqa: E402


def test_sweep_builds_cold_each_time_and_writes_every_row(tmp_path, monkeypatch, capsys):
    for k, v in fake_env(tmp_path / "tool").items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "sweep.json"
    assert shard_sweep.main(["mlp", "--jobs", "1,3", "--single", "--json", str(out),
                             "--work", str(tmp_path / "work")]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["strategy"], r["jobs"]) for r in rows][:2] == [("sharded", 1), ("sharded", 3)]
    assert rows[2]["strategy"] == "single"
    for r in rows:
        assert r["wall_s"] > 0 and r["children_cpu_s"] >= 0 and not r["failures"]
        # cold: every unit compiled, holding every kernel between them
        assert sum(u["kernels"] for u in r["units"]) == r["kernels"] == 3
    sharded = [r for r in rows if r["strategy"] == "sharded"]
    assert len(sharded[1]["units"]) >= len(sharded[0]["units"])
    assert "CPU of all processes" in capsys.readouterr().out
