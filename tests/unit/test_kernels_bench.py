"""benchmarks/kernels_bench.py without a GPU: the corpus read into problem objects, the
synthetic grid, the rows and summaries, and the learned table it writes (read back
by select/sm90.py)."""
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from cutlass_offload.ir import ConvProblem, GemmEpilogue, GemmLaunch, GemmProblem
from cutlass_offload.select import choose_kernel, sm90, tuning_id
from cutlass_offload.tune.result import CandidateResult, TunedProblem, config_to_dict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import kernels_bench as kb  # noqa: E402

CORPUS = kb.load_corpus(kb.CORPUS)


def test_corpus_reads_into_problem_objects():
    f16 = kb.gemm_problems(CORPUS, "f16")
    bf16 = kb.gemm_problems(CORPUS, "bf16")
    assert len(f16) == len(bf16) == len(CORPUS["gemm"]) > 0
    assert {p.dtype for p, _ in bf16} == {"bf16"}
    assert sum(i["count"] for _, i in f16) == sum(sum(e["counts"].values()) for e in CORPUS["gemm"])
    assert any(i["models"] == ["llama"] for _, i in f16)
    convs = kb.conv_entries(CORPUS)
    assert len(convs) == len(CORPUS["conv2d"])
    for e in convs:                        # every entry is a valid problem with a batch
        fields = {k: v for k, v in e.items() if k in ConvProblem.__dataclass_fields__}
        fields["epilogue"] = GemmEpilogue(**fields["epilogue"])
        ConvProblem(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
        assert e["n"] >= 1
    att = kb.attention_entries(CORPUS)
    assert att and all(e["bias"] == "none" and e["batch"] >= 1 for e in att)


def test_grid_spans_m_over_the_heaviest_corpus_shapes():
    f16 = kb.gemm_problems(CORPUS, "f16")
    grid = kb.grid_problems(f16, "f16")
    assert len(grid) == kb.GRID_PAIRS * len(kb.GRID_M)
    assert {p.m for p, _ in grid} == set(kb.GRID_M)
    corpus_nk = {(p.n, p.k) for p, _ in f16}
    assert {(p.n, p.k) for p, _ in grid} <= corpus_nk
    assert all(p.epilogue == GemmEpilogue() and i["models"] == ["grid"] for p, i in grid)


def _tp(problem, cands, torch_us=10.0, winner=None):
    h = choose_kernel(problem, "sm90a")
    ok = [c for c in cands if c.status == "ok"]
    best = winner or min(ok, key=lambda c: c.us)
    return TunedProblem("key", tuning_id(problem), 1, False, h.config.tag, best.tag,
                        config_to_dict(sm90.CONFIGS["wide"]), cands, torch_us,
                        winner_launch=best.launch or {})


def test_gemm_row_speedups_and_the_pdl_free_best():
    p = GemmProblem(n=768, k=768, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                    epilogue=GemmEpilogue(bias=True), m=1024, m_hint=1024)
    h = choose_kernel(p, "sm90a")
    cands = [CandidateResult(h.name, h.config.tag, "ok", us=8.0),
             CandidateResult("k2", "w", "ok", us=6.0),
             CandidateResult("k2", "w+pdl", "ok", us=5.0, launch={"pdl": True}),
             CandidateResult("k3", "x", "crashed")]
    row = kb.gemm_row(p, {"count": 3, "models": ["bert-base"]}, h, _tp(p, cands))
    assert row["heuristic_us"] == 8.0 and row["tuned_us"] == 5.0 and row["tuned_no_pdl_us"] == 6.0
    assert row["heuristic_speedup"] == pytest.approx(10 / 8) and row["tuned_speedup"] == 2.0
    assert not row["fused"] and row["failed_candidates"] == ["x: crashed"]
    assert row["flops"] == 2.0 * 1024 * 768 * 768
    missing = kb.gemm_row(p, {"count": 1, "models": []}, h, None)
    assert missing["error"] and missing["heuristic_us"] is None


def test_summary_geomeans_and_floors():
    rows = [{"kind": "gemm", "dtype": "f16", "models": ["a"], "fused": False, "flops": 1e9,
             "heuristic_us": us, "tuned_us": us / 1.1, "anchor_us": 10.0} for us in (10.0, 8.0, 12.5)]
    rows.append({"kind": "gemm", "dtype": "f16", "models": ["grid"], "fused": False, "flops": 1e9,
                 "heuristic_us": 1.0, "tuned_us": 1.0, "anchor_us": 1.0})
    for r in rows:
        kb.add_speedups(r)
    s = kb.summarize(rows, peak_tflops=800.0)
    plain = s["gemm_plain/f16"]
    assert plain["problems"] == 3
    assert plain["heuristic_geomean"] == pytest.approx((1.0 * 1.25 * 0.8) ** (1 / 3))
    assert plain["heuristic_min"] == pytest.approx(0.8)
    assert plain["met"] == {"heuristic_geomean": True, "heuristic_min": False,
                            "tuned_geomean": True, "tuned_min": False}
    assert "gemm_grid/f16" in s and rows[0]["heuristic_tflops"] == pytest.approx(1e9 / 10.0 / 1e6)


def test_written_table_is_what_select_reads(tmp_path):
    plain = GemmProblem(n=768, k=768, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                        m=1024, m_hint=1024)
    fused_bf16 = GemmProblem(n=768, k=768, dtype="bf16", layout_b="col", align_a=8, align_b=8,
                             align_c=8, epilogue=GemmEpilogue(bias=True, activation="relu"),
                             m=1024, m_hint=1024)
    other = GemmProblem(n=3072, k=768, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                        m=1024, m_hint=1024)
    launch = {"raster": "along_n", "swizzle": 2, "splits": 1, "decomposition": "heuristic", "pdl": True}
    tps = []
    for p, cfg, ln in ((plain, sm90.CONFIGS["wide"], launch), (fused_bf16, sm90.CONFIGS["mid"], {}),
                       (other, sm90.CONFIGS["big"], {})):
        tag = cfg.tag + ("+x" if ln else "")
        tps.append(TunedProblem("k", tuning_id(p), 1, False, "h", tag, config_to_dict(cfg),
                                [CandidateResult("n", tag, "ok", us=3.0, launch=ln)], 4.0,
                                winner_launch=ln))
    path = tmp_path / "table.json"
    n = kb.write_table(tps, [(fused_bf16, {}), (plain, {}), (other, {})], path, "NVIDIA H200", 132, "test")
    assert n == 2                          # one entry per shape: the plain f16 problem's winner
    data = json.loads(path.read_text())
    assert data["gpu"] == "NVIDIA H200" and data["cutlass"] and data["date"]
    table = sm90.Table.load(path)
    assert table.lookup(fused_bf16, 132) == (sm90.CONFIGS["wide"], GemmLaunch(**launch))
    assert table.lookup(other, 132)[0] == sm90.CONFIGS["big"]
    sm90.use_table(path)
    try:
        assert choose_kernel(plain, "sm90a").launch == GemmLaunch(**launch)
    finally:
        sm90.use_table(sm90.TABLES / "sm90a_h200.json")


def test_a_column_major_a_gets_an_entry_of_its_own(tmp_path):
    row = GemmProblem(n=1536, k=512, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                      m=4096, m_hint=4096)
    col = replace(row, layout_a="col")
    tps = [TunedProblem("k", tuning_id(p), 1, False, "h", cfg.tag, config_to_dict(cfg),
                        [CandidateResult("n", cfg.tag, "ok", us=3.0)], 4.0)
           for p, cfg in ((row, sm90.CONFIGS["mid"]), (col, sm90.CONFIGS["big"]))]
    path = tmp_path / "table.json"
    assert kb.write_table(tps, [(row, {}), (col, {})], path, "NVIDIA H200", 132, "test") == 2
    assert sorted(e.get("layout_a", "row") for e in json.loads(path.read_text())["entries"]) == ["col", "row"]
    table = sm90.Table.load(path)
    assert table.lookup(row, 132)[0] == sm90.CONFIGS["mid"] and table.lookup(col, 132)[0] == sm90.CONFIGS["big"]


def test_a_source_c_epilogue_keeps_its_own_winner(tmp_path):
    """Where the shape's problem with a residual epilogue measured another winner than
    its plain one (llama's 2048x5632x2048), the table stores it as the entry's
    "residual" choice, which select reads for epilogues that load C; an epilogue
    without C, or a shape whose winners agree, gets the plain winner."""
    def problem(n, epilogue=GemmEpilogue()):
        return GemmProblem(n=n, k=2048, dtype="f16", layout_b="col", align_a=8, align_b=8,
                           align_c=8, epilogue=epilogue, m=2048, m_hint=2048)
    resmul = GemmEpilogue(activation="silu", residual="mul")
    plain, fused, silu = problem(5632), problem(5632, resmul), problem(5632, GemmEpilogue(activation="silu"))
    agree_plain, agree_res = problem(2048), problem(2048, GemmEpilogue(residual="add"))
    wide = sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP)
    pp = sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG)
    pdl = {"raster": "heuristic", "swizzle": 1, "splits": 1, "decomposition": "heuristic", "pdl": True}
    tps = []
    for p, cfg, ln in ((plain, wide, {}), (fused, pp, pdl), (agree_plain, pp, {}), (agree_res, pp, {})):
        tps.append(TunedProblem("k", tuning_id(p), 1, False, "h", cfg.tag, config_to_dict(cfg),
                                [CandidateResult("n", cfg.tag, "ok", us=5.0, launch=ln)], 6.0,
                                winner_launch=ln))
    path = tmp_path / "table.json"
    problems = [(fused, {}), (plain, {}), (agree_res, {}), (agree_plain, {})]
    assert kb.write_table(tps, problems, path, "NVIDIA H200", 132, "test") == 2
    entries = {e["n"]: e for e in json.loads(path.read_text())["entries"]}
    assert entries[5632]["residual"]["from"] == "f16 silu_resmul" and "residual" not in entries[2048]
    table = sm90.Table.load(path)
    assert table.lookup(plain, 132) == (wide, GemmLaunch())
    assert table.lookup(silu, 132) == (wide, GemmLaunch())          # no C: the plain winner
    assert table.lookup(fused, 132) == (pp, GemmLaunch(**pdl))
    near = replace(fused, m=1900, m_hint=1900)                       # the nearest entry's too
    assert table.lookup(near, 132) == (pp, GemmLaunch(**pdl))
    assert table.lookup(agree_res, 132) == (pp, GemmLaunch())


def test_merged_table_keeps_the_shapes_not_searched(tmp_path):
    p = GemmProblem(n=48, k=24, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                    m=777, m_hint=777)                       # a shape no table holds
    cfg = sm90.CONFIGS["narrow"]
    tp = TunedProblem("k", tuning_id(p), 1, False, "h", cfg.tag, config_to_dict(cfg),
                      [CandidateResult("n", cfg.tag, "ok", us=30.0)], 40.0)
    base = json.loads(sm90.TABLE_FILE.read_text())
    path = tmp_path / "merged.json"
    n = kb.write_table([tp], [(p, {})], path, base["gpu"], int(base["num_sms"]), "test", base=base)
    assert n == len(base["entries"]) + 1
    table = sm90.Table.load(path)
    assert table.lookup(p, int(base["num_sms"]))[0] == cfg
    note = json.loads(path.read_text())["note"]           # the base table's history stays
    assert note.startswith(base["note"])
    assert "then test; merged into the table of" in note
    old = base["entries"][0]
    same = GemmProblem(n=old["n"], k=old["k"], dtype="f16", layout_b=old["layout_b"], align_a=8,
                       align_b=8, align_c=8, m=old["m"], m_hint=old["m"], batch=old.get("batch", 1))
    assert table.lookup(same, int(base["num_sms"])) == sm90.Table(base).lookup(same, int(base["num_sms"]))
    with pytest.raises(ValueError, match="merge-table"):
        kb.write_table([tp], [(p, {})], path, "NVIDIA H100", 132, "test", base=base)


def test_lowered_conv_gemms_are_the_convs_sm90a_lowers():
    from cutlass_offload.families import conv_gemm_sm90
    gemms = kb.lowered_conv_gemms(CORPUS, "f16")
    assert gemms and all(i["models"] == ["lowered-conv"] for _, i in gemms)
    assert all(p.epilogue == GemmEpilogue() and p.layout_b == "col" and p.m for p, _ in gemms)
    assert len({(p.m, p.n, p.k) for p, _ in gemms}) == len(gemms)
    stem = [p for p, i in gemms if i["id"].startswith("im2col")]
    assert any((p.n, p.k) == (64, 152) for p in stem)     # ResNet-50: 7*7*3 = 147 -> 152
    rows = [{"kind": "gemm", "dtype": "f16", "models": ["lowered-conv"], "fused": False,
             "heuristic_us": 1.0, "anchor_us": 1.0}]
    assert list(kb.summarize(rows, 800.0)) == ["gemm_lowered_conv/f16"]
    assert conv_gemm_sm90.IM2COL_MAX_C == 8


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_no_gpu_exits_2():
    assert kb.main(["--kinds", "gemm"]) == 2


def test_synthetic_models_give_one_region_per_corpus_entry():
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    from cutlass_offload.ir import AttentionRegion, ConvRegion
    from cutlass_offload.partition import partition
    convs = [e for e in kb.conv_entries(CORPUS) if e["h"] * e["w"] * e["n"] <= 32 * 32 * 2][:3]
    convs += [e for e in kb.conv_entries(CORPUS) if e["epilogue"]["residual"] == "add"
              and e["h"] * e["w"] * e["n"] <= 32 * 32 * 2][:1]
    att = [e for e in kb.attention_entries(CORPUS) if e["seq_q"] * e["seq_kv"] <= 128 * 128][:2]
    for build, entries, cls in ((kb.conv_model, convs, ConvRegion), (kb.attention_model, att, AttentionRegion)):
        model, inputs, firsts = build(entries, "f16")
        assert len(firsts) == len(entries)
        part = partition(capture(model, inputs).graph_module, CompileOptions(arch="sm90a"))
        regions = [r for r in part.regions if isinstance(r, cls)]
        assert len(regions) == len(entries)
        if cls is ConvRegion:
            got = sorted((r.problem.c, r.problem.k, r.problem.h, r.problem.epilogue.residual) for r in regions)
            assert got == sorted((e["c"], e["k"], e["h"], e["epilogue"]["residual"]) for e in entries)


def test_attention_table_from_search_rows(tmp_path):
    """_attention_search.write_table on synthetic searched rows: per class the config
    with the least summed time over the class's rows, only where it beats the default
    by MIN_GAIN; timings that are errors ("fell back") do not count."""
    import _attention_search as search

    from cutlass_offload.families import attention_sm90 as fam
    from cutlass_offload.families.attention_sm90_table import class_key

    d = search._tag(fam.config_for(64))
    pp = search._tag(fam.config_for(64, 128, fam.PINGPONG))
    co = search._tag(fam.config_for(64, 128))

    def row(seq, times, dtype="f16"):
        return {"kind": "attention", "dtype": dtype, "batch": 2, "heads": 8, "head_dim": 64,
                "causal": "none", "seq_q": seq, "seq_kv": seq, "search": times, "search_default": d}
    rows = [row(512, {d: 10.0, pp: 8.0, co: 9.0}), row(500, {d: 10.0, pp: 9.5, co: 7.0}),
            row(128, {d: 5.0, pp: 4.95}),                          # < MIN_GAIN: no row
            row(2048, {d: "fell back", pp: 3.0})]                  # no default timing: no row
    out = tmp_path / "table.json"
    assert search.write_table(rows, out, "GPU", 132) == 1
    data = json.loads(out.read_text())
    (key, r), = data["rows"].items()
    assert key == class_key(64, False, 512, 512)
    assert (r["head"], r["block_kv"], r["schedule"]) == (64, 128, fam.COOPERATIVE)    # 16 < 17.5
    assert r["us"] == 8.0 and r["default_us"] == 10.0


def test_attention_table_merges_into_an_existing_one_and_keeps_the_tile_order(tmp_path, monkeypatch):
    """A search over some models replaces only the classes it searched: an existing
    table's other rows stay, a searched class that no longer wins loses its row; a
    causal winner in the lpt order is written with it and read back by select."""
    import _attention_search as search

    from cutlass_offload.families import attention_sm90 as fam
    from cutlass_offload.families import attention_sm90_table as table
    from cutlass_offload.ir import AttentionProblem

    d = search._tag(fam.config_for(64))
    lpt = search._tag(fam.config_for(64, 128, fam.PINGPONG, order="lpt"))
    assert lpt.endswith("_lpt") and lpt != search._tag(fam.config_for(64, 128, fam.PINGPONG))

    def row(seq, causal, times):
        return {"kind": "attention", "dtype": "f16", "batch": 4, "heads": 32, "head_dim": 64,
                "causal": causal, "seq_q": seq, "seq_kv": seq, "search": times, "search_default": d}
    other = table.class_key(80, False, 1024, 1024)
    stale = table.class_key(64, False, 128, 128)
    out = tmp_path / "table.json"
    old_row = {"head": 64, "block_kv": 128, "schedule": fam.PINGPONG, "us": 1.0, "default_us": 2.0}
    out.write_text(json.dumps({"rows": {other: old_row, stale: old_row}}))
    rows = [row(512, "top_left", {d: 30.0, lpt: 20.0}), row(128, "none", {d: 5.0})]
    assert search.write_table(rows, out, "GPU", 132) == 2
    data = json.loads(out.read_text())
    causal = table.class_key(64, True, 512, 512)
    assert set(data["rows"]) == {other, causal}           # the stale searched class is gone
    assert data["rows"][other] == old_row
    assert data["rows"][causal]["tile_scheduler"] == "lpt"
    monkeypatch.setattr(table, "TABLE_FILE", out)
    table._rows.cache_clear()
    try:
        p = AttentionProblem(batch=4, heads=32, seq_q=512, seq_kv=512, head_dim=64, head_dim_v=64,
                             dtype="f16", scale=0.125, causal="top_left")
        k = fam.choose(p)
        assert k.config == fam.config_for(64, 128, fam.PINGPONG, order="lpt") and k.name.endswith("_lpt_causal")
        # the same class without the mask has no row: the example's order
        assert fam.choose(AttentionProblem(**{**p.__dict__, "causal": "none"})).config.tile_scheduler == "persistent"
    finally:
        table._rows.cache_clear()


def test_staged_epilogue_option_parses():
    # --staged-epilogue switches emit/staged.py on for the run (after the GPU check)
    assert kb.parse_args(["--staged-epilogue"]).staged_epilogue
    assert not kb.parse_args([]).staged_epilogue


def test_a_wide_attention_is_timed_as_its_two_gemms():
    """An attention of head dim above 256 partitions into two GEMM regions, so the bench
    times such an entry as the compiled SDPA module (wide_attention.corpus_row) instead
    of reporting "not offloaded"; other attention entries keep their region. The
    corpus itself lists the VAE's attention as those two GEMMs since session 43."""
    from types import SimpleNamespace

    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    from cutlass_offload.partition import partition
    entries = kb.attention_entries(CORPUS)
    assert not [e for e in entries if max(e["head_dim"], e["head_dim_v"]) > 256]
    vae = {(p.m, p.n, p.k, p.layout_b) for p, i in kb.gemm_problems(CORPUS, "f16") if i["models"] == ["vae-decoder"]}
    assert {(4096, 4096, 512, "col"), (4096, 512, 4096, "row")} <= vae
    small = next(e for e in entries if e["head_dim"] == 64)
    small = {**small, "seq_q": 64, "seq_kv": 64}         # a CPU capture
    wide = {**small, "head_dim": 512, "head_dim_v": 512, "scale": 512 ** -0.5}
    for e, expect in ((wide, True), (small, False)):
        model, inputs, _ = kb.attention_model([e], "f16")
        part = partition(capture(model, inputs).graph_module, CompileOptions(arch="sm90a"))
        assert kb._wide(SimpleNamespace(plan=part), e) is expect
