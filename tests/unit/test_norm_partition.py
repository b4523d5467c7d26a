"""Norm regions (no nvcc, no GPU): which layer_norm / rms_norm forms are offloaded,
with the graph's eps, which stay in PyTorch with a reason; the kernel chosen, the
region module's mapping (CPU tensors, no launch) and the emitted source."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.build.shards import estimate, job_slots, plan_shards
from cutlass_offload.capture import capture
from cutlass_offload.emit import emit_kernel, emit_launchers
from cutlass_offload.ir import NormKernel, NormRegion
from cutlass_offload.partition import partition
from cutlass_offload.report import Report
from cutlass_offload.runtime.compiled_model import offload
from cutlass_offload.runtime.norm_region import NormRegionModule
from cutlass_offload.select import select
from norm_cases import LlamaRMSNorm

H = torch.float16


class T5LayerNorm(LlamaRMSNorm):
    """transformers' T5LayerNorm: x (not x.float()) times the rsqrt."""

    def forward(self, hidden_states):
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(self.weight.dtype)
        return self.weight * hidden_states


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def parts(model, *inputs, arch="sm80"):
    cap = capture(model, inputs)
    part = partition(cap.graph_module)
    return cap, part, select(part, arch)


def only_region(part) -> NormRegion:
    assert not part.fallbacks, part.fallbacks
    (r,) = part.regions
    assert isinstance(r, NormRegion)
    return r


def test_layer_norm_last_axis_keeps_the_models_eps():
    """BERT's LayerNorm(768, eps=1e-12): the kernel gets 1e-12, not 1e-5."""
    _, part, plan = parts(nn.LayerNorm(768, eps=1e-12).half(), torch.randn(2, 16, 768, dtype=H))
    r = only_region(part)
    p = r.problem
    assert (r.form, p.kind, p.dtype, p.cols, p.eps) == ("layer_norm", "layer_norm", "f16", 768, 1e-12)
    assert p.weight and p.bias and r.weight and r.bias and p.rows == 32
    (k,) = plan.kernels
    assert k.name == "rowwise_layer_norm_f16_vec8_weight_bias"
    assert (k.kind, k.args_type, k.config.family) == ("layer_norm", "CoNormArgs", "rowwise_norm")


def test_layer_norm_default_eps_comes_from_the_schema():
    _, part, _ = parts(Fn(lambda x: torch.ops.aten.layer_norm.default(x, [64])), torch.randn(4, 64, dtype=H))
    r = only_region(part)
    assert r.problem.eps == 1e-5 and not r.problem.weight and not r.problem.bias


def test_layer_norm_over_more_than_the_last_axis_stays_in_pytorch():
    _, part, plan = parts(nn.LayerNorm([8, 64]).half(), torch.randn(2, 8, 64, dtype=H))
    assert not part.regions and not plan.regions
    (f,) = part.fallbacks
    assert f.op == "layer_norm" and "only a norm over the last axis" in f.reason


def test_rms_norm_over_a_non_last_axis_stays_in_pytorch():
    def f(x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(1, keepdim=True) + 1e-6)).half()
    _, part, _ = parts(Fn(f), torch.randn(2, 8, 64, dtype=H))
    assert not part.regions
    (fb,) = part.fallbacks
    assert fb.op == "rms_norm" and "only the last axis" in fb.reason


def test_dynamic_hidden_size_stays_in_pytorch():
    m = Fn(lambda x: F.layer_norm(x, (x.shape[-1],), eps=1e-6))
    cap = capture(m, (torch.randn(4, 64),), dynamic_shapes=(({1: torch.export.Dim.AUTO},),))  # *xs
    part = partition(cap.graph_module)
    assert not part.regions and "dynamic hidden size" in part.fallbacks[0].reason


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("form", ["aten", "llama", "t5"])
def test_rms_norm_forms_with_eps_1e6(form, dtype):
    model = {"aten": lambda: nn.RMSNorm(64, eps=1e-6), "llama": lambda: LlamaRMSNorm(64),
             "t5": lambda: T5LayerNorm(64)}[form]().to(dtype)
    _, part, plan = parts(model, torch.randn(2, 8, 64).to(dtype))
    r = only_region(part)
    p = r.problem
    assert r.form == ("rms_norm" if form == "aten" else "rms_norm_decomposed")
    assert (p.kind, p.eps, p.cols, p.weight, p.bias) == ("rms_norm", 1e-6, 64, True, False)
    assert r.x in ("x", "hidden_states")           # the input placeholder, before any cast
    (k,) = plan.kernels
    name = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}[dtype]
    assert k.name == f"rowwise_rms_norm_{name}_vec{4 if name == 'f32' else 8}_weight"


def test_llama_form_region_covers_the_whole_form():
    _, part, _ = parts(LlamaRMSNorm(4096, eps=1e-5).half(), torch.randn(1, 1, 4096, dtype=H))
    r = only_region(part)
    assert r.problem.eps == 1e-5
    assert r.nodes[0] == "to" and r.nodes[-1] == "mul_1"
    assert {"pow_1", "mean", "add", "rsqrt", "mul", "to_1"} <= set(r.nodes)


def test_rms_norm_without_weight_and_eps_from_the_constant():
    def f(x):
        xf = x.to(torch.float32)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 3e-7)).to(x.dtype)
    _, part, plan = parts(Fn(f), torch.randn(4, 96, dtype=torch.bfloat16))
    r = only_region(part)
    assert r.problem.eps == 3e-7 and not r.problem.weight and r.weight is None
    assert plan.kernels[0].name == "rowwise_rms_norm_bf16_vec8_noaffine"


def test_aten_rms_norm_without_eps_takes_pytorchs_default():
    """nn.RMSNorm's eps=None is the computation type's epsilon: float32's for fp16, bf16
    and fp32 inputs (checked against torch's own rms_norm on tiny inputs, where eps
    dominates the mean square)."""
    f32_eps = torch.finfo(torch.float32).eps
    _, part, _ = parts(nn.RMSNorm(64).half(), torch.randn(2, 64, dtype=H))
    assert only_region(part).problem.eps == f32_eps
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(4, 64, dtype=dtype) * 1e-4
        default = torch.rms_norm(x, [64], None, None)
        assert torch.equal(default, torch.rms_norm(x, [64], None, f32_eps))
        assert not torch.allclose(default, torch.rms_norm(x, [64], None, torch.finfo(dtype).eps * 4))


def test_fp32_layer_norm_128x30():
    _, part, plan = parts(nn.LayerNorm(30), torch.randn(128, 30))
    r = only_region(part)
    assert (r.problem.dtype, r.problem.cols, r.problem.rows, r.problem.align) == ("f32", 30, 128, 2)
    assert plan.kernels[0].name == "rowwise_layer_norm_f32_vec2_weight_bias"


def test_plain_rsqrt_is_no_norm_and_no_fallback():
    _, part, _ = parts(Fn(lambda x: torch.rsqrt(x.abs() + 1.0)), torch.randn(4, 64))
    assert part.regions == () and part.fallbacks == ()


def test_mixed_dtype_weight_stays_in_pytorch():
    w = torch.randn(64)
    _, part, _ = parts(Fn(lambda x, w: F.layer_norm(x, (64,), w, None, 1e-5)),
                       torch.randn(4, 64, dtype=H), w)
    assert not part.regions and "differs from the input" in part.fallbacks[0].reason


def test_statistic_used_elsewhere_stays_in_pytorch():
    def f(x):
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (xf * r).half(), r
    _, part, _ = parts(Fn(f), torch.randn(4, 64, dtype=H))
    assert not part.regions and "rsqrt" in part.fallbacks[0].reason


def test_bert_block_gemm_residual_then_layer_norm():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense, self.ln = nn.Linear(64, 64), nn.LayerNorm(64, eps=1e-12)

        def forward(self, h, x):
            return self.ln(self.dense(h) + x)
    _, part, plan = parts(Block().half(), torch.randn(2, 8, 64, dtype=H), torch.randn(2, 8, 64, dtype=H))
    gemm, norm = part.regions
    assert gemm.problem.epilogue.tag == "bias_resadd"
    assert isinstance(norm, NormRegion) and norm.x == gemm.output and norm.problem.eps == 1e-12
    report = Report.from_plan(plan)
    (entry,) = [e for e in report.regions if e["form"] == "layer_norm"]
    assert entry["norm"] == {"kind": "layer_norm", "rows_hint": 16, "cols": 64, "eps": 1e-12,
                             "weight": True, "bias": True}
    assert "layer_norm:plain x1" in report.format()


# ----------------------------------------------------------------- region module

def norm_module(model, *inputs):
    cap = capture(model, inputs)
    plan = select(partition(cap.graph_module), "sm80")
    gm = offload(cap.graph_module, plan, library_path=None)
    (mod,) = [m for m in gm.modules() if isinstance(m, NormRegionModule)]
    return mod


@pytest.mark.parametrize("model", [lambda: LlamaRMSNorm(64).half(), lambda: nn.LayerNorm(64).half()])
def test_fallback_subgraph_computes_the_original(model):
    m = model()
    with torch.no_grad():
        m.weight.normal_()
    mod = norm_module(m, torch.randn(2, 8, 64, dtype=H))
    x = torch.randn(3, 5, 64, dtype=H)
    xs = (x, m.weight.detach()) + ((m.bias.detach(),) if getattr(m, "bias", None) is not None else ())
    assert torch.equal(mod.fallback(*xs), m(x))


def test_mapping_rows_cols_eps_and_refusals():
    ln = nn.LayerNorm(64, eps=1e-12).half()
    mod = norm_module(ln, torch.randn(2, 8, 64, dtype=H))
    w, b = ln.weight.detach(), ln.bias.detach()
    x = torch.randn(3, 5, 64, dtype=H)
    out, args, keep = mod._map((x, w, b))
    assert out.shape == x.shape and out.dtype == H and out.is_contiguous()
    assert (args.rows, args.cols) == (15, 64) and args.input == x.data_ptr()
    assert args.weight == w.data_ptr() and args.bias == b.data_ptr() and args.output == out.data_ptr()
    assert abs(args.eps - 1e-12) < 1e-18
    xt = torch.randn(64, 15, dtype=H).t()                       # non-contiguous: copied
    out, args, keep = mod._map((xt, w, b))
    assert keep[0].is_contiguous() and torch.equal(keep[0], xt) and args.input == keep[0].data_ptr()
    assert mod.copies == 1
    assert mod._map((x.float(), w, b)) is None                  # dtype
    assert mod._map((torch.randn(4, 32, dtype=H), w, b)) is None  # cols
    assert mod._map((torch.randn(0, 64, dtype=H), w, b)) is None  # empty
    odd = torch.randn(15 * 64 + 1, dtype=H)[1:].view(15, 64)    # 2-byte offset: not 16-byte aligned
    assert mod._map((odd, w, b)) is None
    assert mod._map((x, w.float(), b)) is None                  # weight dtype


# ----------------------------------------------------------------- emit and build plan

def test_emitted_source_takes_eps_at_run_time():
    src = emit_kernel(NormKernel("sm80", "layer_norm", "bf16", 4, True, True))
    assert src.args_type == "CoNormArgs" and src.name == "rowwise_layer_norm_bf16_vec4_weight_bias"
    assert f"namespace {src.name} {{" in src.code
    assert "int run(const CoNormArgs& args, cudaStream_t stream)" in src.code
    assert "int64_t workspace_size(const CoNormArgs&)" in src.code
    assert "1e-5" not in src.code and "1e-05" not in src.code and "args.eps" in src.code
    assert "device_layernorm" not in "".join(src.includes) and "malloc" not in src.code.lower()
    rms = emit_kernel(NormKernel("sm90a", "rms_norm", "f16", 8, False, False))
    assert "kRms = true" in rms.code and "kWeight = false" in rms.code


def test_launchers_and_shards_for_norm_kernels():
    m = nn.Sequential(nn.LayerNorm(64).half(), LlamaRMSNorm(64).half())
    cap = capture(m, (torch.randn(4, 64, dtype=H),))
    plan = select(partition(cap.graph_module), "sm90a")
    assert [type(r).__name__ for r in plan.regions] == ["NormRegion", "NormRegion"]
    tu = emit_launchers(plan)
    for r in plan.regions:
        assert f'extern "C" int co_{r.name}(const CoNormArgs* args' in tu.text
    shards = plan_shards(list(plan.distinct_kernels), 2)
    assert sorted(k.name for s in shards for k in s) == sorted(k.name for k in plan.distinct_kernels)
    assert estimate(list(plan.distinct_kernels)) > 0 and job_slots(plan.kernels) >= 1


def test_aot_autograd_forms_of_the_torch_compile_backend():
    """native_layer_norm + getitem, _to_copy casts, and aten.rms_norm decomposed with
    the weight multiplied in fp32 before the final cast."""
    from torch._dynamo.backends.common import aot_autograd

    from cutlass_offload.partition.canonicalize import canonicalize
    seen = []

    def fw(gm, inputs):
        seen.append(partition(canonicalize(gm)))
        return gm
    m = nn.Sequential(nn.LayerNorm(64, eps=1e-12), LlamaRMSNorm(64), nn.RMSNorm(64, eps=1e-6)).half().eval()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            torch.compile(m, backend=aot_autograd(fw_compiler=fw))(torch.randn(4, 64, dtype=H))
    finally:
        torch._dynamo.reset()
    (part,) = seen
    assert not part.fallbacks, part.fallbacks
    assert [r.form for r in part.regions] == ["layer_norm", "rms_norm_decomposed", "rms_norm_decomposed"]
    ln, llama, rms = (r.problem for r in part.regions)
    assert ln.eps == 1e-12 and llama.eps == 1e-6 and abs(rms.eps - 1e-6) < 1e-12
    assert all(p.weight for p in (ln, llama, rms)) and ln.bias
    assert part.regions[0].nodes[-1].startswith("getitem")


class _Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)
        self.ln = nn.LayerNorm(64)
        self.gn = nn.GroupNorm(8, 64)

    def forward(self, x, img):
        return self.ln(self.lin(x) + x), self.gn(img)


@pytest.mark.parametrize("choice, kept, offloaded", [
    ("all", [], ["group_norm", "layer_norm"]),
    ("auto", [], ["group_norm", "layer_norm"]),          # unresolved: as "all"
    ("group", ["layer_norm"], ["group_norm"]),
    ("none", ["group_norm", "layer_norm"], []),
])
def test_offload_norms_choices(choice, kept, offloaded):
    from cutlass_offload.config import CompileOptions

    m = _Norms().to(torch.float16).eval()
    xs = (torch.randn(2, 8, 64, dtype=torch.float16), torch.randn(2, 64, 4, 4, dtype=torch.float16))
    part = partition(capture(m, xs).graph_module, CompileOptions(arch="sm80", offload_norms=choice))
    assert sorted(r.form for r in part.regions if "norm" in r.form) == offloaded
    by_choice = [f for f in part.fallbacks if "offload_norms" in f.reason]
    assert sorted(f.op for f in by_choice) == kept
    assert all("by choice" in f.reason and repr(choice) in f.reason for f in by_choice)
    assert any(r.form == "linear" for r in part.regions)


def test_options_for_glue_by_glue():
    from cutlass_offload.config import CompileOptions, options_for_glue

    auto = CompileOptions(arch="sm90a")
    assert options_for_glue(auto, "inductor").offload_norms == "group"
    assert options_for_glue(auto, "eager").offload_norms == "all"
    strict = CompileOptions(arch="sm90a", strict=True)
    assert options_for_glue(strict, "inductor").offload_norms == "all"     # strict: no choices
    assert options_for_glue(CompileOptions(arch="sm90a", offload_norms="none"), "eager").offload_norms == "none"
    with pytest.raises(ValueError, match="offload_norms"):
        CompileOptions(arch="sm90a", offload_norms="some")
    # the norm choice follows the glue the model is planned to run with
    assert options_for_glue(auto, "eager", "inductor").offload_norms == "group"
    assert options_for_glue(auto, "eager", "inductor").glue == "eager"


def test_a_gpu_less_compile_with_auto_glue_plans_for_inductor(tmp_path, monkeypatch):
    """A folder compiled on a machine without a GPU (glue "auto": eager here) loads
    with Inductor glue on a GPU host with Triton, so its norms are planned for that
    glue: layer norms stay in the graph (found by a fresh-user trial: such folders
    ran every layer norm as a region under Inductor, the slower setup). An explicit
    eager glue keeps them offloaded."""
    import json

    import cutlass_offload as co
    from cutlass_offload.runtime import glue as glue_mod
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert glue_mod.GlueSpec("auto").planned() == "inductor"
    assert glue_mod.GlueSpec("eager").planned() == "eager"
    m = _Norms().to(torch.float16).eval()
    xs = (torch.randn(2, 8, 64, dtype=torch.float16), torch.randn(2, 64, 4, 4, dtype=torch.float16))
    for glue, norms in (("auto", "group"), ("eager", "all")):
        out = tmp_path / glue
        compiled = co.compile(m, xs, arch="sm_80", glue=glue, out_dir=out, offload_norms="auto")
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["options"]["offload_norms"] == norms
        assert ("layer_norm" in {r.form for r in compiled.plan.regions}) == (norms == "all")


def test_norm_header_matches_the_emitter():
    """templates/rowwise_norm.cuh is inlined as is; its register cache size is the
    one the emitter documents and sizes with."""
    import re

    from cutlass_offload.emit import norm as emit_norm
    text = (emit_norm.Path(emit_norm.__file__).parent / "templates" / "rowwise_norm.cuh").read_text()
    assert int(re.search(r"constexpr int kCachedVectors = (\d+);", text).group(1)) == emit_norm.CACHED_VECTORS
    assert emit_norm._COMMON == text
