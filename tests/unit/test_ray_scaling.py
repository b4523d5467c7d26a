"""benchmarks/ray_scaling.py: the LPT schedule and the prediction model (no Ray)."""
import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "ray_scaling", Path(__file__).resolve().parents[2] / "benchmarks" / "ray_scaling.py")
rs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rs)


def test_lpt_schedule():
    assert rs.lpt_makespan([], 4) == 0.0
    assert rs.lpt_makespan([5, 3, 2], 1) == 10
    assert rs.lpt_makespan([5, 3, 2], 2) == 5          # 5 | 3+2
    assert rs.lpt_makespan([3, 3, 2, 2, 2], 2) == 7     # LPT: 3+2+2 | 3+2 (the optimum is 6)
    assert rs.lpt_makespan([7, 1, 1], 16) == 7          # never below the longest job
    with pytest.raises(ValueError):
        rs.lpt_makespan([1], 0)


def test_prediction_adds_transfer_overhead_link_and_memory_cap():
    units = [{"seconds": 10.0, "peak_rss_mb": 4096, "object_bytes": 10**9},   # 1 s at 1000 MB/s
             {"seconds": 4.0, "peak_rss_mb": 1024, "object_bytes": 0}]
    one = rs.predict(units, 2.0, nodes=1, cores=16, node_memory_gb=4, task_overhead_s=0.0)
    assert one["slots"] == 1                             # 4 GB node / 4 GB peak: one nvcc at a time
    assert one["seconds"] == pytest.approx(11 + 4 + 2)
    many = rs.predict(units, 2.0, nodes=4, cores=16, task_overhead_s=0.5)
    assert many["seconds"] == pytest.approx(11.5 + 2)
    slow_link = rs.predict(units, 0.0, nodes=4, bandwidth_mb_s=10, task_overhead_s=0.0)
    assert slow_link["seconds"] == pytest.approx(100 + 10)   # the object's own transfer dominates


def test_reads_a_report(tmp_path):
    unit_dir = tmp_path / "obj" / "shard.x"
    unit_dir.mkdir(parents=True)
    (unit_dir / "unit.o").write_bytes(b"0" * 1000)
    (unit_dir / "meta.json").write_text(json.dumps({"seconds": 9.0}))
    report = {"build": {"seconds": 12.0, "link_seconds": 0.5, "units": [
        {"name": "s", "seconds": 0.0, "cache_hit": True, "peak_rss_mb": 800, "source": str(unit_dir / "unit.cu")},
        {"name": "gone", "seconds": 0.0, "cache_hit": True, "peak_rss_mb": 0, "source": ""}]}}
    units, link, wall = rs.read_units(report)
    assert units == [{"name": "s", "seconds": 9.0, "peak_rss_mb": 800, "object_bytes": 1000}]
    assert (link, wall) == (0.5, 12.0)
