"""Sibling linears combined into one GEMM (partition/parallel_gemm.py; no nvcc, no
GPU): which ones combine, and the rewritten graph computes what the model does."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.ir import GemmRegion
from cutlass_offload.partition import partition

OPTIONS = CompileOptions(arch="sm90a", allow_tf32=True)      # float32 models: the graph is checked on the CPU


class QKV(nn.Module):
    """Attention's projections on one input: q with a bias, k without, v narrower."""

    def __init__(self, dim=64, v_dim=32, q_act=None, v_in=None):
        super().__init__()
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(v_in or dim, v_dim)
        self.q_act, self.v_in = q_act, v_in

    def forward(self, x, y=None):
        q = self.q(x)
        if self.q_act is not None:
            q = self.q_act(q)
        v = self.v(y if self.v_in else x)
        b, s = x.shape[:2]
        q = q.view(b, s, 4, -1).transpose(1, 2)
        k = self.k(x).view(b, s, 4, -1).transpose(1, 2)
        v = v.view(b, s, 4, -1).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v)


def _partition(model, *inputs, options=OPTIONS, dynamic_batch=False):
    cap = capture(model, inputs, dynamic_batch=dynamic_batch)
    return cap.graph_module, partition(cap.graph_module, options)


def _gemms(part):
    return [r for r in part.regions if isinstance(r, GemmRegion)]


def test_q_k_v_become_one_gemm_and_the_graph_computes_the_same():
    torch.manual_seed(0)
    model = QKV().eval()
    x = torch.randn(2, 8, 64)
    gm, part = _partition(model, x)
    (gemm,) = _gemms(part)
    assert gemm.problem.n == 64 + 64 + 32 and gemm.problem.epilogue.tag == "bias"
    assert any("combines the sibling linears" in n for n in gemm.notes)
    assert not any("stops at" in n for n in gemm.notes)       # its slices are the point
    # in graph order: forward computes v before k
    w = gm.get_buffer("_co_combined_0_weight")
    assert torch.equal(w, torch.cat([model.q.weight, model.v.weight, model.k.weight]))
    b = gm.get_buffer("_co_combined_0_bias")
    assert torch.equal(b, torch.cat([model.q.bias, model.v.bias, torch.zeros(64)]))   # k: none
    fresh = torch.randn(2, 8, 64)
    torch.testing.assert_close(gm(fresh), model(fresh), rtol=1e-5, atol=1e-5)


def test_combined_slices_keep_a_dynamic_batch():
    torch.manual_seed(0)
    model = QKV().eval()
    gm, part = _partition(model, torch.randn(2, 8, 64), dynamic_batch=True)
    assert len(_gemms(part)) == 1
    x3 = torch.randn(3, 8, 64)
    torch.testing.assert_close(gm(x3), model(x3), rtol=1e-5, atol=1e-5)


def test_off_by_option():
    _, part = _partition(QKV().eval(), torch.randn(2, 8, 64),
                         options=CompileOptions(arch="sm90a", allow_tf32=True, combine_gemms=False))
    assert len(_gemms(part)) == 3


def test_a_member_with_a_fused_activation_stays_apart():
    # q's GELU fuses into its own GEMM; a slice would leave it to the glue
    _, part = _partition(QKV(q_act=nn.GELU()).eval(), torch.randn(2, 8, 64))
    gemms = sorted(_gemms(part), key=lambda r: r.problem.n)
    assert [r.problem.n for r in gemms] == [64, 96]          # q alone, k + v combined
    assert gemms[0].problem.epilogue.tag == "bias_gelu"


def test_linears_on_other_inputs_stay_apart():
    _, part = _partition(QKV(v_in=48).eval(), torch.randn(2, 8, 64), torch.randn(2, 8, 48))
    assert sorted(r.problem.n for r in _gemms(part)) == [32, 128]     # q + k; v reads y


@pytest.mark.parametrize("v_dim", [12, 36])
def test_an_n_off_the_16_byte_step_stays_apart(v_dim):
    # a slice starting at a column not a multiple of 8 would be misaligned for TMA
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, v_dim), nn.Linear(64, 64)

        def forward(self, x):
            return self.a(x).sum(-1) + self.b(x).sum(-1)
    _, part = _partition(Two().eval(), torch.randn(16, 64))
    assert len(_gemms(part)) == 2


def test_weights_computed_in_forward_stay_apart():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

        def forward(self, x):
            return F.linear(x, self.a.weight * 2) + 0 * F.linear(x, self.b.weight)
    _, part = _partition(Scaled().eval(), torch.randn(16, 64))
    assert all("combines" not in " ".join(r.notes) for r in _gemms(part))


def test_members_that_fill_the_gpu_alone_stay_apart():
    # 132 tiles of 128x128 per projection: a wave of the 132-SM target each
    x = torch.randn(1, 128 * 132, 64)
    _, part = _partition(QKV().eval(), x, options=CompileOptions(arch="sm90a", allow_tf32=True,
                                                                  num_sms=132))
    assert len(_gemms(part)) == 3
    _, part = _partition(QKV().eval(), x, options=CompileOptions(arch="sm90a", allow_tf32=True,
                                                                  num_sms=133))
    assert len(_gemms(part)) == 1
    # the target's own SM count, spelled either way: sm_80 has 108
    x108 = torch.randn(1, 128 * 108, 64)
    for arch in ("sm80", "sm_80"):
        _, part = _partition(QKV().eval(), x108, options=CompileOptions(arch=arch, allow_tf32=True))
        assert len(_gemms(part)) == 3, arch


def test_compile_options_refuse_an_unknown_arch():
    # partition reads the target's SM count from the arch: a typo must not pass silently
    with pytest.raises(ValueError, match="arch must be one of"):
        CompileOptions(arch="sm_75")
    assert CompileOptions(arch="sm_90a").arch == "sm_90a"      # aliases as given
