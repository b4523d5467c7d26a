"""benchmarks/runtime.py without a GPU: FLOPs per region kind from the problem
objects, grouping of identical region calls, the issue-6 target flags, the
markdown report, and the no-GPU exit."""
import sys
from pathlib import Path

import pytest
import torch

from cutlass_offload.ir import (
    AttentionProblem,
    AttentionRegion,
    ConvProblem,
    ConvRegion,
    GemmProblem,
    GemmRegion,
    GroupNormProblem,
    GroupNormRegion,
    NormProblem,
    NormRegion,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _region_stats as rs
import _runtime_report as report
import runtime


def gemm(n=3072, k=768, batch_mode="fold", **kw):
    p = GemmProblem(n=n, k=k, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8, **kw)
    return GemmRegion("r0", "linear", ("linear",), "x", "w", p, batch_mode=batch_mode)


def conv(c=64, k=256, hw=56, rs_=1, stride=1, pad=0):
    p = ConvProblem(c=c, k=k, h=hw, w=hw, r=rs_, s=rs_, dtype="f16", align_a=8, align_b=8, align_c=8,
                    pad=(pad,) * 4, stride=(stride, stride))
    return ConvRegion("r1", ("conv2d",), "x", "w", p)


def attention(causal="none", seq_q=128, seq_kv=128, d=64, dv=64, out_layout="bmhk"):
    p = AttentionProblem(heads=12, seq_q=seq_q, seq_kv=seq_kv, head_dim=d, head_dim_v=dv,
                         dtype="f16", scale=d ** -0.5, causal=causal)
    return AttentionRegion("r2", "sdpa", ("sdpa",), "q", "k", "v", p, out_layout=out_layout)


# ------------------------------------------------------------------------- FLOPs

def test_gemm_flops_are_2mnk_with_batch():
    assert rs.region_flops(gemm(), (8, 128, 3072)) == 2 * 8 * 128 * 3072 * 768
    batched = gemm(n=128, k=64, batch_mode="batched", batch=None)
    assert rs.region_flops(batched, (96, 128, 128)) == 2 * 96 * 128 * 128 * 64
    assert rs.gemm_rows(batched, (96, 128, 128)) == (96, 128)
    assert rs.gemm_rows(gemm(), (8, 128, 3072)) == (1, 1024)


def test_conv_flops_are_2npqkcrs():
    c = conv(c=64, k=64, hw=56, rs_=3, stride=2, pad=1)
    assert (c.problem.p, c.problem.q) == (28, 28)
    assert rs.region_flops(c, (8, 64, 28, 28)) == 2 * 8 * 28 * 28 * 64 * 64 * 3 * 3
    assert rs.gemm_m(c, (8, 64, 28, 28)) == 8 * 28 * 28


def test_attention_flops_match_4bhsqskvd_without_a_mask():
    r = attention()
    assert rs.region_flops(r, (8, 128, 12, 64)) == 4 * 8 * 12 * 128 * 128 * 64
    strided = attention(seq_q=64, seq_kv=77, d=40, dv=40, out_layout="strided")   # (B, H, L, Ev)
    assert rs.region_flops(strided, (2, 12, 64, 40)) == 4 * 2 * 12 * 64 * 77 * 40
    assert rs.region_flops(attention(d=64, dv=32), (1, 128, 12, 32)) == 2 * 12 * 128 * 128 * (64 + 32)


def test_causal_attention_counts_visible_pairs_only():
    assert rs.visible_pairs(4, 4, "top_left") == 1 + 2 + 3 + 4
    assert rs.visible_pairs(2, 5, "bottom_right") == 4 + 5             # last queries see more keys
    assert rs.visible_pairs(5, 2, "bottom_right") == 0 + 0 + 0 + 1 + 2  # first rows see no key
    assert rs.visible_pairs(3, 7, "none") == 21
    r = attention(causal="top_left")
    assert rs.region_flops(r, (8, 128, 12, 64)) == 2 * 8 * 12 * (128 * 129 // 2) * 128


def test_dynamic_attention_needs_the_calls_seq_kv():
    r = attention(seq_q=None, seq_kv=None)
    with pytest.raises(ValueError, match="seq_kv"):
        rs.region_flops(r, (8, 128, 12, 64))
    assert rs.region_flops(r, (8, 128, 12, 64), seq_kv=32) == 4 * 8 * 12 * 128 * 32 * 64


def test_norms_have_no_flops_and_no_gemm_m():
    ln = NormRegion("r3", "layer_norm", ("ln",), "x",
                    NormProblem("layer_norm", "f16", cols=768, eps=1e-12, align=8))
    gn = GroupNormRegion("r4", ("gn",), "x", GroupNormProblem("f16", c=320, h=64, w=64, groups=32,
                                                             eps=1e-5, align=2, silu=True))
    for r, shape in ((ln, (8, 128, 768)), (gn, (2, 320, 64, 64))):
        assert rs.region_flops(r, shape) is None and rs.gemm_m(r, shape) is None
    assert rs.describe(ln, (8, 128, 768)) == "layer_norm 1024x768"
    assert rs.describe(gn, (2, 320, 64, 64)) == "N2 C320 64x64 G32+silu"
    with pytest.raises(TypeError):
        rs.region_kind(ln.problem)


# ----------------------------------------------------------------------- grouping

def test_identical_calls_group_and_count():
    x = torch.empty(8, 128, 768, dtype=torch.float16)
    w = torch.empty(3072, 768, dtype=torch.float16)
    same = rs.region_signature(gemm(), (x, w), "k1")
    assert same == rs.region_signature(gemm(), (x.clone(), w.clone()), "k1")
    other_stride = rs.region_signature(gemm(), (x.transpose(0, 1).contiguous().transpose(0, 1), w), "k1")
    other_kernel = rs.region_signature(gemm(), (x, w), "k2")
    other_problem = rs.region_signature(gemm(n=768, k=768), (x, w[:768]), "k1")
    groups = rs.group_by_signature([(same, "a"), (other_stride, "b"), (same, "c"), (other_kernel, "d"),
                                    (other_problem, "e"), (same, "f")])
    assert [members for _, members in groups] == [["a", "c", "f"], ["b"], ["d"], ["e"]]
    # the PyTorch side (no kernel) is one group for every kernel choice
    assert rs.region_signature(gemm(), (x, w), None) == rs.region_signature(gemm(), (x, w), None)


class _Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.head(self.b(self.a(x)))


def test_record_region_calls_groups_a_models_identical_regions(monkeypatch):
    """One forward (regions emulated by their PyTorch subgraphs: no GPU) groups the
    two identical 64 -> 64 linears and keeps the 64 -> 32 head apart."""
    from cutlass_offload.capture import capture
    from cutlass_offload.partition import partition
    from cutlass_offload.runtime.compiled_model import CompiledModel, offload
    from cutlass_offload.runtime.region import RegionModule
    from cutlass_offload.select import select
    model = _Chain().half()
    x = torch.randn(4, 16, 64, dtype=torch.float16)
    cap = capture(model, (x,))
    plan = select(partition(cap.graph_module), "sm90a")
    compiled = CompiledModel(offload(cap.graph_module, plan, None), plan, None, None)
    monkeypatch.setattr(RegionModule, "forward", lambda self, *xs: self.fallback(*xs))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    groups = runtime.record_region_calls(compiled, (x,))
    assert sorted((g["count"], g["out_shape"]) for g in groups) == [(1, (4, 16, 32)), (2, (4, 16, 64))]
    g = next(g for g in groups if g["count"] == 2)
    assert rs.describe(g["module"].region, g["out_shape"]) == "M64 N64 K64"
    assert rs.region_flops(g["module"].region, g["out_shape"]) == 2 * 64 * 64 * 64


# -------------------------------------------------------------------- target flags

def test_gemm_target_flags():
    assert rs.target_flag("gemm", 256, 10.1, 10.0) == "MISS"       # M >= 256: not slower at all
    assert rs.target_flag("gemm", 4096, 10.0, 10.0) == "ok"
    assert rs.target_flag("gemm", 255, 11.9, 10.0) == "ok"         # small M: within 1.2x
    assert rs.target_flag("gemm", 77, 12.1, 10.0) == "MISS"
    assert rs.target_flag("conv2d", 10 ** 6, 12.0, 10.0) == "slower"   # no target stated
    assert rs.target_flag("attention", None, 9.0, 10.0) == ""
    with pytest.raises(ValueError):
        rs.target_flag("gemm", None, 1.0, 1.0)
    with pytest.raises(ValueError):
        rs.target_flag("gemm", 512, 0.0, 1.0)


# ------------------------------------------------------------------------- report

def _row(kind, shape, count, ours, theirs, flag):
    return {"kind": kind, "shape": shape, "count": count, "kernel": "k", "ours_us": ours,
            "pytorch_us": theirs, "ratio": ours / theirs, "lost_us_per_forward": count * (ours - theirs),
            "flag": flag, "tflops": 500.0, "pct_peak": 70.0}


def _variant(label):
    rows = [_row("gemm", "M1024 N768 K3072", 12, 30.0, 28.0, "MISS"),
            _row("gemm", "M77 N1280 K768", 4, 11.0, 10.0, "ok"),
            _row("attention", "BH96 Sq128 Skv128 D64", 12, 9.0, 12.0, "")]
    return {"variant": label, "source": "/tmp/co_bert-base", "regions": 109, "kernels": 5,
            "rel_err_vs_eager": 1.4e-3, "layout_conversions_per_forward": 0, "ours_ms": 10.4,
            "ours_graph_ms": 0.883, "ours_graph_error": None, "region_calls_fell_back": 0,
            "region_groups": rows, "region_device_us": {"ours": 500.0, "pytorch": 480.0},
            "gemm_target_misses": {"groups": 1, "regions": 12, "of_groups": 2, "of_regions": 16},
            "host_overhead": [{"kind": "gemm", "call_us": 14.0, "fast_path": True, "python_call_us": 30.0,
                               "map_us": 6.0, "pytorch_call_us": 9.0,
                               "kernel_device_us": 3.0, "gpu_bound": False, "meets_target": False}],
            "ours_vs_eager": 0.74, "ours_vs_torch_compile": 1.9, "graph_ours_vs_pytorch": 0.47,
            "e2e_target": "MISS"}


def test_report_tables_from_a_result():
    result = {"gpu": "NVIDIA H200", "torch": "2.11", "dtype": "fp16", "reps": 20,
              "peaks": {"tflops": 700.0, "gbps": 4000.0},
              "models": [{"model": "bert-base", "eager_ms": 14.0, "eager_graph_ms": 1.877,
                          "torch_compile_ms": 5.48, "torch_compile_s": 19.9,
                          "heuristic": _variant("heuristic"), "tuned": runtime.NO_TUNE}]}
    text = report.format_report(result, top=2, target_us=runtime.OVERHEAD_TARGET_US)
    assert "| bert-base | heuristic | 109 (5) | 14.00 | 5.48 (20 s) | 10.40 |" in text
    assert "| bert-base | tuned | n/a (no --tune in this build) |" in text
    worst = [r["shape"] for r in report.worst_offenders(result["models"][0]["heuristic"]["region_groups"], 2)]
    assert worst == ["M1024 N768 K3072", "M77 N1280 K768"]                  # 24 us, then 4 us lost
    assert "| gemm | M1024 N768 K3072 | 12 | k | 30.0 | 28.0 | 1.07 | 500.0 TFLOP/s (70%) | 24.0 | MISS |" in text
    assert "| 14.0 | yes | 30.0 | 6.0 | 9.0 | 3.0 | no |" in text
    assert "host dispatch 9.52 ms of 10.40 ms" in text and "GEMM target missed by 1/2 shapes" in text


# ------------------------------------------------------------------------ the CLI

def test_templates_must_name_the_model():
    with pytest.raises(SystemExit):
        runtime.parse_args(["bert-base", "gpt2", "--from", "/tmp/co"])
    a = runtime.parse_args(["bert-base", "--from", "/tmp/co", "--no-regions", "--reps", "5"])
    assert (a.from_tpl, a.regions, a.reps, a.tuned_tpl) == ("/tmp/co", False, 5, None)
    assert runtime.parse_args([]).models == list(runtime.DEFAULT_MODELS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_without_a_gpu_it_says_so_and_exits_2(capsys):
    assert runtime.main(["bert-base"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


# --------------------------------------------------------- issue 16: glue and anchors

def _glue_model(tc=4.0, ro=2.0, oi=3.0, oro=1.5, errs=(1e-3, 2e-3)):
    acc = {"rel_err_fp32_fresh": errs[0], "rel_err_fp32_batch2": errs[1]}
    return {"model": "llama", "eager_ms": 9.0,
            "anchors": {"default": {"ms": tc, "compile_s": 40.0, **acc},
                        "reduce-overhead": {"ms": ro, "compile_s": 50.0, **acc}},
            "ours_inductor": {"ms": oi, "first_call_s": 30.0, **acc},
            "ours_inductor_ro": {"ms": oro, "first_call_s": 31.0, **acc},
            "ours_setup": {"load_or_compile_s": 120.0}}


def test_done_when_verdicts():
    assert report.judge(_glue_model(oi=3.6, oro=1.8), 1e-2)["verdict"] == "met"      # exactly 0.90x
    near = report.judge(_glue_model(oi=3.6, oro=1.808), 1e-2)["verdict"]           # 0.904x
    assert near == "MISS: reduce-overhead 0.904x", near
    miss = report.judge(_glue_model(oi=3.7, oro=1.5), 1e-2)
    assert miss["verdict"].startswith("MISS") and "plain 0.925x" in miss["verdict"]
    assert miss["plain_met"] is False and miss["ro_met"] is True
    slower = report.judge(_glue_model(oro=2.5), 1e-2)
    assert "reduce-overhead 1.250x" in slower["verdict"] and "slower than torch.compile" in slower["verdict"]
    bad = report.judge(_glue_model(errs=(1e-3, "error: static batch")), 1e-2)
    assert "error above tolerance" in bad["verdict"] and "ours_inductor:batch2" in bad["verdict"]
    m = _glue_model()
    del m["anchors"]["reduce-overhead"]
    assert report.judge(m, 1e-2)["verdict"] == "incomplete: no torch.compile reduce-overhead"


def test_interleaved_rounds_decide_the_ratios():
    # sequentially ours RO looked slower (1.6 vs 1.5 ms: the host slowed down between
    # the steps); round by round it is 0.8x: the verdict follows the rounds
    m = _glue_model(oi=3.0, oro=1.6, ro=1.5)
    m["paired"] = {"rounds": 3, "reps_per_round": 20,
                   "default": {"ours_ms": [3.0, 3.1, 2.9], "torch_compile_ms": [4.0, 4.0, 4.0],
                               "ratio": 0.75},
                   "reduce-overhead": {"ours_ms": [1.6, 1.2, 1.2], "torch_compile_ms": [2.0, 1.5, 1.5],
                                       "ratio": 0.8}}
    d = report.judge(m, 1e-2)
    assert (d["plain_vs_torch_compile"], d["ro_vs_torch_compile_ro"]) == (0.75, 0.8)
    assert d["sequential"]["ro"] == 1.6 / 1.5 and d["ratios_from"] == "3 interleaved rounds"
    assert d["verdict"] == "met" and d["slower_than_neither"] is True
    m["paired"]["reduce-overhead"] = {"error": "RuntimeError: out of memory"}
    d = report.judge(m, 1e-2)            # a failed step: the sequential figures, said so
    assert d["ratios_from"] == "sequential steps" and "slower than torch.compile" in d["verdict"]


def test_paired_rounds_rotate_and_pair():
    import _timing
    calls = []
    clock = iter(range(1, 1000))
    ms = {}

    def fake_events_ms(fn, reps, warmup=3):
        fn()
        return ms[calls[-1]] * next(clock)      # the host slows down call by call

    fns = {n: (lambda n=n: calls.append(n)) for n in ("ours", "torch_compile")}
    ms.update(ours=1.0, torch_compile=2.0)
    orig = _timing.events_ms
    _timing.events_ms = fake_events_ms
    try:
        t = _timing.paired_ms(fns, 4, 5)
    finally:
        _timing.events_ms = orig
    assert calls == ["ours", "torch_compile", "torch_compile", "ours"] * 2
    assert [len(v) for v in t.values()] == [4, 4]
    # drift makes the later fn of each round look slower; pairing per round halves it
    assert 0.4 < _timing.paired_ratio(t, "ours", "torch_compile") < 0.7


def test_glue_table_has_every_column():
    m = _glue_model()
    m["done_when"] = report.judge(m, 1e-2)
    result = {"models": [m, {"model": "vae-decoder", "error": "ValueError: unknown model"}]}
    text = report.glue_table(result)
    assert ("| llama | 9.00 | 4.00 (40 s) | 2.00 (50 s) | - | - | - | 3.00 (30 s) | 1.50 (31 s) | 120 | 0.75 | 0.75 "
            "| sequential steps (0.75 / 0.75) |") in text
    assert "1.0e-03 / 2.0e-03, 1.0e-03 / 2.0e-03 | met |" in text
    assert "| vae-decoder | FAILED: ValueError: unknown model |" in text


def test_new_flags():
    a = runtime.parse_args(["llama", "--quick", "--max-autotune-models", "none", "--budget-s", "420",
                            "--resume", "--second-batch", "3", "--no-dynamic-batch"])
    assert (a.reps, a.regions, a.max_autotune, a.budget_s, a.resume, a.second_batch, a.dynamic_batch) == (
        10, False, set(), 420.0, True, 3, False)
    assert runtime.parse_args(["gpt2"]).max_autotune == {"bert-base", "llama"}
    assert runtime.parse_args(["gpt2", "--max-autotune-models", "all"]).max_autotune == {"gpt2"}
    assert runtime.parse_args(["gpt2", "--no-compile-baseline"]).no_anchors
    assert set(runtime.ZOO_MODELS) <= set(runtime.DEFAULT_MODELS)


def test_fresh_inputs_and_second_batch():
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    ids = torch.tensor([[1, 7, 3]])
    fx, fids, flag = runtime.fresh_inputs((x, ids, True), seed=1)
    assert fx.shape == x.shape and fx.is_contiguous(memory_format=torch.channels_last)
    assert not torch.equal(fx, x) and fids.dtype == ids.dtype and int(fids.max()) <= 7 and flag is True
    assert torch.equal(runtime.fresh_inputs((x,), seed=1)[0], fx)          # deterministic
    assert [runtime.second_batch(b, None) for b in (8, 4, 2, 1)] == [4, 2, 4, 2]
    assert runtime.second_batch(8, 3) == 3


def test_resume_keeps_finished_models_and_peaks(tmp_path):
    path = tmp_path / "r.json"
    assert runtime.load_partial(path, ["llama"]) == ({}, None, [])
    path.write_text('{"peaks": {"tflops": 1}, "models": [{"model": "llama", "eager": {}}, '
                    '{"model": "gpt2", "error": "x"}, {"model": "bert-base"}]}')
    done, peaks, others = runtime.load_partial(path, ["llama", "gpt2"])
    assert list(done) == ["llama"] and peaks == {"tflops": 1}          # a failed model runs again
    assert others == [{"model": "bert-base"}]                           # not named: kept
    b = runtime.Budget(None)
    assert not b.exhausted()
    b = runtime.Budget(0.0)
    assert not b.exhausted()              # a run always starts one step
    b.started = True
    assert b.exhausted()


def test_every_flag_has_help_and_the_description_names_it():
    p = runtime.build_parser()
    for act in p._actions:
        assert act.help, f"{act.option_strings or act.dest} has no help text"
        if act.option_strings and "--help" not in act.option_strings:
            # a BooleanOptionalAction is named by either form (--no-regions, --dynamic-batch)
            assert any(f in runtime.__doc__ for f in act.option_strings), act.option_strings
    for step in ("eager", "torch_compile_", "ours_inductor", "ours_inductor_ro", "paired",
                 "heuristic", "tuned"):
        assert f"``{step}" in runtime.__doc__, step
    assert p.get_default("paired_rounds") == 5


def test_region_calls_pairs_each_input_with_the_region_module_that_reads_it():
    """_timing.region_calls: one forward with pre-hooks; each input's region module and
    the arguments the model passed it, in input order; hooks removed after."""
    import _timing

    class Region(torch.nn.Module):
        def forward(self, x, w):
            return x @ w

    class Compiled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Region(), Region()
            self.w = torch.randn(4, 4)

        def region_modules(self):
            return [self.a, self.b]

        def forward(self, x, y, *unused):
            return self.b(y, self.w), self.a(x, self.w)

    c = Compiled()
    x, y = torch.randn(2, 4), torch.randn(3, 4)
    (ma, aa), (mb, ab) = _timing.region_calls(c, (x, y))
    assert ma is c.a and aa[0] is x and mb is c.b and ab[0] is y and ab[1] is c.w
    assert not c.a._forward_pre_hooks and not c.b._forward_pre_hooks
    with pytest.raises(KeyError, match="no region module"):
        _timing.region_calls(c, (x, y, torch.randn(1)))
