"""Gated linear units as one GEMM (partition/gated_gemm.py, the GLU epilogue's match in
partition/epilogue.py, its emission and tuner reference; no nvcc, no GPU): which pairs
fuse, the rewritten graph computes what the model does, and the kernel source."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.emit import gemm_sm90, glu_sm90
from cutlass_offload.ir import GemmEpilogue, GemmKernel, GemmProblem, GemmRegion
from cutlass_offload.partition import partition
from cutlass_offload.partition import gated_gemm
from cutlass_offload.partition.gated_gemm import interleave
from cutlass_offload.select import choose_kernel, sm90, tuning_id
from cutlass_offload.tune.profile import split_glu

SM90 = CompileOptions(arch="sm90a")


@pytest.fixture(autouse=True)
def any_k(monkeypatch):
    """The small models here have K = 64: rewrite pairs of any K whatever the default
    threshold (``test_short_k_pairs_stay_apart_below_min_k`` sets one)."""
    monkeypatch.setattr(gated_gemm, "MIN_K", 0)


class MLP(nn.Module):
    """LLaMA's MLP: down(act(gate(x)) * up(x)); ``swap``: the product's operands the
    other way round; ``bias``: biases on gate (and up if "both")."""

    def __init__(self, dim=64, hidden=96, act=F.silu, swap=False, bias=None):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=bias is not None)
        self.up = nn.Linear(dim, hidden, bias=bias == "both")
        self.down = nn.Linear(hidden, dim, bias=False)
        self.act, self.swap = act, swap

    def forward(self, x):
        g, u = self.act(self.gate(x)), self.up(x)
        return self.down(u * g if self.swap else g * u)


def _partition(model, x, options=SM90, dynamic_batch=False):
    cap = capture(model, (x,), dynamic_batch=dynamic_batch)
    return cap.graph_module, partition(cap.graph_module, options)


def _gemms(part):
    return [r for r in part.regions if isinstance(r, GemmRegion)]


def _half(model):
    torch.manual_seed(0)
    return model.to(torch.bfloat16).eval()


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("act,name", [(F.silu, "silu"), (F.gelu, "gelu_erf"),
                                      (lambda t: F.gelu(t, approximate="tanh"), "gelu_tanh")])
def test_gate_and_up_become_one_gemm_with_a_glu_epilogue(swap, act, name):
    model = _half(MLP(act=act, swap=swap))
    gm, part = _partition(model, torch.randn(2, 8, 64, dtype=torch.bfloat16))
    glu = [r for r in _gemms(part) if r.problem.epilogue.glu]
    assert len(glu) == 1 and len(_gemms(part)) == 2          # the GLU GEMM and down
    (r,) = glu
    ep = r.problem.epilogue
    assert (ep.activation, ep.residual, ep.bias) == (name, "none", False)
    assert r.problem.n == 192 and r.problem.k == 64 and r.problem.align_c == 8
    assert any("gated pair" in n for n in r.notes)
    w = gm.get_buffer("_co_gated_0_weight")
    assert torch.equal(w, interleave(model.gate.weight, model.up.weight))
    fresh = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    # the rewritten graph computes the model: the same products of the same rows
    torch.testing.assert_close(gm(fresh), model(fresh), rtol=2e-2, atol=2e-2)


def test_interleave_puts_blocks_of_8_rows_side_by_side():
    g = torch.arange(16 * 3).reshape(16, 3)
    u = -torch.arange(16 * 3).reshape(16, 3)
    w = interleave(g, u)
    assert torch.equal(w[0:8], g[0:8]) and torch.equal(w[8:16], u[0:8])
    assert torch.equal(w[16:24], g[8:16]) and torch.equal(w[24:32], u[8:16])
    assert all(torch.equal(a, b) for a, b in zip(split_glu(w, 0), (g, u)))
    with pytest.raises(ValueError, match="multiple of 8"):
        interleave(g[:12], u[:12])


@pytest.mark.parametrize("bias", ["gate", "both"])
def test_biases_interleave_like_the_weights(bias):
    model = _half(MLP(bias=bias))
    gm, part = _partition(model, torch.randn(16, 64, dtype=torch.bfloat16))
    (r,) = [r for r in _gemms(part) if r.problem.epilogue.glu]
    assert r.problem.epilogue.bias and r.bias is not None
    up_b = model.up.bias if bias == "both" else torch.zeros_like(model.gate.bias)
    assert torch.equal(gm.get_buffer("_co_gated_0_bias"), interleave(model.gate.bias, up_b))
    fresh = torch.randn(16, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(gm(fresh), model(fresh), rtol=2e-2, atol=2e-2)


def test_a_dynamic_batch_stays_dynamic():
    model = _half(MLP())
    gm, part = _partition(model, torch.randn(2, 8, 64, dtype=torch.bfloat16), dynamic_batch=True)
    (r,) = [r for r in _gemms(part) if r.problem.epilogue.glu]
    assert r.problem.m is None
    x5 = torch.randn(5, 8, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(gm(x5), model(x5), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("why,model,options,dtype", [
    ("sm80 has no GLU kernel", MLP(), CompileOptions(arch="sm80"), torch.bfloat16),
    ("off by option", MLP(), CompileOptions(arch="sm90a", combine_gemms=False), torch.bfloat16),
    ("fp32 (TF32) is not an sm90a GLU dtype", MLP(), CompileOptions(arch="sm90a", allow_tf32=True),
     torch.float32),
    ("hidden not a multiple of 8", MLP(hidden=100), SM90, torch.bfloat16),
])
def test_pairs_that_stay_two_gemms(why, model, options, dtype):
    torch.manual_seed(0)
    model = model.to(dtype).eval()
    _, part = _partition(model, torch.randn(16, 64, dtype=dtype), options=options)
    assert not any(r.problem.epilogue.glu for r in _gemms(part)), why
    assert len(_gemms(part)) == 3, why


def test_an_up_projection_used_elsewhere_stays_apart():
    class Leak(MLP):
        def forward(self, x):
            u = self.up(x)
            return self.down(F.silu(self.gate(x)) * u) + u[..., :64]
    _, part = _partition(_half(Leak()), torch.randn(16, 64, dtype=torch.bfloat16))
    assert not any(r.problem.epilogue.glu for r in _gemms(part))


def test_linears_on_different_inputs_stay_apart():
    class Two(MLP):
        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x * 2))
    _, part = _partition(_half(Two()), torch.randn(16, 64, dtype=torch.bfloat16))
    assert not any(r.problem.epilogue.glu for r in _gemms(part))


def _glu_problem(bias=False, act="silu"):
    return GemmProblem(n=11264, k=2048, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                       epilogue=GemmEpilogue(bias=bias, activation=act, glu=True), m=2048, m_hint=2048)


def test_glu_epilogue_fields_and_names():
    ep = GemmEpilogue(bias=True, activation="silu", glu=True)
    assert ep.tag == "bias_glu_silu"
    with pytest.raises(ValueError, match="no residual"):
        GemmEpilogue(activation="silu", residual="mul", glu=True)
    # other problems' tuning ids (and the caches keyed on them) do not name the field
    assert '"glu"' not in tuning_id(GemmProblem(n=64, k=64, dtype="f16", layout_b="col", align_a=8,
                                                align_b=8, align_c=8, m=64))
    assert '"glu": true' in tuning_id(_glu_problem())


def test_glu_kernels_are_sm90a_only():
    k = choose_kernel(_glu_problem(), "sm90a", 132)
    assert k.config.family == "cutlass3x_sm90" and k.epilogue.glu
    with pytest.raises(ValueError, match="GLU epilogue runs on the sm90a"):
        choose_kernel(_glu_problem(), "sm80", 108)
    with pytest.raises(ValueError, match="GLU epilogue"):
        GemmKernel(arch="sm80", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                   epilogue=GemmEpilogue(activation="silu", glu=True),
                   config=choose_kernel(GemmProblem(n=64, k=64, dtype="f16", layout_b="col", align_a=8,
                                                    align_b=8, align_c=8, m=64), "sm80", 108).config)


@pytest.mark.parametrize("bias", [False, True])
def test_glu_source_swaps_the_epilogue_only(bias):
    cfg = sm90._config((128, 176, 64), (2, 1, 1), sm90.COOP)
    glu = GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                     epilogue=GemmEpilogue(bias=bias, activation="silu", glu=True), config=cfg)
    src = gemm_sm90.emit(glu)
    code = src.code
    assert "co_glu::GluEpilogue<ElementD, ElementBias, co_act::SiLU, " \
           f"{'true' if bias else 'false'}," in code
    assert "cutlass::epilogue::NoSmemWarpSpecialized" in code
    assert code.count("#ifndef CO_GLU_EPILOGUE_H") == 1
    assert "CollectiveBuilder<\n    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,\n    TileShape, ClusterShape" \
        not in code                              # no TMA epilogue built
    assert ("static_cast<ElementBias const*>(args.bias);" in code) == bias
    assert "MMA_64x176x16_F32F16F16_SS" in code        # the wide wgmma as for any 176 tile
    assert set(glu_sm90.INCLUDES) <= set(src.includes)
    # everything but the epilogue (type and arguments) is the plain kernel's text
    plain_k = GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                         epilogue=GemmEpilogue(), config=cfg)
    plain = gemm_sm90.emit(plain_k).code.replace(plain_k.name, glu.name)

    def parts(c):
        body = c.split("using CollectiveMainloop")[1]
        return body.split("  arguments.epilogue.thread")[0], body.split("// launch knobs")[1]
    assert parts(code) == parts(plain)


def test_glu_store_form_is_in_the_source(monkeypatch):
    # the two store forms (benchmarks/glu_epilogue.py's A/B) are different source
    # texts, so the kernel cache keeps them apart
    cfg = sm90._config((128, 128, 64), (1, 1, 1), sm90.PINGPONG)
    k = GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                   epilogue=GemmEpilogue(bias=True, activation="gelu_erf", glu=True), config=cfg)
    monkeypatch.setattr(glu_sm90, "GLU_STAGED", True)
    staged = gemm_sm90.emit(k).code
    assert "cutlass::epilogue::NoSmemWarpSpecialized, TileShape, true>>;" in staged
    assert "staged in shared memory" in staged
    monkeypatch.setattr(glu_sm90, "GLU_STAGED", False)
    registers = gemm_sm90.emit(k).code
    assert "cutlass::epilogue::NoSmemWarpSpecialized, TileShape, false>>;" in registers
    assert "written from registers" in registers
    assert staged.replace("true>>;", "false>>;") != registers      # the comment differs too


def test_tuner_reference_and_unfused_sequence_agree():
    from cutlass_offload.tune.profile import Operands
    spec = {"m": 32, "n": 64, "k": 48, "batch": 1, "dtype": "f32", "layout_b": "col",
            "epilogue": {"bias": True, "activation": "silu", "residual": "none",
                         "post_activation": "identity", "glu": True}}
    ops = Operands(spec, seed=3, device="cpu")
    assert tuple(ops.d.shape) == (1, 32, 32) and ops.args.ldd == 32
    torch.testing.assert_close(ops.torch_ops(), ops.reference(), rtol=1e-4, atol=1e-4)
    # against the model's own form: act(x @ Wg^T + bg) * (x @ Wu^T + bu)
    wg, wu = split_glu(ops.b[0], 0)
    bg, bu = split_glu(ops.bias, 0)
    ref = F.silu(ops.a[0] @ wg.T + bg) * (ops.a[0] @ wu.T + bu)
    torch.testing.assert_close(ops.reference()[0], ref, rtol=1e-4, atol=1e-4)


def test_the_tuner_times_a_glu_problem_with_its_own_epilogue():
    # the profiler's description carries the GLU field, so its operands (D of N / 2
    # columns) and reference are the GLU's, not a plain GEMM's of the same N
    from cutlass_offload.tune import problem_spec
    from cutlass_offload.tune.profile import Operands
    spec = problem_spec(GemmProblem(n=64, k=32, dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                                    epilogue=GemmEpilogue(activation="silu", glu=True), m=16))
    assert spec["epilogue"]["glu"] is True
    ops = Operands({**spec, "dtype": "f32"}, seed=0, device="cpu")
    assert tuple(ops.d.shape) == (1, 16, 32) and tuple(ops.reference().shape) == (1, 16, 32)


def test_a_saved_folder_holds_the_weights_once_and_loads_the_same_glu_plan(tmp_path, monkeypatch):
    # the folder keeps the captured program (the model's own gate and up weights); the
    # load partitions it again and interleaves them anew (no nvcc: the fake one)
    import cutlass_offload as co
    from cutlass_offload import weights
    from fault_helpers import fake_env
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    model = _half(MLP(dim=64, hidden=128))
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    out = tmp_path / "out"
    compiled = co.compile(model, (x,), arch="sm_90a", out_dir=out, glue="eager")
    names = sorted(k.name for k in compiled.plan.distinct_kernels)
    assert any("glu_silu" in n for n in names)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert (out / weights.BIN).stat().st_size <= params + 4096
    loaded, _, _ = co.load(out, reference=False)
    assert sorted(k.name for k in loaded.plan.distinct_kernels) == names


class GEGLU(nn.Module):
    """diffusers' GEGLU: one projection split in halves, ``up * gelu(gate)``;
    ``gate_first``: the gate is the first half instead."""

    def __init__(self, dim=64, inner=96, gate_first=False, bias=True):
        super().__init__()
        self.proj = nn.Linear(dim, 2 * inner, bias=bias)
        self.out = nn.Linear(inner, dim)
        self.gate_first = gate_first

    def forward(self, x):
        a, b = self.proj(x).chunk(2, dim=-1)
        up, gate = (b, a) if self.gate_first else (a, b)
        return self.out(up * F.gelu(gate))


@pytest.mark.parametrize("gate_first", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_a_projection_split_in_halves_becomes_a_glu_gemm(gate_first, bias):
    model = _half(GEGLU(gate_first=gate_first, bias=bias))
    gm, part = _partition(model, torch.randn(2, 8, 64, dtype=torch.bfloat16), dynamic_batch=True)
    (r,) = [r for r in _gemms(part) if r.problem.epilogue.glu]
    assert (r.problem.n, r.problem.epilogue.activation, r.problem.epilogue.bias) == (192, "gelu_erf", bias)
    assert len(_gemms(part)) == 2 and any("gate half" in n for n in r.notes)
    w = model.proj.weight
    gate, up = (w[:96], w[96:]) if gate_first else (w[96:], w[:96])
    assert torch.equal(gm.get_buffer("_co_gated_0_weight"), interleave(gate, up))
    x5 = torch.randn(5, 8, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(gm(x5), model(x5), rtol=2e-2, atol=2e-2)


def test_halves_of_another_split_stay_apart():
    class Thirds(GEGLU):
        def forward(self, x):
            a, b, c = self.proj(x).chunk(3, dim=-1)
            return a * F.gelu(b) + c
    _, part = _partition(_half(Thirds(inner=96)), torch.randn(16, 64, dtype=torch.bfloat16))
    assert not any(r.problem.epilogue.glu for r in _gemms(part))


def test_short_k_pairs_stay_apart_below_min_k(monkeypatch):
    # a K threshold still keeps short pairs apart (gated_gemm.MIN_K; 2048 was the
    # register-stored epilogue's, measured on the UNet's GEGLU shapes)
    monkeypatch.setattr(gated_gemm, "MIN_K", 2048)
    for model in (MLP(), GEGLU()):
        _, part = _partition(_half(model), torch.randn(16, 64, dtype=torch.bfloat16))
        assert not any(r.problem.epilogue.glu for r in _gemms(part))
    model = _half(MLP(dim=2048, hidden=64))
    _, part = _partition(model, torch.randn(16, 2048, dtype=torch.bfloat16))
    assert [r.problem.k for r in _gemms(part) if r.problem.epilogue.glu] == [2048]


@pytest.mark.parametrize("tile_n, tma", [(128, True), (176, False), (96, True), (64, True)])
def test_the_glu_tma_store_form_takes_output_widths_of_whole_16_columns(monkeypatch, tile_n, tma):
    # GLU_TMA: the products go out by TMA (templates/staged_tma_epilogue.h, Glu_) where
    # tile N / 2 is a multiple of 16; other tiles keep glu_epilogue.h
    cfg = sm90._config((128, tile_n, 64), (1, 1, 1), sm90.PINGPONG)
    k = GemmKernel(arch="sm90a", dtype="f16", layout_b="col", align_a=8, align_b=8, align_c=8,
                   epilogue=GemmEpilogue(bias=True, activation="silu", glu=True), config=cfg)
    monkeypatch.setattr(glu_sm90, "GLU_TMA", True)
    assert glu_sm90.glu_tma(k) == tma
    code = gemm_sm90.emit(k).code
    assert ("co_staged::TmaStagedEpilogue<void, ElementD, ElementBias, co_act::SiLU, true, true, 0," in code) == tma
    assert ("co_glu::GluEpilogue<" in code) == (not tma)
    assert code.count("#ifndef CO_STAGED_TMA_EPILOGUE_H") == int(tma)
    assert code.count("#ifndef CO_GLU_EPILOGUE_H") == int(not tma)
    if tma:
        assert code.rstrip().count(", true>>;") >= 1           # Glu_ = true
    monkeypatch.setattr(glu_sm90, "GLU_TMA", False)
    assert "co_glu::GluEpilogue<" in gemm_sm90.emit(k).code


def test_the_staged_knob_takes_the_glu_to_tma_stores(monkeypatch):
    cfg = sm90._config((128, 128, 64), (1, 1, 1), sm90.COOP)
    k = GemmKernel(arch="sm90a", dtype="bf16", layout_b="col", align_a=8, align_b=8, align_c=8,
                   epilogue=GemmEpilogue(activation="gelu_erf", glu=True), config=cfg)
    assert not glu_sm90.glu_tma(k)
    monkeypatch.setenv("CUTLASS_OFFLOAD_STAGED_EPILOGUE", "1")
    assert glu_sm90.glu_tma(k)
    assert ", 2, true>>;" in gemm_sm90.emit(k).code         # the cooperative kernel's two groups
    monkeypatch.setenv("CUTLASS_OFFLOAD_STAGED_EPILOGUE", "rows")
    assert not glu_sm90.glu_tma(k)
