"""GPU: layer_norm / rms_norm regions run offloaded and match a float64 PyTorch
reference (float32 inside transformers' written-out RMS norm, as written there).

One library holds every case's kernel (one build): the suite model takes one
input per case and returns one output per case. Short rows (a warp per row),
rows held in registers and rows streamed from memory (cols beyond 4 vectors per
thread) are all covered.
"""
import copy

import pytest
import torch
import torch.nn as nn

import cutlass_offload as co
from helpers import poison_allocator, rel_err
from norm_cases import CohereLayerNorm, GemmaRMSNorm, LayerNorm1P, LlamaRMSNorm

pytestmark = pytest.mark.gpu
TOL = 1e-2


# (id, module factory, input shape, dtype, input scale). BERT's eps 1e-12 with
# inputs of variance 1e-6: with 1e-5 added instead the output would be ~3x too small.
CASES = [
    ("layer_norm_2x128x64_f16", lambda: nn.LayerNorm(64), (2, 128, 64), torch.float16, 1.0),
    ("layer_norm_128x30_f32", lambda: nn.LayerNorm(30), (128, 30), torch.float32, 1.0),
    ("rms_norm_1x1x4096_f16", lambda: nn.RMSNorm(4096, eps=1e-6), (1, 1, 4096), torch.float16, 1.0),
    ("llama_rms_1x1x4096_f16", lambda: LlamaRMSNorm(4096, eps=1e-6), (1, 1, 4096), torch.float16, 1.0),
    ("bert_layer_norm_eps1e-12", lambda: nn.LayerNorm(768, eps=1e-12), (8, 128, 768), torch.float16, 1e-3),
    ("llama_rms_3x7x256_bf16", lambda: LlamaRMSNorm(256, eps=1e-5), (3, 7, 256), torch.bfloat16, 1.0),
    ("layer_norm_noaffine_5x96_bf16", lambda: nn.LayerNorm(96, elementwise_affine=False), (5, 96),
     torch.bfloat16, 1.0),
    ("layer_norm_streamed_3x20000_f32", lambda: nn.LayerNorm(20000), (3, 20000), torch.float32, 1.0),
    # eps=None: PyTorch's default for an fp16 input, float32's epsilon (1.2e-7), which
    # dominates a mean square of 1e-8 here (the reference below uses it too)
    ("rms_norm_default_eps_4x256_f16", lambda: nn.RMSNorm(256), (4, 256), torch.float16, 1e-4),
    # zero-centred weights, scaled by 1 + weight (Gemma's RMSNorm; Nemotron's LayerNorm1P)
    ("gemma_rms_2x9x2304_bf16", lambda: GemmaRMSNorm(2304), (2, 9, 2304), torch.bfloat16, 1.0),
    ("gemma_rms_3x256_f16", lambda: GemmaRMSNorm(256), (3, 256), torch.float16, 1.0),
    ("layer_norm_1p_4x192_f16", lambda: LayerNorm1P(192), (4, 192), torch.float16, 1.0),
    # the layer norm written out in float32 (Cohere's), weight cast to float32
    ("cohere_layer_norm_2x9x1024_f16", lambda: CohereLayerNorm(1024), (2, 9, 1024), torch.float16, 1.0),
]


class Suite(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norms = nn.ModuleList()
        for _, make, _, dtype, _ in CASES:
            m = make()
            with torch.no_grad():             # weight ~ N(1, 0.5), bias ~ N(0, 0.5)
                for pname, p in m.named_parameters():
                    p.normal_(1.0 if pname == "weight" else 0.0, 0.5)
            self.norms.append(m.to(dtype))

    def forward(self, *xs):
        return tuple(m(x) for m, x in zip(self.norms, xs))


def inputs(seed, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(shape, generator=g) * scale).to(dtype).to(device)
                 for _, _, shape, dtype, scale in CASES)


@pytest.fixture(scope="module")
def suite():
    model = Suite().cuda()
    # eager glue: with Inductor glue ("auto" on a GPU machine) the "auto" norms leave
    # layer / RMS norms to Inductor, and these are the norm kernels' tests
    compiled = co.compile(model, inputs(0), glue="eager")
    return model, compiled


def test_every_case_offloaded(suite):
    _, compiled = suite
    assert len(compiled.plan.regions) == len(CASES), compiled.report.format()
    assert not compiled.plan.fallbacks
    kinds = [r.problem.kind for r in compiled.plan.regions]
    assert kinds == ["layer_norm", "layer_norm", "rms_norm", "rms_norm", "layer_norm", "rms_norm",
                     "layer_norm", "layer_norm", "rms_norm", "rms_norm", "rms_norm", "layer_norm",
                     "layer_norm"]
    assert [r.problem.unit_offset for r in compiled.plan.regions] == [False] * 9 + [True] * 3 + [False]
    assert compiled.plan.regions[12].form == "layer_norm_decomposed"
    assert compiled.plan.regions[8].problem.eps == torch.finfo(torch.float32).eps
    assert compiled.plan.regions[4].problem.eps == 1e-12


def _reference(model, xs):
    ref = copy.deepcopy(model).double()
    for m in ref.modules():
        # eps=None means the computation type's epsilon: float32's for the fp16 model,
        # float64's once .double() made the copy; the reference keeps the model's
        if isinstance(m, nn.RMSNorm) and m.eps is None:
            m.eps = torch.finfo(torch.float32).eps
    with torch.no_grad():
        return ref(*(x.double() for x in xs))


@pytest.mark.parametrize("trial", range(2))
def test_cases_match_float64_reference(suite, trial):
    model, compiled = suite
    xs = inputs(trial + 1)                       # fresh data, not the example inputs
    before = sum(m.fallback_calls for m in compiled.region_modules())
    poison_allocator()
    with torch.no_grad():
        outs = compiled(*xs)
    torch.cuda.synchronize()
    assert sum(m.fallback_calls for m in compiled.region_modules()) == before, \
        "a region fell back to PyTorch instead of running its kernel"
    refs = _reference(model, xs)
    failures = []
    for (name, _, shape, dtype, _), out, ref in zip(CASES, outs, refs):
        assert out.shape == shape and out.dtype == dtype, name
        assert not out.isnan().any(), f"{name}: unwritten (NaN) output"
        err = rel_err(out, ref)
        if not err < TOL:
            failures.append(f"{name}: relative error {err:.2e}")
    assert not failures, failures


def test_eps_is_the_models(suite):
    """The BERT case with eps=1e-5 instead of 1e-12 would be far off: the kernel
    really uses the graph's eps."""
    model, compiled = suite
    xs = inputs(5)
    with torch.no_grad():
        out = compiled(*xs)[4]
        wrong = nn.functional.layer_norm(xs[4].double(), (768,), model.norms[4].weight.double(),
                                         model.norms[4].bias.double(), 1e-5)
    assert rel_err(out, wrong) > 0.1


def test_non_contiguous_and_misaligned_inputs(suite):
    model, compiled = suite
    xs = list(inputs(7))
    x = xs[0]                                        # (2, 128, 64) fp16
    xs[0] = x.transpose(0, 1).contiguous().transpose(0, 1)      # same values, not contiguous
    buf = torch.empty(xs[4].numel() + 1, dtype=xs[4].dtype, device="cuda")
    xs[4] = buf[1:].view_as(xs[4]).copy_(xs[4])      # 2-byte offset: runs PyTorch
    with torch.no_grad():
        outs = compiled(*xs)
    refs = _reference(model, xs)
    assert rel_err(outs[0], refs[0]) < TOL and rel_err(outs[4], refs[4]) < TOL
    mods = compiled.region_modules()
    assert mods[0].copies >= 1 and mods[4].fallback_calls >= 1


def test_cuda_graph_capture(suite):
    model, compiled = suite
    static_in = inputs(11)
    with torch.no_grad():
        compiled(*static_in)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            compiled(*static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = compiled(*static_in)
    for dst, src in zip(static_in, inputs(12)):
        dst.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    refs = _reference(model, static_in)
    for (name, *_), out, ref in zip(CASES, static_out, refs):
        assert rel_err(out, ref) < TOL, name


def test_layer_norm_over_a_non_last_axis_is_not_offloaded():
    model = nn.LayerNorm([128, 64]).half().cuda()
    x = torch.randn(2, 128, 64, dtype=torch.float16, device="cuda")
    compiled = co.compile(model, (x,), glue="eager")      # norms offloaded where they can be
    assert not compiled.plan.regions
    (f,) = compiled.plan.fallbacks
    assert f.op == "layer_norm" and "last axis" in f.reason
    x = torch.randn(2, 128, 64, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        out = compiled(x)
        ref = copy.deepcopy(model).double()(x.double())
    assert rel_err(out, ref) < TOL
