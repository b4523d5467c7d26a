"""GPU (sm_90 only): the Hopper attention kernel (emit/attention_sm90.py, CUTLASS
examples/88) on the SD UNet's attention shapes (head dims 40 / 80 / 160 on the 64 /
128 / 256 head tiles, seq 4096 / 1024 / 256 / 64, cross-attention with 77 keys),
causal masks (top-left with seq_q <= seq_kv, bottom-right run on the last seq_kv
queries), a K/V length that ends inside a key tile, a query length that ends inside
a 128-row tile, BERT / GPT-2-like shapes, f16 and bf16. The conformance cases the
Hopper kernel takes run in tests/gpu/test_attention.py (same float64 reference).

Every case must run on the Hopper kernel with no fallback; outputs match a float64
reference (tests/attention_cases.py) within 1e-2; inputs are fresh random values per
trial and the allocator is poisoned with NaN, so rows or head-dim columns the kernel
does not write show up. Each test runs twice: with the example's TMA epilogue storing
O, and with the staged one (emit/attention_sm90.STAGED_EPILOGUE,
templates/fmha_staged_epilogue.h).
"""
import pytest
import torch
from attention_cases import (
    DTYPES,
    SuiteModel,
    _case,
    case_id,
    reference,
    rel_err_nan,
    suite_inputs,
)
from helpers import poison_allocator

from cutlass_offload.emit import attention_sm90 as emit_attention_sm90
from cutlass_offload.families import attention_sm90

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU (H100 / H200)")]

TOL = 1e-2
CASES = [
    # SD 1.5 UNet at 512x512, batch 2 (diffusers: (B, S, N*E) projections viewed BSNH)
    _case(layout="bsnh", b=2, s=4096, s_kv=4096, n=8, h=40, h_v=40),
    _case(layout="bsnh", b=2, s=4096, s_kv=77, n=8, h=40, h_v=40),
    _case(layout="bsnh", b=2, s=1024, s_kv=1024, n=8, h=80, h_v=80),
    _case(layout="bsnh", b=2, s=1024, s_kv=77, n=8, h=80, h_v=80),
    _case(layout="bsnh", b=2, s=256, s_kv=256, n=8, h=160, h_v=160),
    _case(layout="bsnh", b=2, s=64, s_kv=77, n=8, h=160, h_v=160),
    # causal
    _case(b=2, s=256, s_kv=256, n=4, h=64, h_v=64, causal="top_left"),
    _case(b=2, s=136, s_kv=200, n=4, h=128, h_v=128, causal="top_left"),
    _case(b=2, s=200, s_kv=136, n=4, h=64, h_v=64, causal="bottom_right"),  # 64 rows see no key
    _case(b=2, s=512, s_kv=512, n=4, h=64, h_v=64, causal="top_left", dtype="bf16"),
    _case(layout="bsnh", b=1, s=384, s_kv=384, n=12, h=64, h_v=64, causal="top_left"),
    # no mask: BERT-like, keys ending inside a tile, long K/V with head dim 256
    _case(layout="bsnh", b=8, s=128, s_kv=128, n=12, h=64, h_v=64),
    _case(b=2, s=128, s_kv=100, n=4, h=128, h_v=128, dtype="bf16"),
    _case(b=2, s=64, s_kv=300, n=4, h=256, h_v=256),
    # query lengths that are no multiple of 8: Whisper's 1500 frames, odd ones
    _case(layout="bsnh", b=2, s=1500, s_kv=1500, n=12, h=64, h_v=64),
    _case(b=2, s=77, s_kv=77, n=4, h=64, h_v=64, causal="top_left"),
    _case(b=3, s=13, s_kv=200, n=4, h=128, h_v=128, dtype="bf16"),
    _case(b=1, s=1, s_kv=9, n=2, h=32, h_v=32),
]


def _compile(model, xs, tuned=None):
    """Eager glue, and no region left to PyTorch for being measured faster
    (select/pytorch_faster.py): these tests are about the kernel."""
    from cutlass_offload.api import compile_captured
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    return compile_captured(capture(model, xs), CompileOptions(arch="sm90a", pytorch_when_faster=False),
                            tuned=tuned)


@pytest.fixture(scope="module", params=[False, True], ids=["tma_epilogue", "staged_epilogue"])
def epilogue_form(request):
    """How O is stored: the example's TMA epilogue, or the staged one, for the
    module's compiles (a kernel's source differs, so its cache entry does)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(emit_attention_sm90, "STAGED_EPILOGUE", request.param)
        yield request.param


@pytest.fixture(scope="module")
def suite(epilogue_form):
    model = SuiteModel(CASES)
    compiled = _compile(model, suite_inputs(CASES, "cuda"))
    for k in compiled.plan.distinct_kernels:      # the form the build compiled
        assert ("co_fmha::StagedFwdEpilogue<" in emit_attention_sm90.emit(k).code) == epilogue_form
    return model, compiled


def _regions(compiled):
    return compiled.region_modules()


def test_every_case_runs_on_the_hopper_kernel(suite):
    _, compiled = suite
    assert len(compiled.plan.regions) == len(CASES), compiled.report.format()
    assert not compiled.plan.fallbacks, compiled.report.format()
    assert {k.config.family for k in compiled.plan.kernels} == {"cutlass3x_sm90"}
    for r, k in zip(compiled.plan.regions, compiled.plan.kernels):
        assert k == attention_sm90.choose(r.kernel_problem), (r.name, k.name)


def _check(model, compiled, inputs, outs):
    failures = []
    for c, xs, out in zip(CASES, model.split(inputs), outs):
        ref = reference(c, *xs)
        err = rel_err_nan(out, ref)
        if out.shape != ref.shape or out.dtype != DTYPES[c["dtype"]] or not err <= TOL:
            failures.append(f"{case_id(c)}: {tuple(out.shape)} {out.dtype} rel err {err:.3e}")
    return failures


@pytest.mark.parametrize("trial", range(2))
def test_cases_match_reference(suite, trial):
    model, compiled = suite
    inputs = suite_inputs(CASES, "cuda", seed=100 * (trial + 1))
    poison_allocator()
    with torch.no_grad():
        outs = compiled(*inputs)
    torch.cuda.synchronize()
    assert sum(m.fallback_calls for m in _regions(compiled)) == 0, "a call fell back to PyTorch"
    failures = _check(model, compiled, inputs, outs)
    assert not failures, "\n".join(failures)


def test_cuda_graph_replay_reuses_the_workspace(suite):
    """The log-sum-exp workspace is allocated once per region and reused (no
    allocation per call); the whole suite replays in a CUDA graph on new inputs."""
    model, compiled = suite
    inputs = suite_inputs(CASES, "cuda", seed=7)
    with torch.no_grad():
        compiled(*inputs)
        ws = {m.region.name: m._ws.data_ptr() for m in _regions(compiled)}
        compiled(*inputs)
        assert ws == {m.region.name: m._ws.data_ptr() for m in _regions(compiled)}
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = compiled(*inputs)
        fresh = suite_inputs(CASES, "cuda", seed=8)
        for x, y in zip(inputs, fresh):
            x.copy_(y)
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
    assert sum(m.fallback_calls for m in _regions(compiled)) == 0
    failures = _check(model, compiled, inputs, outs)
    assert not failures, "\n".join(failures)


# Every config of families/attention_sm90.CONFIGS (f16; causal for every other ping-pong
# one and for every heaviest-first "lpt" one, which only causal problems take)
# on a problem of its own whose head dim fills the tile or leaves 8 columns to the
# TMA zero-fill, with lengths that end inside a tile: the configs a search or the
# learned table may pick, checked before they are picked.
def _config_cases():
    out = []
    for i, cfg in enumerate(attention_sm90.CONFIGS):
        q, kv, d = cfg.tile
        h = d - 8 if i % 2 else d
        causal = ("top_left" if cfg.tile_scheduler == "lpt"
                  or (cfg.kernel_schedule == attention_sm90.PINGPONG and i % 2) else "none")
        out.append((cfg, _case(b=2, s=200 + i, s_kv=300 + 7 * i, n=3, h=h, h_v=h, causal=causal)))
    return out


CONFIG_CASES = _config_cases()


@pytest.fixture(scope="module")
def every_config(epilogue_form):
    from cutlass_offload.select import attention_tuning_id
    cases = [c for _, c in CONFIG_CASES]
    model = SuiteModel(cases)
    xs = suite_inputs(cases, "cuda")
    plain = _compile(model, xs)
    assert len(plain.plan.regions) == len(cases), plain.report.format()
    tuned = {attention_tuning_id(r.kernel_problem): cfg
             for r, (cfg, _) in zip(plain.plan.regions, CONFIG_CASES)}
    assert len(tuned) == len(cases)
    return cases, model, _compile(model, xs, tuned)


def test_every_config_matches_reference(every_config):
    cases, model, compiled = every_config
    assert not compiled.plan.fallbacks, compiled.report.format()
    got = {k.config for k in compiled.plan.kernels}
    assert got == set(attention_sm90.CONFIGS), compiled.report.format()
    inputs = suite_inputs(cases, "cuda", seed=11)
    poison_allocator()
    with torch.no_grad():
        outs = compiled(*inputs)
    torch.cuda.synchronize()
    assert sum(m.fallback_calls for m in compiled.region_modules()) == 0
    failures = []
    for (cfg, c), xs, out, k in zip(CONFIG_CASES, model.split(inputs), outs, compiled.plan.kernels):
        err = rel_err_nan(out, reference(c, *xs))
        if not err <= TOL:
            failures.append(f"{k.name} {case_id(c)}: rel err {err:.3e}")
    assert not failures, "\n".join(failures)
