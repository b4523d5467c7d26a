"""GPU: ``compile(..., tune=True)`` on a model with two GEMM problems profiles
their candidates in a subprocess, runs the winners correctly, remembers them
(a second compile profiles nothing), and a saved folder reloads with them.

Uses a private cache folder, so the first compile really builds and profiles
(7 candidate kernels: about a minute on the 16-core H200 host)."""
import copy

import pytest
import torch
from helpers import TOLERANCE, poison_allocator, rel_err
from torch import nn

import cutlass_offload as co

pytestmark = pytest.mark.gpu


class TwoGemms(nn.Module):
    """256x512x256 with bias + relu, then 256x256x512 with bias + residual add."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(256, 512), nn.Linear(512, 256)

    def forward(self, x):
        return self.down(torch.relu(self.up(x))) + x


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path_factory.mktemp("tune_cache")))
    try:
        model = TwoGemms().half().cuda().eval()
        x = torch.randn(4, 64, 256, dtype=torch.float16, device="cuda")
        out = tmp_path_factory.mktemp("out") / "two_gemms"
        first = co.compile(model, (x,), arch="sm_90a", tune=True, out_dir=out)
        second = co.compile(model, (x,), arch="sm_90a", tune=True)
        yield model, first, second, out
    finally:
        mp.undo()


def test_first_compile_profiles_both_problems(tuned):
    _, first, _, _ = tuned
    t = first.report.tuning
    print(first.report.format())
    assert len(t["problems"]) == 2 and not any(p["cached"] for p in t["problems"])
    assert len(first.plan.regions) == 2 and not first.plan.fallbacks
    for p in t["problems"]:
        assert 2 <= len(p["candidates"]) <= 4
        assert p["winner"] is not None, p
        ok = [c for c in p["candidates"] if c["status"] == "ok"]
        assert min(ok, key=lambda c: c["us"])["tag"] == p["winner"]
        assert all(c["rel_err"] < TOLERANCE[torch.float16] for c in ok)
        assert p["torch_us"] > 0
    # the plan runs the winners
    winners = {p["winner"] for p in t["problems"]}
    assert {k.config.tag for k in first.plan.kernels} == winners


def test_tuned_model_matches_float32_reference(tuned):
    model, first, _, _ = tuned
    for _ in range(2):
        x = torch.randn(4, 64, 256, dtype=torch.float16, device="cuda")      # fresh data
        poison_allocator()
        with torch.no_grad():
            out = first(x)
            ref = copy.deepcopy(model).float()(x.float())
        torch.cuda.synchronize()
        assert not out.isnan().any()
        assert rel_err(out, ref) < TOLERANCE[torch.float16]
    assert sum(m.fallback_calls for m in first.region_modules()) == 0


def test_second_compile_profiles_nothing(tuned):
    _, first, second, _ = tuned
    t = second.report.tuning
    assert all(p["cached"] for p in t["problems"]) and not t["build"]
    assert [k.name for k in second.plan.kernels] == [k.name for k in first.plan.kernels]
    assert second.report.build["cache_hit"] is True


def test_saved_folder_reloads_with_the_tuned_kernels(tuned):
    _, first, _, out = tuned
    loaded, _, _ = co.load(out, device="cuda")
    assert [k.name for k in loaded.plan.kernels] == [k.name for k in first.plan.kernels]
