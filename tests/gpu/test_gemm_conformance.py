"""GPU: the conformance GEMM cases (and extras) run offloaded and match a float32
reference. One library per dtype holds every case's kernel (one build)."""
import random

import pytest
import torch

import cutlass_offload as co
from helpers import TOLERANCE, poison_allocator, rel_err
from gemm_cases import (SuiteModel, case_forward, case_id, conformance_cases, example_dims,
                        suite_dynamic_shapes, suite_inputs)

pytestmark = pytest.mark.gpu
CASES = conformance_cases()
BF16_CASES = [c for i, c in enumerate(CASES) if i % 3 == 0]   # a third: fewer kernels to build


def _capture(cases, dtype):
    inputs = suite_inputs(cases, example_dims(cases), dtype)
    return co.capture(SuiteModel(cases), inputs, dynamic_shapes=suite_dynamic_shapes(cases))


@pytest.fixture(scope="module")
def suites():
    from concurrent.futures import ThreadPoolExecutor
    options = co.CompileOptions(arch=co.resolve_arch(None))
    caps = {torch.float16: (CASES, _capture(CASES, torch.float16)),      # export: one at a time
            torch.bfloat16: (BF16_CASES, _capture(BF16_CASES, torch.bfloat16))}
    with ThreadPoolExecutor(2) as pool:     # the two nvcc builds run side by side
        futures = {dt: (cases, pool.submit(co.compile_captured, cap, options))
                   for dt, (cases, cap) in caps.items()}
        return {dt: (cases, f.result().to("cuda")) for dt, (cases, f) in futures.items()}


def test_every_case_offloaded(suites):
    for dtype, (cases, compiled) in suites.items():
        assert len(compiled.plan.regions) == len(cases), compiled.report.format()
        assert not compiled.plan.fallbacks


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("trial", range(3))
def test_matches_float32_reference(suites, dtype, trial):
    cases, compiled = suites[dtype]
    rng = random.Random(trial)
    dims = [{d: rng.randint(10, 50) for d in c["x"] + c["w"] if isinstance(d, str)} for c in cases]
    inputs = suite_inputs(cases, dims, dtype, "cuda")
    before = sum(m.fallback_calls for m in compiled.region_modules())
    poison_allocator()
    with torch.no_grad():
        outs = compiled(*inputs)
    torch.cuda.synchronize()
    assert sum(m.fallback_calls for m in compiled.region_modules()) == before, \
        "a region fell back to PyTorch instead of running its kernel"
    i = 0
    for k, c in enumerate(cases):
        n = 3 if c["epilogue"] != "none" else 2
        ref = case_forward(c, *(t.float() for t in inputs[i:i + n]))
        i += n
        out = outs[k]
        assert out.dtype == dtype and out.shape == ref.shape, case_id(k, c)
        assert not out.isnan().any(), f"{case_id(k, c)}: unwritten (NaN) output"
        err = rel_err(out, ref)
        assert err < TOLERANCE[dtype], f"{case_id(k, c)}: relative error {err:.2e}"


def test_cuda_graph_capture(suites):
    cases, compiled = suites[torch.float16]
    dims = example_dims(cases, 16)
    static_in = suite_inputs(cases, dims, torch.float16, "cuda")
    with torch.no_grad():
        compiled(*static_in)                      # warm up: binds the library
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            compiled(*static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = compiled(*static_in)
    fresh = suite_inputs(cases, dims, torch.float16, "cuda")
    for dst, src in zip(static_in, fresh):
        dst.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    i = 0
    for k, c in enumerate(cases):
        n = 3 if c["epilogue"] != "none" else 2
        ref = case_forward(c, *(t.float() for t in fresh[i:i + n]))
        i += n
        assert rel_err(static_out[k], ref) < TOLERANCE[torch.float16], case_id(k, c)


def test_misaligned_input_falls_back_correctly(suites):
    """A view at an odd offset cannot use an alignment-8 kernel: that call must
    run the PyTorch fallback and still be right."""
    cases, compiled = suites[torch.float16]
    inputs = list(suite_inputs(cases, example_dims(cases), torch.float16, "cuda"))
    k = next(i for i, c in enumerate(cases) if c["x"] == [256, 64])
    pos = sum(3 if c["epilogue"] != "none" else 2 for c in cases[:k])
    x = inputs[pos]
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device="cuda")
    inputs[pos] = buf[1:].view_as(x).copy_(x)       # 2-byte offset: not 16-byte aligned
    with torch.no_grad():
        out = compiled(*inputs)[k]
    ref = case_forward(cases[k], *(t.float() for t in inputs[pos:pos + 3]))
    assert rel_err(out, ref) < TOLERANCE[torch.float16]


def test_verify_mode_catches_a_wrong_kernel():
    """A region whose kernel computes the wrong function (a relu kernel planted on a
    region that has no relu) is caught on its first call and falls back for good."""
    import warnings

    from cutlass_offload import build as build_stage
    from cutlass_offload.ir import GemmEpilogue, replace
    from cutlass_offload.partition import partition
    from cutlass_offload.runtime.compiled_model import CompiledModel, offload
    from cutlass_offload.select import select

    model = torch.nn.Linear(64, 64).half()
    cap = co.capture(model, (torch.randn(32, 64).half(),))
    options = co.CompileOptions(arch=co.resolve_arch(None))
    plan = select(partition(cap.graph_module, options), options.arch)
    wrong = replace(plan.kernels[0], epilogue=GemmEpilogue(bias=True, activation="relu"))
    plan = replace(plan, kernels=(wrong,))
    res = build_stage.build(plan)
    gm = offload(cap.graph_module, res.plan, res.library)
    compiled = CompiledModel(gm, res.plan, None, res.library).to("cuda").verify()
    x = torch.randn(32, 64, dtype=torch.float16, device="cuda")
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x)
        out2 = compiled(x)
    ref = model.cuda().float()(x.float())
    assert any("disagrees with PyTorch" in str(w.message) for w in caught)
    (m,) = compiled.region_modules()
    assert m.disabled and m.fallback_calls == 1
    assert rel_err(out, ref) < TOLERANCE[torch.float16] and rel_err(out2, ref) < TOLERANCE[torch.float16]
