"""GPU: attention on (B * H, L, D) bmms with its scores viewed to (B, H, L, S) around
the softmax (BLOOM; partition/head_views.py) runs as one attention region reading q,
k and v in place: the form alone and transformers' BloomForCausalLM, fp16 / bf16,
fresh inputs, outputs poisoned, against float32. Eager glue: the regions' kernels are what is tested."""
import copy

import pytest
import torch

import cutlass_offload as co
from cutlass_offload.ir import AttentionRegion
from helpers import assert_regions_ran, check_fresh_outputs, compile_and_check_lm
from attention_models import BLOOM_SHAPE, bloom_attention, deberta_like_attention

pytestmark = pytest.mark.gpu
B, NH, L, D = BLOOM_SHAPE


def _inputs(seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(B, L, NH, 3, D, generator=g, device="cuda").to(dtype),
            torch.randn(B * NH, 1, L, generator=g, device="cuda").to(dtype))


class Single(torch.nn.Module):
    def forward(self, qkv, alibi, mask=None):
        return (bloom_attention(qkv, alibi, mask),)


def _with_mask(seed, dtype):
    """A padding-style additive mask (B, 1, L, L) passed in: summed with ALiBi in the glue
    (partition/bias_sum.py), the region's one bias."""
    g = torch.Generator(device="cuda").manual_seed(seed + 100)
    keep = torch.rand(B, 1, L, L, generator=g, device="cuda") > 0.2
    keep[..., 0] = True                               # every row sees a key
    return _inputs(seed, dtype) + (torch.zeros(B, 1, L, L, device="cuda").masked_fill(
        ~keep, torch.finfo(dtype).min).to(dtype),)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bloom_attention_matches_float32(dtype, masked):
    inputs = _with_mask if masked else _inputs
    m = co.compile(Single(), inputs(0, dtype), arch="sm_90a", glue="eager")
    assert [type(r) for r in m.plan.regions] == [AttentionRegion], m.report.format()
    check_fresh_outputs(m, Single(), lambda r: inputs(r + 1, dtype), dtype, ["attention"])
    assert_regions_ran(m)


class DebertaLike(torch.nn.Module):
    def forward(self, x):
        return (deberta_like_attention(x),)


def test_dynamic_batch_split_matches_float32_at_two_batches():
    """scores.view(-1, H, L, S) under a dynamic batch (DeBERTa-v2): one region whose
    batch is the rows // H, run at the compiled batch and at another."""
    def x(batch, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return (torch.randn(batch * 4, 64, 32, generator=g, device="cuda").half(),)
    m = co.compile(DebertaLike(), x(2, 0), arch="sm_90a", dynamic_batch=True, glue="eager")
    assert [type(r) for r in m.plan.regions] == [AttentionRegion], m.report.format()
    for batch, seed in ((2, 1), (5, 2)):
        check_fresh_outputs(m, DebertaLike(), lambda r: x(batch, seed + r), torch.float16, ["attention"])
    assert_regions_ran(m)


def test_transformers_bloom_matches_float32():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BloomConfig(vocab_size=512, hidden_size=256, n_layer=2, n_head=4, use_cache=False)

    def two_causal_attentions(m):
        att = [r for r in m.plan.regions if isinstance(r, AttentionRegion)]
        assert len(att) == 2 and all(r.problem.causal for r in att), m.report.format()
    compile_and_check_lm(transformers.BloomForCausalLM(cfg), 512, two_causal_attentions)


class BloomWithMask(torch.nn.Module):
    """BloomForCausalLM called with its attention mask (its second parameter is
    past_key_values: the wrapper passes the mask by keyword)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, mask):
        return self.lm(input_ids=ids, attention_mask=mask).logits


def test_transformers_bloom_with_a_padding_mask_matches_float32():
    """Left padding in one row: ALiBi and the padding-causal mask summed in the glue, one
    biased region per layer (sm80 kernel); logits of the unpadded positions against
    float32, fresh ids, allocator poisoned."""
    transformers = pytest.importorskip("transformers")
    from helpers import TOLERANCE, poison_allocator, rel_err
    torch.manual_seed(0)
    cfg = transformers.BloomConfig(vocab_size=512, hidden_size=256, n_layer=2, n_head=4, use_cache=False)
    ref = BloomWithMask(transformers.BloomForCausalLM(cfg)).cuda().float().eval()
    model = copy.deepcopy(ref).half()
    mask = torch.ones(2, 128, dtype=torch.long, device="cuda")
    mask[0, :16] = 0

    def ids(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return torch.randint(0, 512, (2, 128), device="cuda", generator=g)
    m = co.compile(model, (ids(0), mask), arch="sm_90a", glue="eager")
    att = [r for r in m.plan.regions if isinstance(r, AttentionRegion)]
    assert len(att) == 2 and all(r.bias_kind == "float" for r in att), m.report.format()
    for seed in (1, 2):
        x = ids(seed)
        poison_allocator()
        with torch.no_grad():
            out, want = m(x, mask), ref(x, mask)
        torch.cuda.synchronize()
        out, want = out[mask.bool()], want[mask.bool()]
        assert not out.isnan().any()
        assert rel_err(out, want) < TOLERANCE[torch.float16]
    assert_regions_ran(m)
