"""select/pytorch_faster.py: GEMM / conv2d / attention problems PyTorch was
measured to run faster stay in PyTorch with the times as the reason; nothing else
changes."""
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.ir import AttentionRegion, ConvRegion
from cutlass_offload.partition import partition
from cutlass_offload.select import pytorch_faster as pf
from cutlass_offload.select import select

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


class ConvAttn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)

    def forward(self, x, q, k, v):
        return self.conv(x), F.scaled_dot_product_attention(q, k, v)


def _part():
    x = torch.randn(2, 16, 8, 8).half().to(memory_format=torch.channels_last)
    q, k, v = (torch.randn(2, 4, 64, 32).half() for _ in range(3))
    model = ConvAttn().half().to(memory_format=torch.channels_last)
    return partition(capture(model, (x, q, k, v)).graph_module, CompileOptions(arch="sm90a"))


def _table(part, tmp_path, num_sms=132, attention=True):
    rows = []
    for r in part.regions:
        if isinstance(r, ConvRegion):
            p = r.problem
            rows.append({"kind": "conv2d", "n": p.n, "c": p.c, "k": p.k, "h": p.h, "w": p.w, "r": p.r,
                         "s": p.s, "pad": list(p.pad), "stride": list(p.stride),
                         "dilation": list(p.dilation), "dtype": p.dtype, "heuristic_us": 9.0,
                         "anchor": "cudnn", "anchor_us": 4.5, "heuristic_speedup": 0.5})
        elif isinstance(r, AttentionRegion) and attention:
            p = r.problem
            rows.append({"kind": "attention", "batch": p.batch, "heads": p.heads, "seq_q": p.seq_q,
                         "seq_kv": p.seq_kv, "head_dim": p.head_dim, "head_dim_v": p.head_dim_v,
                         "causal": p.causal, "dtype": p.dtype, "heuristic_us": 5.0,
                         "anchor": "flash", "anchor_us": 6.0, "heuristic_speedup": 1.2})
    data = {"gpu": "NVIDIA H200", "num_sms": num_sms, **pf.entries_from_rows(rows)}
    return pf.PytorchFaster(json.loads(json.dumps(data)))     # through JSON, as from the file


def test_a_listed_problem_stays_in_pytorch_with_the_times(tmp_path, monkeypatch):
    part = _part()
    assert {type(r) for r in part.regions} == {ConvRegion, AttentionRegion}
    table = _table(part, tmp_path)
    assert len(table.conv) == 1 and not table.attention           # attention was faster: not listed
    monkeypatch.setattr(pf, "default", lambda: table)
    plan = select(part, "sm90a", CompileOptions(arch="sm90a"))
    assert [type(r) for r in plan.regions] == [AttentionRegion]
    (fb,) = [f for f in plan.fallbacks if f.op == "conv2d"]
    assert "cudnn 4.5 us" in fb.reason and "9.0 us" in fb.reason and "H200" in fb.reason
    # strict compiles, another SM count and another arch keep every region
    for opts, arch in ((CompileOptions(arch="sm90a", strict=True), "sm90a"),
                       (CompileOptions(arch="sm90a", num_sms=114), "sm90a"),
                       (CompileOptions(arch="sm90a", pytorch_when_faster=False), "sm90a"),
                       (CompileOptions(arch="sm80"), "sm80")):
        assert len(select(part, arch, opts).regions) == 2


def test_the_batch_of_a_dynamic_problem_is_its_example_size(monkeypatch):
    from dataclasses import replace
    part = _part()
    table = _table(part, None)
    conv = next(r for r in part.regions if isinstance(r, ConvRegion))
    dynamic = replace(conv.problem, n=None, n_hint=conv.problem.n)
    assert table.reason(dynamic, 132) is not None
    assert table.reason(replace(conv.problem, n=4), 132) is None


def test_the_packaged_list_loads_and_names_its_gpu():
    t = pf.default()
    if t is None:
        pytest.skip("no list packaged")
    assert "H200" in t.gpu and t.num_sms == 132 and (t.conv or t.attention)


def test_the_benchmark_writes_what_select_reads(tmp_path):
    import kernels_bench as kb
    rows = [{"kind": "attention", "batch": 4, "heads": 12, "seq_q": 1500, "seq_kv": 1500, "head_dim": 64,
             "head_dim_v": 64, "causal": "none", "dtype": "f16", "heuristic_us": 227.0,
             "anchor": "cudnn", "anchor_us": 84.0, "heuristic_speedup": 84 / 227},
            {"kind": "gemm", "heuristic_speedup": None}]          # not profiled: not listed
    path = tmp_path / "faster.json"
    kb.write_pytorch_faster(rows, path, "NVIDIA H200", 132, "test")
    t = pf.PytorchFaster(json.loads(path.read_text()))
    assert len(t.attention) == 1 and not t.conv and not t.gemm


def test_a_merged_write_updates_only_the_problems_the_run_measured(tmp_path):
    """--merge-pytorch-faster: a run over some models gives its problems this run's
    verdict (a problem now faster with ours leaves the list) and keeps the rest; a
    list of another GPU is refused."""
    import kernels_bench as kb

    def row(seq, causal, ours, anchor):
        return {"kind": "attention", "batch": 4, "heads": 32, "seq_q": seq, "seq_kv": seq,
                "head_dim": 64, "head_dim_v": 64, "causal": causal, "dtype": "f16",
                "heuristic_us": ours, "anchor": "cudnn", "anchor_us": anchor,
                "heuristic_speedup": anchor / ours}
    path = tmp_path / "faster.json"
    old = [row(512, "top_left", 27.7, 23.2), row(4096, "none", 175.0, 159.0)]
    kb.write_pytorch_faster(old, path, "NVIDIA H200", 132, "first")
    assert len(json.loads(path.read_text())["attention"]) == 2
    kb.write_pytorch_faster([row(512, "top_left", 21.0, 23.2), row(128, "none", 9.0, 6.0)], path,
                            "NVIDIA H200", 132, "second", merge=True)
    data = json.loads(path.read_text())
    t = pf.PytorchFaster(data)
    assert sorted(k[2] for k in t.attention) == [128, 4096]     # 512 now runs ours
    assert "first" in data["source"] and "second" in data["source"]
    with pytest.raises(ValueError, match="is for NVIDIA H200"):
        kb.write_pytorch_faster([], path, "NVIDIA H100", 132, "third", merge=True)


def test_depthwise_rows_key_the_problem_the_partitioner_states(tmp_path, monkeypatch):
    """benchmarks/depthwise_latency.py's rows (against cuDNN's conv alone) name the
    depthwise conv as the partitioner states it: EfficientNet's 5x5 one at its
    example batch stays in PyTorch with the benchmark named; the same conv measured
    faster with ours, or at another batch, keeps our kernel."""
    import depthwise_latency as dl
    import kernels_bench as kb
    conv = torch.nn.Conv2d(240, 240, 5, padding=2, groups=240).half().to(memory_format=torch.channels_last)
    x = torch.randn(4, 240, 28, 28).half().to(memory_format=torch.channels_last)
    part = partition(capture(conv, (x,), dynamic_batch=True).graph_module, CompileOptions(arch="sm90a"))
    (region,) = part.regions
    assert region.problem.groups == 240
    result = {"n": 4, "c": 240, "h": 28, "r": 5, "stride": 1, "ours_us": 30.0, "cudnn_conv_us": 20.0,
              "conv_speedup": 20 / 30}
    path = tmp_path / "faster.json"
    faster = dict(result, c=480, h=14, ours_us=10.0, conv_speedup=2.0)       # ours wins: not listed
    kb.write_pytorch_faster([dl.list_row(r, "fp16") for r in (result, faster)], path,
                            "NVIDIA H200", 132, "test")
    table = pf.PytorchFaster(json.loads(path.read_text()))
    assert len(table.conv) == 1
    monkeypatch.setattr(pf, "default", lambda: table)
    plan = select(part, "sm90a", CompileOptions(arch="sm90a"))
    (fb,) = plan.fallbacks
    assert not plan.regions and "cudnn conv alone 20.0 us" in fb.reason
    assert "depthwise_latency.py" in fb.reason
    other = partition(capture(conv, (x[:2],)).graph_module, CompileOptions(arch="sm90a"))
    assert len(select(other, "sm90a", CompileOptions(arch="sm90a")).regions) == 1


def test_grouped_conv_rows_from_a_saved_run_key_the_problem_the_partitioner_states(tmp_path):
    """benchmarks/grouped_conv_latency.py --write-pytorch-faster --from-json (no GPU):
    a saved run's row slower than cuDNN's conv alone lands in the list, keyed as the
    partitioner states that grouped conv, so it stays in PyTorch at that batch."""
    import grouped_conv_latency as gl
    row = {"n": 4, "c": 256, "h": 14, "stride": 1, "groups": 8, "ours_us": 30.0,
           "cudnn_conv_us": 20.0, "conv_speedup": 20 / 30}
    run = {"gpu": "NVIDIA H200", "date": "2026-12-05", "dtype": "fp16",
           "rows": [row, dict(row, c=512, ours_us=10.0, conv_speedup=2.0)]}
    saved, path = tmp_path / "run.json", tmp_path / "faster.json"
    saved.write_text(json.dumps(run))
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "num_sms": 132, "conv2d": []}))
    assert gl.main(["--write-pytorch-faster", str(path), "--from-json", str(saved)]) == 0
    table = pf.PytorchFaster(json.loads(path.read_text()))
    assert len(table.conv) == 1
    conv = torch.nn.Conv2d(256, 256, 3, padding=1, groups=8).half()
    x = torch.randn(4, 256, 14, 14).half().to(memory_format=torch.channels_last)
    part = partition(capture(conv, (x,), dynamic_batch=True).graph_module, CompileOptions(arch="sm90a"))
    (region,) = part.regions
    why = table.reason(region.problem, 132)
    assert why is not None and "grouped_conv_latency.py" in why and "20.0 us" in why


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def _gemm_rows(part, slower: set, kernel_of=None):
    """benchmarks/kernels_bench.py's rows of the part's GEMMs (through its own gemm_row), ours
    at 9 us against cuBLAS's 6 for the regions named in ``slower``, 3 against 6 for
    the others."""
    from dataclasses import replace
    from types import SimpleNamespace

    import kernels_bench as kb
    from cutlass_offload.select import choose_kernel, gemm_kernel_tag
    rows = []
    for r in part.regions:
        k = choose_kernel(r.problem, "sm90a", 132)
        tag = kernel_of(r) if kernel_of else gemm_kernel_tag(k)
        us = 9.0 if r.name in slower else 3.0
        cand = SimpleNamespace(tag=tag, status="ok", us=us, launch={})
        tp = SimpleNamespace(candidates=[cand], heuristic=tag, winner=tag, torch_us=6.0)
        static = replace(r.problem, m=r.problem.m or r.problem.m_hint)    # the corpus's capture
        row = kb.gemm_row(static, {"count": 1, "models": ["test"]}, k, tp)
        row.update(heuristic_speedup=6.0 / us, anchor="cublas")
        rows.append(row)
    return rows


def test_a_gemm_listed_with_the_kernel_select_chooses_stays_in_pytorch(tmp_path, monkeypatch):
    """A GEMM problem benchmarks/kernels_bench.py timed slower than cuBLAS (with its rows'
    keys: M at the example size of a dynamic batch, the epilogue tag) stays in
    PyTorch with the times; the faster one runs ours; an entry that timed another
    kernel than select now chooses (a table changed since) is not applied."""
    import kernels_bench as kb
    x = torch.randn(4, 8, 64).half()
    part = partition(capture(Mlp().half(), (x,), dynamic_batch=True).graph_module,
                     CompileOptions(arch="sm90a"))
    up, down = sorted(part.regions, key=lambda r: r.problem.n, reverse=True)
    assert up.problem.m is None and up.problem.epilogue.tag == "bias_gelu"
    path = tmp_path / "faster.json"
    kb.write_pytorch_faster(_gemm_rows(part, {up.name}), path, "NVIDIA H200", 132, "test")
    table = pf.PytorchFaster(json.loads(path.read_text()))
    assert len(table.gemm) == 1
    monkeypatch.setattr(pf, "default", lambda: table)
    plan = select(part, "sm90a", CompileOptions(arch="sm90a"))
    assert [r.name for r in plan.regions] == [down.name]
    (fb,) = plan.fallbacks
    assert "cublas 6.0 us" in fb.reason and "9.0 us" in fb.reason
    # the same problem timed with another kernel: ours runs
    kb.write_pytorch_faster(_gemm_rows(part, {up.name}, kernel_of=lambda r: "64x64x64_c1x1x1_coop"),
                            path, "NVIDIA H200", 132, "test")
    table = pf.PytorchFaster(json.loads(path.read_text()))
    assert len(table.gemm) == 1
    monkeypatch.setattr(pf, "default", lambda: table)
    assert len(select(part, "sm90a", CompileOptions(arch="sm90a")).regions) == 2
    # another example batch is another problem
    other = partition(capture(Mlp().half(), (x[:2],)).graph_module, CompileOptions(arch="sm90a"))
    assert len(select(other, "sm90a", CompileOptions(arch="sm90a")).regions) == 2


def test_an_inductor_only_entry_applies_with_inductor_glue_alone(monkeypatch):
    """An entry measured against Inductor's side (it pads a misaligned output) keeps
    the GEMM in PyTorch for compiles with Inductor glue; with eager glue, where eager
    cuBLAS is the slower one, ours runs. The packaged gpt2 LM head entry is one."""
    from cutlass_offload.config import options_for_glue
    x = torch.randn(4, 8, 64).half()
    head = torch.nn.Linear(64, 50257, bias=False).half()
    part = partition(capture(head, (x,)).graph_module, CompileOptions(arch="sm90a"))
    (r,) = part.regions
    from cutlass_offload.select import choose_kernel, gemm_kernel_tag
    tag = gemm_kernel_tag(choose_kernel(r.problem, "sm90a", 132))
    entry = {"m": 32, "n": 50257, "k": 64, "batch": 1, "dtype": "f16", "layout_a": "row",
             "layout_b": "col", "align": [8, 8, 1], "epilogue": "plain", "kernel": tag,
             "ours_us": 2.0, "anchor": "torch.compile", "anchor_us": 1.0, "glue": "inductor"}
    table = pf.PytorchFaster({"gpu": "NVIDIA H200", "num_sms": 132, "gemm": [entry]})
    monkeypatch.setattr(pf, "default", lambda: table)
    for glue, kept in (("inductor", 0), ("eager", 1)):
        opts = options_for_glue(CompileOptions(arch="sm90a"), glue)
        assert opts.glue == glue
        assert len(select(part, "sm90a", opts).regions) == kept
    real = pf.PytorchFaster(json.loads(pf.FILE.read_text()))
    (lm,) = [e for e in real.gemm.values() if e["n"] == 50257]
    assert lm["glue"] == "inductor" and lm["anchor_us"] < lm["ours_us"]


def test_an_attention_entry_of_inductor_glue_applies_with_that_glue_alone():
    """An attention entry measured with Inductor glue (as whisper-encoder's was, until
    session 43's 192x128 ping-pong tile made ours faster) keeps that attention in
    PyTorch with Inductor glue only; another dtype, batch or GPU runs ours."""
    from cutlass_offload.ir.attention import AttentionProblem
    entry = {"batch": 4, "heads": 12, "seq_q": 1500, "seq_kv": 1500, "head_dim": 64,
             "head_dim_v": 64, "causal": "none", "dtype": "f16", "ours_us": 102.3,
             "anchor": "cudnn", "anchor_us": 82.3, "glue": "inductor"}
    table = pf.PytorchFaster({"gpu": "NVIDIA H200", "num_sms": 132, "attention": [entry]})

    def problem(**kw):
        base = dict(heads=12, seq_q=1500, seq_kv=1500, head_dim=64, head_dim_v=64, dtype="f16",
                    scale=0.125, batch=None, batch_hint=4)
        return AttentionProblem(**{**base, **kw})
    assert "cudnn" in table.reason(problem(), 132, glue="inductor")
    assert table.reason(problem(), 132, glue="eager") is None
    assert table.reason(problem(dtype="bf16"), 132, glue="inductor") is None
    assert table.reason(problem(batch_hint=2), 132, glue="inductor") is None
    assert table.reason(problem(), 114, glue="inductor") is None        # another GPU
