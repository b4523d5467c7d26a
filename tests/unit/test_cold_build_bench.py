"""benchmarks/cold_build.py without a GPU or nvcc: the build summary (units and
kernels compiled, whether nvcc ran), the steps' order and what each step's process
gets (fresh caches), the JSON written after every step, --resume, --budget-s and
the table, with fake step results in place of the real processes."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import cold_build as cb


def _unit(name, kernels, hit, executor="local (nvcc steps)", seconds=10.0):
    return {"name": name, "kernels": list(kernels), "seconds": seconds, "cache_hit": hit,
            "ok": True, "peak_rss_mb": 800.0, "executor": "" if hit else executor}


def _build(units, link=0.1):
    return {"seconds": 12.0, "jobs": 2, "units": units, "link_seconds": link,
            "critical_path_seconds": max([u["seconds"] for u in units if not u["cache_hit"]] or [0]) + link,
            "failures": []}


def test_build_summary_counts_units_kernels_and_nvcc():
    cold = cb.build_summary(_build([_unit("shard_a", ["k1", "k2"], False, seconds=30.0),
                                    _unit("launchers", [], False, "local (host compiler)", 1.0)]))
    assert (cold["units"], cold["units_compiled"], cold["kernel_units_compiled"],
            cold["kernels_compiled"]) == (2, 2, 1, 2)
    assert cold["nvcc_ran"] and cold["critical_path_s"] == pytest.approx(30.1)
    assert [u["name"] for u in cold["compiled"]] == ["shard_a", "launchers"]   # longest first
    warm = cb.build_summary(_build([_unit("shard_a", ["k1", "k2"], True),
                                    _unit("launchers", [], True)], link=0.0))
    assert (warm["units_compiled"], warm["kernels_compiled"], warm["nvcc_ran"]) == (0, 0, False)
    # the launchers alone, by the host compiler, then nvcc's link: nvcc ran (the link)
    relink = cb.build_summary(_build([_unit("shard_a", ["k1"], True),
                                      _unit("launchers", [], False, "local (host compiler)")]))
    assert relink["units_compiled"] == 1 and relink["kernels_compiled"] == 0 and relink["nvcc_ran"]
    no_link = cb.build_summary(_build([_unit("launchers", [], False, "local (host compiler)")], link=0.0))
    assert not no_link["nvcc_ran"]


def test_step_env_gives_fresh_separate_caches(tmp_path):
    ours = [cb.step_env(s, tmp_path, 3) for s in cb.OURS]
    assert all(e == ours[0] for e in ours)            # the ours steps share one cache
    assert ours[0]["CUTLASS_OFFLOAD_CACHE_DIR"].startswith(str(tmp_path))
    assert ours[0]["CUTLASS_OFFLOAD_JOBS"] == "3"
    tc = cb.step_env("torch_compile_default", tmp_path, None)
    ro = cb.step_env("torch_compile_reduce-overhead", tmp_path, None)
    assert tc["TORCHINDUCTOR_CACHE_DIR"] != ro["TORCHINDUCTOR_CACHE_DIR"] != ours[0]["TORCHINDUCTOR_CACHE_DIR"]
    assert "TRITON_CACHE_DIR" in tc and "CUTLASS_OFFLOAD_JOBS" not in cb.step_env("ours_cold", tmp_path, None)
    # ours_cold empties what an earlier run left; the others keep the cache
    cache = Path(ours[0]["CUTLASS_OFFLOAD_CACHE_DIR"])
    (cache / "obj").mkdir(parents=True)
    cb.prepare("ours_warm", tmp_path)
    assert cache.is_dir()
    cb.prepare("ours_cold", tmp_path)
    assert not cache.exists()


class FakeRunner:
    """Records the steps run; ours_cold makes the folders a real one leaves."""

    def __init__(self, fail=()):
        self.calls, self.fail = [], set(fail)

    def __call__(self, name):
        def run(step, work):
            self.calls.append((name, step))
            if step in self.fail:
                return {"error": "RuntimeError: boom", "process_s": 1.0}
            if step == "ours_cold":
                for k in ("cache", "out_cold"):
                    cb.paths(work)[k].mkdir(parents=True, exist_ok=True)
                return {"seconds": 40.0, "kernels": 3, "phases": {"capture": 0.5, "build": 39.0},
                        "build": cb.build_summary(_build([_unit("shard", ["a", "b", "c"], False, seconds=38.0)])),
                        "process_s": 45.0}
            if step == "ours_load":
                return {"seconds": 0.3}
            if step == "ours_warm":
                return {"seconds": 0.6, "build": cb.build_summary(_build([_unit("shard", ["a"], True)], 0.0))}
            if step == "ours_changed":
                return {"seconds": 15.0, "build": cb.build_summary(_build([_unit("shard", ["d"], False)]))}
            return {"seconds": 20.0, "mode": step.removeprefix("torch_compile_")}
        return run


def _main(tmp_path, runner, *extra):
    js = tmp_path / "cb.json"
    rc = cb.main(["mlp", "bert-base", "--arch", "sm_80", "--json", str(js),
                  "--tc-modes", "default,reduce-overhead", *extra], runner=runner)
    return rc, json.loads(js.read_text())


def test_all_steps_in_order_then_resume_runs_nothing(tmp_path, capsys):
    run = FakeRunner()
    rc, res = _main(tmp_path, run)
    assert rc == 0 and res["arch"] == "sm_80" and res["incomplete"] is None
    assert res["machine"]["cores"] and "date" in res["machine"] and "nvcc" in res["machine"]
    ours = [s for m, s in run.calls if m == "mlp"]
    assert ours[:4] == list(cb.OURS)
    steps = res["models"][0]["steps"]
    import torch
    if torch.cuda.is_available():
        assert steps["torch_compile_reduce-overhead"]["seconds"] == 20.0
    else:       # no GPU: recorded as skipped, never run
        assert steps["torch_compile_default"] == {"skipped": "skipped: no CUDA GPU on this machine"}
        assert len(ours) == 4
    assert not (tmp_path / "cb.json.work" / "mlp").exists()       # removed once done
    out = capsys.readouterr().out
    assert "mlp | 3 | 40.0 |" in out and "0.6 (0, nvcc no)" in out and "15.0 (1)" in out
    run2 = FakeRunner()
    rc, res2 = _main(tmp_path, run2, "--resume", "--no-torch-compile")
    assert rc == 0 and run2.calls == []
    assert res2["models"][0]["steps"]["ours_cold"] == steps["ours_cold"]


def test_budget_stops_after_the_first_step_and_resume_finishes(tmp_path, capsys):
    run = FakeRunner()
    rc, res = _main(tmp_path, run, "--budget-s", "0", "--no-torch-compile")
    assert rc == 3 and run.calls == [("mlp", "ours_cold")]
    assert res["incomplete"] == "mlp: ours_load"
    assert list(res["models"][0]["steps"]) == ["ours_cold"]      # written after the step
    assert "run again with --resume" in capsys.readouterr().out
    run2 = FakeRunner()
    rc, res = _main(tmp_path, run2, "--resume", "--no-torch-compile")
    assert rc == 0
    assert run2.calls[:3] == [("mlp", "ours_load"), ("mlp", "ours_warm"), ("mlp", "ours_changed")]
    assert ("mlp", "ours_cold") not in run2.calls                  # its cache was kept for these
    assert res["models"][0]["steps"]["torch_compile_default"] == {"skipped": "not run (--no-torch-compile)"}


def test_resume_without_the_cold_cache_runs_cold_again(tmp_path):
    rc, _ = _main(tmp_path, FakeRunner(), "--budget-s", "0", "--no-torch-compile")
    assert rc == 3
    import shutil
    shutil.rmtree(tmp_path / "cb.json.work")
    run = FakeRunner()
    rc, res = _main(tmp_path, run, "--resume", "--no-torch-compile")
    assert run.calls[:2] == [("mlp", "ours_cold"), ("mlp", "ours_load")]
    assert "ours_cold ran again" in res["models"][0]["notes"][0]


def test_failed_cold_skips_its_dependents_and_resume_retries(tmp_path):
    run = FakeRunner(fail={"ours_cold"})
    rc, res = _main(tmp_path, run, "--no-torch-compile")
    steps = res["models"][0]["steps"]
    assert steps["ours_cold"]["error"].startswith("RuntimeError")
    assert steps["ours_warm"] == {"error": "not run: ours_cold failed"}
    assert [s for m, s in run.calls if m == "mlp"] == ["ours_cold"]
    run2 = FakeRunner()
    rc, res = _main(tmp_path, run2, "--resume", "--no-torch-compile")
    assert rc == 0
    assert [s for m, s in run2.calls if m == "mlp"] == list(cb.OURS)
    assert "error" not in res["models"][0]["steps"]["ours_warm"]


def test_resume_refuses_another_target(tmp_path):
    _main(tmp_path, FakeRunner(), "--budget-s", "0", "--no-torch-compile")
    with pytest.raises(SystemExit, match="sm_80"):
        cb.main(["mlp", "--arch", "sm_90a", "--json", str(tmp_path / "cb.json"), "--resume"],
                runner=FakeRunner())


def test_table_ratios_targets_and_warnings():
    summary = cb.build_summary(_build([_unit("shard", ["a"], False)]))
    model = {"model": "sd-unet", "steps": {
        "ours_cold": {"seconds": 120.0, "kernels": 26, "phases": {"build": 110.0}, "build": summary},
        "ours_load": {"seconds": 2.5, "first_call_s": 30.0},
        "ours_warm": {"seconds": 3.0, "build": summary},         # compiled a unit: flagged
        "ours_changed": {"error": "RuntimeError: boom"},
        "torch_compile_default": {"seconds": 60.0},
        "torch_compile_reduce-overhead": {"skipped": "no CUDA GPU on this machine"}}}
    result = {"machine": {"cores": 16, "gpu": "NVIDIA H200", "torch": "2.13", "nvcc": "13.0",
                          "date": "2026-12-02"}, "arch": "sm_90a",
              "tc_modes": ["default", "reduce-overhead"], "models": [model, {"model": "mlp"}]}
    text = cb.table(result)
    row = next(line for line in text.splitlines() if line.startswith("sd-unet |"))
    cells = row.split(" | ")
    assert cells[2] == "120.0" and cells[4] == "1 of 1 (10.1)" and cells[5] == "2.50 (+30.0)"
    assert cells[6] == "3.0 (1, nvcc ran)" and cells[7] == "FAILED"
    assert cells[8:] == ["60.0", "skipped", "2.00x"]
    assert "issue 17's target < 2 s: MISS" in text
    assert "sd-unet: the warm compile compiled 1 units" in text
    assert "mlp | - | - |" in text and "16 cores, GPU NVIDIA H200" in text
