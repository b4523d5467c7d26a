"""--tune without a GPU: the tuning cache (keys, invalidation, atomic writes), the
orchestration with a fake build and profiler (a cache hit profiles nothing, a
failing candidate is skipped and recorded) and the crash handling of the
profiling subprocess (a fake process writing the result events)."""
import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import cutlass_offload as co
from cutlass_offload.config import CompileOptions
from cutlass_offload.ir import GemmEpilogue, GemmLaunch, GemmProblem, GemmRegion, Plan
from cutlass_offload.select import (
    candidate_kernels,
    choose_kernel,
    select,
    sm90,
    tuning_id,
)
from cutlass_offload.tune import cache as tune_cache
from cutlass_offload.tune import tune
from cutlass_offload.tune.cache import TuningCache, tuning_key
from cutlass_offload.tune.result import (
    CandidateResult,
    config_from_dict,
    config_to_dict,
)
from cutlass_offload.tune.runner import profile_candidates

GPU = ("NVIDIA H200", 132, 0)
SMS = GPU[1]
OPTIONS = CompileOptions(arch="sm90a", tune=True)


@pytest.fixture(autouse=True)
def _rules_only(monkeypatch, tmp_path):
    """The shape rules as the heuristic: these tests are about tuning, not the table.
    The profiler's lock file goes to a cache of the test's own, not the user's."""
    monkeypatch.setattr(sm90, "default_table", lambda: None)
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))


def _problem(m, n, k, epilogue=None):
    return GemmProblem(n=n, k=k, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                       epilogue=epilogue or GemmEpilogue(bias=True), m=m, m_hint=m)


def _plan(*problems):
    regions = tuple(GemmRegion(name=f"r{i}", form="linear", nodes=(f"r{i}",), a="a", b="b", problem=p)
                    for i, p in enumerate(problems))
    return Plan("sm90a", regions, tuple(choose_kernel(p, "sm90a") for p in problems), ())


# -- keys -----------------------------------------------------------------------------

def test_key_is_stable_and_changes_with_every_input():
    tid = tuning_id(_problem(1024, 768, 768))
    base = tuning_key(tid, "sm90a", "4.2.0+abc", "NVIDIA H200", 132)
    assert base == tuning_key(tuning_id(_problem(1024, 768, 768)), "sm90a", "4.2.0+abc", "NVIDIA H200", 132)
    assert len(base) == 64
    other_epilogue = tuning_id(_problem(1024, 768, 768, GemmEpilogue(bias=True, activation="gelu_erf")))
    for changed in (tuning_key(other_epilogue, "sm90a", "4.2.0+abc", "NVIDIA H200", 132),
                    tuning_key(tid, "sm90a", "4.3.0+abc", "NVIDIA H200", 132),      # CUTLASS version
                    tuning_key(tid, "sm90a", "4.2.0+abd", "NVIDIA H200", 132),      # headers changed
                    tuning_key(tid, "sm90a", "4.2.0+abc", "NVIDIA H100 80GB HBM3", 132),
                    tuning_key(tid, "sm90a", "4.2.0+abc", "NVIDIA H200", 114),
                    tuning_key(tid, "sm80", "4.2.0+abc", "NVIDIA H200", 132),
                    tuning_key(tuning_id(_problem(512, 768, 768)), "sm90a", "4.2.0+abc", "NVIDIA H200", 132)):
        assert changed != base


def test_config_round_trips_through_json():
    for k in candidate_kernels(_problem(77, 1280, 768), "sm90a"):
        d = json.loads(json.dumps(config_to_dict(k.config)))
        assert config_from_dict(d) == k.config


# -- the cache file -------------------------------------------------------------------

def test_store_merges_and_lookup_reads(tmp_path):
    cache = TuningCache(tmp_path)
    assert cache.lookup("sm90a", "NVIDIA H200", "k1") is None
    cache.store("sm90a", "NVIDIA H200", {"k1": {"winner": "a"}})
    cache.store("sm90a", "NVIDIA H200", {"k2": {"winner": "b"}})
    assert cache.lookup("sm90a", "NVIDIA H200", "k1") == {"winner": "a"}
    assert cache.lookup("sm90a", "NVIDIA H200", "k2") == {"winner": "b"}
    assert cache.lookup("sm90a", "NVIDIA H100", "k1") is None         # another GPU, another file
    assert cache.path("sm90a", "NVIDIA H200").name == "sm90a_nvidia_h200.json"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp file left


def test_concurrent_stores_lose_nothing(tmp_path):
    cache = TuningCache(tmp_path)

    def writer(i):
        for j in range(10):
            TuningCache(tmp_path).store("sm90a", "gpu", {f"k{i}_{j}": {"i": i, "j": j}})

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        for j in range(10):
            assert cache.lookup("sm90a", "gpu", f"k{i}_{j}") == {"i": i, "j": j}


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    cache = TuningCache(tmp_path)
    cache.store("sm90a", "gpu", {"k1": {"winner": "a"}})
    before = cache.path("sm90a", "gpu").read_text()

    def broken_dump(obj, f, **kw):
        f.write('{"version": 1, "entries": {"k1": ')          # then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tune_cache.json, "dump", broken_dump)
    with pytest.raises(OSError):
        cache.store("sm90a", "gpu", {"k2": {"winner": "b"}})
    assert cache.path("sm90a", "gpu").read_text() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_corrupt_file_reads_as_empty_and_is_rewritten(tmp_path):
    cache = TuningCache(tmp_path)
    path = cache.path("sm90a", "gpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"version": 1, "entr')
    assert cache.lookup("sm90a", "gpu", "k1") is None
    cache.store("sm90a", "gpu", {"k1": {"winner": "a"}})
    assert cache.lookup("sm90a", "gpu", "k1") == {"winner": "a"}


# -- orchestration with a fake build and profiler ----------------------------------------

class FakeBuild:
    """Stands in for build.build: records the plan; kernels in ``fail`` do not compile."""

    def __init__(self, fail=()):
        self.plans, self.fail = [], set(fail)

    def __call__(self, plan, strategy):
        self.plans.append(plan)
        assert strategy == "sharded"
        keep = [(r, k) for r, k in zip(plan.regions, plan.kernels) if k.name not in self.fail]
        pruned = Plan(plan.arch, tuple(r for r, _ in keep), tuple(k for _, k in keep), ())

        failures = [(k, "/logs/nvcc.log") for k in sorted(self.fail)]

        class Result:
            library = Path("/nonexistent/libcutlass_offload.so")

            def __init__(self):
                self.plan, self.failures = pruned, failures

            def to_dict(self):
                return {"units": []}
        return Result()


class FakeProfiler:
    """Stands in for runner.profile_candidates: a time per candidate tag (or a
    status) from ``outcome(tag, spec, launch)``; with a knob search, every variant of
    the ``top`` fastest jobs and of those marked always_variants, as the profiling
    process would."""

    def __init__(self, outcome):
        self.outcome, self.calls, self.searches = outcome, [], []

    def _result(self, job, tag, spec, launch):
        o = self.outcome(tag, spec, launch or {})
        if isinstance(o, str):
            return CandidateResult(job["kernel"], tag, o, detail="from the fake", launch=launch)
        return CandidateResult(job["kernel"], tag, "ok", us=o, rel_err=1e-4, launch=launch)

    def __call__(self, library, specs, jobs, tags, device=0, knob_search=None):
        self.calls.append(jobs)
        self.searches.append(knob_search)
        res = {j["id"]: self._result(j, tags[j["id"]], specs[j["problem"]], j.get("launch"))
               for j in jobs}
        if knob_search:
            for pid in specs:
                ok = sorted((res[j["id"]].us, j["id"]) for j in jobs
                            if j["problem"] == pid and res[j["id"]].status == "ok")
                top = [jid for _, jid in ok[:knob_search["top"]]]
                top += [jid for _, jid in ok[knob_search["top"]:]
                        if next(j for j in jobs if j["id"] == jid).get("always_variants")]
                for jid in top:
                    job = next(j for j in jobs if j["id"] == jid)
                    for v in job.get("variants", []):
                        tag = f"{tags[jid]}+{GemmLaunch(**v).tag}"
                        res[f"{jid}@{GemmLaunch(**v).tag}"] = self._result(job, tag, specs[pid], v)
        return res, {p: 10.0 for p in specs}


FAST = "128x128x64_c1x1x1_coop"


def _by_tile(tag, spec, launch):
    # pretend 128x128 cooperative (persistent) is the fastest everywhere
    return 5.0 if tag.split("+")[0] == FAST else 8.0


def test_tune_ranks_proxies_then_builds_the_best_with_each_epilogue(tmp_path):
    p1, p2 = _problem(1024, 768, 768), _problem(77, 1280, 768)
    p3 = _problem(1024, 768, 768, GemmEpilogue(bias=True, activation="gelu_erf"))   # p1's shape
    plan = _plan(p1, p1, p2, p3)              # two regions share p1
    fb, fp = FakeBuild(), FakeProfiler(_by_tile)
    rep = tune(plan, OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=fb, profiler=fp)
    assert len(fb.plans) == 2 and len(fp.calls) == 2          # rank, then final
    # rank: one plain fp16 proxy per shape (p1 and p3 share one), every plausible config
    proxies = {tuning_id(replace(p, epilogue=GemmEpilogue())) for p in (p1, p2)}
    assert len(rep.ranking) == len(proxies) == 2
    n_rank = sum(len(sm90.search_space(replace(p, epilogue=GemmEpilogue()), 132)) for p in (p1, p2))
    assert len(fb.plans[0].regions) == n_rank
    assert all(k.epilogue == GemmEpilogue() for k in fb.plans[0].kernels)
    assert fp.searches == [{"top": 0, "pdl": False}, {"top": 2, "pdl": True}]
    # in the rank step only stream-K configs carry variants: their decompositions
    ranked = [j for j in fp.calls[0] if "variants" in j]
    assert ranked and all(j["always_variants"] for j in ranked)
    assert all(j["kernel"] in {k.name for k in fb.plans[0].kernels
                               if k.config.tile_scheduler == "stream_k"} for j in ranked)
    assert all(v.get("decomposition") in ("data_parallel", "stream_k", "split_k")
               for j in ranked for v in j["variants"])
    # final: the heuristic's kernel first, then the best-ranked configs, own epilogue
    final = fb.plans[1]
    by_problem = {}
    for r, k in zip(final.regions, final.kernels):
        by_problem.setdefault(tuning_id(r.problem), []).append(k)
        assert k.epilogue == r.problem.epilogue
    for p in (p1, p2, p3):
        ks = by_problem[tuning_id(p)]
        assert ks[0] == choose_kernel(p, "sm90a") and 2 <= len(ks) <= 1 + 3
    for p in (p1, p3):             # FAST is not plausible for 77 rows (a wave of 64-row tiles)
        assert FAST in [k.config.tag for k in by_problem[tuning_id(p)]]
    assert all("variants" in j for j in fp.calls[1])          # launch knobs searched
    assert [p.regions for p in rep.problems] == [2, 1, 1] and rep.profiled == 3
    assert [p.winner.split("+")[0] == FAST for p in rep.problems] == [True, False, True]
    tuned = select(_partition_of(plan), "sm90a", OPTIONS, rep.winners)
    assert [k.config.tag for k in tuned.kernels][:2] == [FAST, FAST]
    assert tuned.kernels[3].config.tag == FAST
    assert FAST in rep.format() and "profiled" in rep.format()


def test_a_launch_variant_can_win_and_select_launches_with_it(tmp_path):
    p = _problem(4096, 4096, 1024)

    def outcome(tag, spec, launch):
        return 4.0 if launch.get("raster") == "along_n" and launch.get("swizzle") == 4 else 6.0

    rep = tune(_plan(p), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=FakeBuild(),
               profiler=FakeProfiler(outcome))
    (tp,) = rep.problems
    assert tp.winner.endswith("+along_n_swz4") and tp.winner_launch["swizzle"] == 4
    config, launch = rep.winners[tuning_id(p)]
    assert launch == GemmLaunch(raster="along_n", swizzle=4)
    (k,) = select(_partition_of(_plan(p)), "sm90a", OPTIONS, rep.winners).kernels
    assert k.config == config and k.launch == launch
    again = tune(_plan(p), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=None, profiler=None)
    assert again.problems[0].cached and again.winners == rep.winners


def test_a_stream_k_config_is_ranked_and_kept_by_its_best_decomposition(tmp_path):
    # under a wave of 128x128 tiles (78 on 132 SMs), CUTLASS's heuristic launch runs a
    # stream-K kernel data-parallel: slow here; split-K 3 is the fastest of everything
    p = _problem(1568, 768, 3072)

    def outcome(tag, spec, launch):
        if "streamk" in tag.split("+")[0]:
            return 4.0 if launch.get("splits") == 3 else 9.0
        return 6.0

    fp = FakeProfiler(outcome)
    rep = tune(_plan(p), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=FakeBuild(),
               profiler=fp)
    proxy = tuning_id(replace(p, epilogue=GemmEpilogue()))
    best = min((r for r in rep.ranking[proxy] if r["status"] == "ok"), key=lambda r: r["us"])
    assert best["us"] == 4.0 and best["launch"]["splits"] == 3
    (tp,) = rep.problems
    assert "streamk" in tp.winner and tp.winner_launch["decomposition"] == "split_k"
    config, launch = rep.winners[tuning_id(p)]
    assert config.tile_scheduler == "stream_k" and launch == GemmLaunch(decomposition="split_k", splits=3)


def _partition_of(plan):
    from cutlass_offload.ir import PartitionResult
    return PartitionResult(plan.regions, ())


def test_a_cache_hit_profiles_nothing(tmp_path):
    plan = _plan(_problem(1024, 768, 768), _problem(1024, 3072, 768, GemmEpilogue(True, "gelu_erf")))
    first = tune(plan, OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=FakeBuild(),
                 profiler=FakeProfiler(_by_tile))

    def refuse(*a, **k):
        raise AssertionError("a cached problem was built or profiled again")

    again = tune(plan, OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=refuse, profiler=refuse)
    assert again.profiled == 0 and all(p.cached for p in again.problems)
    assert again.winners == first.winners and len(again.winners) == 2
    # another GPU is a miss: profiled again
    fp = FakeProfiler(_by_tile)
    other = tune(plan, OPTIONS, cache=TuningCache(tmp_path), gpu=("NVIDIA H100", 132, 0),
                 builder=FakeBuild(), profiler=fp)
    assert other.profiled == 2 and len(fp.calls) == 2


def test_failing_candidates_are_skipped_and_recorded(tmp_path):
    p = _problem(1024, 3072, 768)
    heuristic = choose_kernel(p, "sm90a")
    ranked = [c for c in sm90.search_space(replace(p, epilogue=GemmEpilogue()), 132)
              if c != heuristic.config][:3]
    broken = replace(heuristic, config=ranked[0]).name          # does not compile

    def outcome(tag, spec, launch):
        if spec["epilogue"]["bias"]:                             # the final step
            return {heuristic.config.tag: "crashed", ranked[1].tag: "cannot implement"}.get(
                tag.split("+")[0], 7.0)
        return {c.tag: 1.0 + i for i, c in enumerate(ranked)}.get(tag, 9.0)

    rep = tune(_plan(p), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU,
               builder=FakeBuild(fail=[broken]), profiler=FakeProfiler(outcome))
    (tp,) = rep.problems
    status = {c.tag: c.status for c in tp.candidates if "+" not in c.tag}
    assert status == {heuristic.config.tag: "crashed", ranked[0].tag: "compile failed",
                      ranked[1].tag: "cannot implement", ranked[2].tag: "ok"}
    assert tp.winner.split("+")[0] == ranked[2].tag
    assert "compile failed" in rep.format() and "crashed" in rep.format()
    # recorded in the cache with the failures, so the next compile needs no GPU time
    again = tune(_plan(p), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=None, profiler=None)
    assert again.problems[0].cached and again.problems[0].winner == tp.winner


def test_no_result_is_cached_when_the_profiler_could_not_run(tmp_path):
    p = _problem(1024, 768, 768)
    rep = tune(_plan(p), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=FakeBuild(),
               profiler=FakeProfiler(lambda tag, spec, launch: "not profiled"))
    assert rep.problems[0].winner is None and rep.winners == {}
    fp = FakeProfiler(_by_tile)
    tune(_plan(p), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=FakeBuild(), profiler=fp)
    assert len(fp.calls) == 2                                # tried again


def test_a_heuristic_search_times_the_heuristic_alone_and_caches_nothing(tmp_path):
    p = _problem(1024, 768, 768)
    fb, fp = FakeBuild(), FakeProfiler(_by_tile)
    rep = tune(_plan(p), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=fb, profiler=fp,
               search="heuristic")
    assert len(fb.plans) == 1 and list(fb.plans[0].kernels) == [choose_kernel(p, "sm90a")]
    assert fp.searches == [None] and "variants" not in fp.calls[0][0]
    assert rep.problems[0].winner == rep.problems[0].heuristic
    assert not list(tmp_path.rglob("*.json"))


def test_a_fitted_search_ranks_the_heuristic_against_the_fitted_tiles_only(tmp_path):
    p = _problem(8192, 320, 320)                             # a UNet projection
    fitted = sm90.fitted_configs(replace(p, epilogue=GemmEpilogue()), SMS)
    assert fitted
    fast = fitted[0].tag

    def by_fit(tag, spec, launch):
        return 5.0 if tag.split("+")[0] == fast else 8.0
    fb, fp = FakeBuild(), FakeProfiler(by_fit)
    rep = tune(_plan(p), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=fb, profiler=fp,
               search="fitted")
    ranked = [k.config for k in fb.plans[0].kernels]
    assert ranked == [choose_kernel(p, "sm90a").config, *fitted]
    assert rep.problems[0].winner_config == config_to_dict(fitted[0])
    assert not list(tmp_path.rglob("*.json"))                # nothing cached


# -- the profiling subprocess's crash handling -----------------------------------------------

def _jobs(n, problem="0"):
    jobs = [{"id": f"tune0_{j}", "problem": problem, "symbol": f"co_tune0_{j}", "kernel": f"k{j}"}
            for j in range(n)]
    return jobs, {j["id"]: f"tag{i}" for i, j in enumerate(jobs)}


class FakeProcess:
    """Stands in for runner.launch_subprocess: plays a script per job id ("ok",
    "cannot implement", "segfault" = the process dies while running it, "cuda error"
    = it records an error and exits 3, "hang" = killed at the timeout)."""

    def __init__(self, script):
        self.script, self.requests = script, []

    def __call__(self, request, results, timeout_s):
        req = json.loads(Path(request).read_text())
        self.requests.append([j["id"] for j in req["jobs"]])
        with open(results, "a") as f:
            def log(**e):
                f.write(json.dumps(e) + "\n")
            for pid in req["problems"]:
                log(event="setup", problem=pid)
                log(event="torch", problem=pid, us=12.0)
            for j in req["jobs"]:
                log(event="start", job=j["id"])
                what = self.script[j["id"]]
                if what == "segfault":
                    f.write('{"event": "do')             # a line cut by the crash
                    return -11, "Segmentation fault"
                if what == "hang":
                    return "timeout", ""
                if what == "cuda error":
                    log(event="done", job=j["id"], status="error", detail="CUDA error: illegal address")
                    return 3, ""
                if what == "ok":
                    log(event="done", job=j["id"], status="ok", us=5.0, rel_err=1e-4)
                else:
                    log(event="done", job=j["id"], status=what, detail="")
        return 0, ""


def test_a_crashing_candidate_is_recorded_and_the_rest_rerun_without_it():
    jobs, tags = _jobs(5)
    proc = FakeProcess({"tune0_0": "ok", "tune0_1": "segfault", "tune0_2": "cuda error",
                        "tune0_3": "cannot implement", "tune0_4": "hang"})
    res, torch_us = profile_candidates("/lib.so", {"0": {}}, jobs, tags, launch=proc)
    assert proc.requests == [["tune0_0", "tune0_1", "tune0_2", "tune0_3", "tune0_4"],
                             ["tune0_2", "tune0_3", "tune0_4"], ["tune0_3", "tune0_4"]]
    assert {j: r.status for j, r in res.items()} == {
        "tune0_0": "ok", "tune0_1": "crashed", "tune0_2": "error", "tune0_3": "cannot implement",
        "tune0_4": "crashed"}
    assert "signal 11" in res["tune0_1"].detail and "hung" in res["tune0_4"].detail
    assert res["tune0_0"].us == 5.0 and res["tune0_0"].tag == "tag0" and torch_us == {"0": 12.0}


def test_knob_variants_come_back_as_their_own_results_and_a_crash_in_one_ends_its_search():
    jobs, tags = _jobs(2)
    jobs[0]["variants"] = [{"raster": "along_n"}, {"raster": "along_m", "swizzle": 2}]
    requests = []

    def process(request, results, timeout_s):
        req = json.loads(Path(request).read_text())
        requests.append(req)
        with open(results, "a") as f:
            def log(**e):
                f.write(json.dumps(e) + "\n")
            log(event="setup", problem="0")
            log(event="torch", problem="0", us=12.0)
            if len(requests) == 1:
                for j, us in (("tune0_0", 5.0), ("tune0_1", 6.0)):
                    log(event="start", job=j)
                    log(event="done", job=j, status="ok", us=us, rel_err=1e-4)
                log(event="start", job="tune0_0@along_n")
                log(event="done", job="tune0_0@along_n", base="tune0_0", launch={"raster": "along_n"},
                    status="ok", us=4.0, rel_err=1e-4)
                log(event="start", job="tune0_0@along_m_swz2")
                return -11, "Segmentation fault"
        return 0, ""

    res, _ = profile_candidates("/lib.so", {"0": {}}, jobs, tags, launch=process,
                                knob_search={"top": 1, "pdl": True})
    assert requests[0]["knob_search"] == {"top": 1, "pdl": True}
    assert requests[0]["jobs"][0]["variants"] == jobs[0]["variants"]
    assert len(requests) == 1                       # nothing left to run after the crash
    assert res["tune0_0@along_n"].status == "ok" and res["tune0_0@along_n"].us == 4.0
    assert res["tune0_0@along_n"].tag == "tag0+along_n" and res["tune0_0@along_n"].launch == {"raster": "along_n"}
    assert res["tune0_0@along_m_swz2"].status == "crashed"
    assert res["tune0_0@along_m_swz2"].tag == "tag0+along_m_swz2"
    assert res["tune0_1"].status == "ok"


def test_a_profiler_that_cannot_start_marks_everything_not_profiled():
    jobs, tags = _jobs(3)
    calls = []

    def dead(request, results, timeout_s):
        calls.append(1)
        return 1, "RuntimeError: No CUDA GPUs are available"

    res, _ = profile_candidates("/lib.so", {"0": {}}, jobs, tags, launch=dead)
    assert len(calls) == 1
    assert {r.status for r in res.values()} == {"not profiled"}
    assert "No CUDA GPUs" in res["tune0_0"].detail


# -- the public entry point ------------------------------------------------------------------

# -- the profiler's operands (its CUDA parts run in tests/gpu/test_tune.py) -------------------

@pytest.mark.parametrize("layout_b, batch, broadcast, layout_a", [
    ("col", 1, False, "row"), ("row", 3, False, "row"), ("col", 2, True, "row"), ("col", 3, False, "col")])
def test_profiler_operands_describe_their_tensors(layout_b, batch, broadcast, layout_a):
    from cutlass_offload.tune.profile import Operands
    spec = {"m": 24, "n": 16, "k": 40, "batch": batch, "dtype": "f32", "layout_b": layout_b,
            "a_batch_broadcast": broadcast, "layout_a": layout_a,
            "epilogue": {"bias": True, "activation": "gelu_erf", "residual": "add", "post_activation": "relu"}}
    ops = Operands(spec, seed=1, device="cpu")
    a = ops.args
    assert (a.m, a.n, a.k, a.l) == (24, 16, 40, batch)
    assert (a.a, a.b, a.c, a.d, a.bias) == tuple(t.data_ptr() for t in (ops.a, ops.b, ops.c, ops.d, ops.bias))
    a_ld = ops.a.stride(2) if layout_a == "col" else ops.a.stride(1)
    assert ops.a.stride(1 if layout_a == "col" else 2) == 1          # M or K contiguous
    assert a.lda == a_ld and a.ldd == ops.d.stride(1) == a.ldc
    assert a.ldb == (ops.b.stride(1))
    assert a.batch_stride_a == (0 if broadcast or batch == 1 else ops.a.stride(0))
    assert a.batch_stride_b == (ops.b.stride(0) if batch > 1 else 0)
    # element (l, m, n) of the epilogue's formula, by hand
    bl = ops.b_logical
    l, m, n = batch - 1, 5, 7
    acc = sum(float(ops.a[0 if broadcast else l, m, i]) * float(bl[l, i, n]) for i in range(40))
    x = torch.nn.functional.gelu(torch.tensor(acc + float(ops.bias[n]))) + ops.c[l, m, n]
    ref = ops.reference()
    assert ref.shape == (batch, 24, 16)
    assert abs(float(ref[l, m, n]) - max(float(x), 0.0)) < 1e-4
    assert torch.allclose(ops.torch_ops(), ref, atol=1e-4)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_tune_needs_a_gpu(tmp_path):
    with pytest.raises(co.DeviceError, match="--tune"):
        tune(_plan(_problem(1024, 768, 768)), OPTIONS, cache=TuningCache(tmp_path))


def test_compile_with_tune_uses_and_saves_the_winners(tmp_path, monkeypatch):
    """compile(tune=True) selects the profiled winners, reports them, and a saved
    folder reloads with them (tune and the final build faked: no GPU, no nvcc)."""
    from cutlass_offload import api
    from cutlass_offload.build.result import BuildResult
    from cutlass_offload.select import sm90
    from cutlass_offload.tune.result import TunedProblem, TuningReport

    lib = tmp_path / "libfake.so"
    lib.write_bytes(b"not a library")
    seen = {}

    def fake_tune(plan, options):
        seen["heuristic"] = [k.config.tag for k in plan.kernels]
        problems = [TunedProblem("key", tuning_id(r.problem), 1, False, k.config.tag,
                                 sm90.CONFIGS["stream_k"].tag, config_to_dict(sm90.CONFIGS["stream_k"]))
                    for r, k in zip(plan.regions, plan.kernels)]
        return TuningReport("fake GPU", problems)

    def fake_build(plan, strategy="sharded", **kw):
        seen["built"] = [k.config.tag for k in plan.kernels]
        return BuildResult(lib, plan, strategy, 0.0, 1)

    monkeypatch.setattr(api, "_tune", fake_tune)
    monkeypatch.setattr(api.build_stage, "build", fake_build)
    monkeypatch.setattr(api.CompiledModel, "open_library", lambda self: None)   # not a real .so
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU()).half()
    out = tmp_path / "out"
    compiled = co.compile(model, (torch.randn(64, 256, dtype=torch.float16),), arch="sm_90a",
                          tune=True, out_dir=out)
    streamk = sm90.CONFIGS["stream_k"].tag
    assert seen["heuristic"] != [streamk] and seen["built"] == [streamk]
    assert compiled.report.tuning["winners"] and "fake GPU" in compiled.report.format()
    loaded, _, _ = co.load(out)                  # no tuning on reload: the manifest's winners
    assert [k.config.tag for k in loaded.plan.kernels] == [streamk]


def test_the_profiling_process_knob_search_retimes_the_fastest_then_tries_pdl(monkeypatch):
    from cutlass_offload.tune import profile

    def fake_job(lib, job, copies, ref, launch=None):
        launch = launch if launch is not None else job.get("launch") or {}
        us = {"a": 5.0, "b": 6.0, "c": 9.0}[job["id"]]
        us -= 1.0 if launch.get("raster") == "along_n" else 0.0
        us -= 0.5 if launch.get("pdl") else 0.0
        return {"status": "ok", "us": us, "rel_err": 1e-4, "detail": ""}

    monkeypatch.setattr(profile, "profile_job", fake_job)
    variants = [{"raster": "along_n"}, {"raster": "along_m"}]
    jobs = [{"id": i, "variants": variants} for i in "abc"]
    timed = [(fake_job(None, j, None, None)["us"], j, {}) for j in jobs]
    events = []
    assert profile._knob_search(None, {"top": 2, "pdl": True}, timed, None, None,
                                lambda **e: events.append(e))
    done = [e for e in events if e["event"] == "done"]
    # the two fastest get both variants; c (9 us) none; then PDL on the best (a along_n)
    assert [e["job"] for e in done] == ["a@along_n", "a@along_m", "b@along_n", "b@along_m",
                                        "a@along_n_pdl"]
    assert done[-1]["launch"] == {"raster": "along_n", "pdl": True} and done[-1]["us"] == 3.5
    assert all(e["base"] == e["job"].split("@")[0] for e in done)
    # a job marked always_variants is retimed with its variants whatever its time
    jobs[2]["always_variants"] = True
    timed = [(fake_job(None, j, None, None)["us"], j, {}) for j in jobs]
    events.clear()
    assert profile._knob_search(None, {"top": 0, "pdl": False}, timed, None, None,
                                lambda **e: events.append(e))
    assert [e["job"] for e in events if e["event"] == "done"] == ["c@along_n", "c@along_m"]


def test_big_problems_are_timed_with_fewer_launches():
    from cutlass_offload.tune.profile import LAUNCHES, launches_for
    small = {"m": 1024, "n": 768, "k": 768, "batch": 1}
    big = {"m": 16384, "n": 32000, "k": 2048, "batch": 1}
    assert launches_for(small) == LAUNCHES
    assert launches_for(big) == 2
    mid = {"m": 4096, "n": 4096, "k": 4096, "batch": 1}
    assert 2 <= launches_for(mid) < LAUNCHES


def test_a_glu_problem_ranked_on_its_plain_proxy_passes_over_n_split_configs(tmp_path):
    """The rank step times a GLU problem's plain proxy, for which the search proposes
    192-row N-split tiles (sm90.fitted_configs); the final step builds the problem's
    own kernels, and a GLU epilogue does not run on an N-split config
    (emit/gemm_sm90.py), so those ranked configs are passed over, not built."""
    glu = _problem(6000, 2 * 768, 768, GemmEpilogue(activation="silu", glu=True))
    proxy = replace(glu, epilogue=GemmEpilogue())
    assert any(c.n_split for c in sm90.fitted_configs(proxy, SMS))

    def n_split_first(tag, spec, launch):
        return 1.0 if "coopn" in tag.split("+")[0] else 9.0

    fb = FakeBuild()
    rep = tune(_plan(glu), OPTIONS, cache=TuningCache(tmp_path), gpu=GPU, builder=fb,
               profiler=FakeProfiler(n_split_first), search="fitted")
    rank, final = fb.plans
    assert any(k.config.n_split for k in rank.kernels)
    assert final.kernels and all(k.epilogue.glu and not k.config.n_split for k in final.kernels)
    (tp,) = rep.problems
    assert "coopn" not in (tp.winner or "")
