"""emit/attention_sm90.py (no nvcc, no GPU): which attention problems the Hopper kernel
takes on sm90a and which fall to the sm80 kernel, names, and the generated code."""
import pytest

from cutlass_offload.build import shards
from cutlass_offload.emit import attention as at
from cutlass_offload.emit import attention_sm90 as h
from cutlass_offload.families import attention_sm90 as fam
from cutlass_offload.emit import emit_kernel, emit_unit
from cutlass_offload.ir import AttentionKernelSm90, AttentionRegion, KernelConfig


def problem(head_dim=64, seq_q=128, seq_kv=128, dtype="f16", **kw):
    kw.setdefault("scale", head_dim ** -0.5)
    return at.AttentionProblem(heads=kw.pop("heads", 8), seq_q=seq_q, seq_kv=seq_kv,
                               head_dim=head_dim, head_dim_v=kw.pop("head_dim_v", head_dim),
                               dtype=dtype, **kw)


# --- which problems get the Hopper kernel ---------------------------------------

@pytest.fixture
def no_table(monkeypatch, tmp_path):
    """The choice without the learned table: the example's instantiations."""
    from cutlass_offload.families import attention_sm90_table as t
    monkeypatch.setattr(t, "TABLE_FILE", tmp_path / "none.json")
    t._rows.cache_clear()
    yield
    t._rows.cache_clear()


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("head_dim,tile", [
    (8, (128, 64, 32)), (32, (128, 64, 32)), (40, (128, 64, 64)), (64, (128, 64, 64)),
    (80, (128, 128, 128)), (128, (128, 128, 128)), (160, (128, 64, 256)), (256, (128, 64, 256))])
def test_sm90a_takes_supported_problems_with_the_smallest_head_tile(dtype, head_dim, tile, no_table):
    k = at.choose(problem(head_dim, dtype=dtype), "sm90a")
    assert isinstance(k, AttentionKernelSm90)
    assert k.config.family == "cutlass3x_sm90" and tuple(k.config.tile) == tile
    assert k.config.stages == 5 and k.config.kernel_schedule == "KernelTmaWarpSpecializedCooperative"
    assert k.arch == "sm90a" and k.dtype == dtype and not k.causal
    assert k.kind == "attention" and k.args_type == "CoAttentionArgs" and k.access == 8
    assert k.needs_workspace and not k.supports_bias


@pytest.mark.parametrize("seq_q,seq_kv,heads,head_dim", [
    (4096, 4096, 8, 40), (4096, 77, 8, 40), (1024, 1024, 8, 80), (1024, 77, 8, 80),
    (256, 256, 8, 160), (256, 77, 8, 160), (64, 64, 8, 160), (64, 77, 8, 160)])
def test_sd_unet_attentions_run_on_the_hopper_kernel(seq_q, seq_kv, heads, head_dim):
    p = problem(head_dim, seq_q, seq_kv, heads=heads, batch=2)
    k = at.choose(p, "sm90a")
    assert k.config.family == "cutlass3x_sm90" and k.head_tile >= head_dim
    assert k.config == (fam.learned_choice(p) or fam.config_for(h.head_tile(head_dim)))


def test_packaged_table_rows_are_legal_configs():
    """Every row of families/attention_sm90_table.json names a config of CONFIGS that
    holds its head dim, and records where it was measured."""
    import json

    from cutlass_offload.families import attention_sm90_table as t
    data = json.loads(t.TABLE_FILE.read_text())
    assert data["gpu"] and data["date"] and data["cutlass"] and data["rows"]
    for key, row in data["rows"].items():
        head_dim = int(key.split("_")[0][1:])
        cfg = fam.config_for(row["head"], row["block_kv"], row["schedule"])
        assert cfg in fam.CONFIGS and cfg.tile[2] >= head_dim
        assert row["us"] < row["default_us"]


@pytest.mark.parametrize("causal,seq_q,seq_kv", [
    ("top_left", 128, 128), ("top_left", 40, 72), ("bottom_right", 128, 128)])
def test_causal_masks_that_match_the_top_left_fusion(causal, seq_q, seq_kv):
    k = at.choose(problem(64, seq_q, seq_kv, causal=causal), "sm90a")
    assert k.config.family == "cutlass3x_sm90" and k.causal and k.name.endswith("_causal")


@pytest.mark.parametrize("kw,why", [
    ({"bias": "add"}, "bias"),
    ({"dtype": "f32"}, "dtype f32"),
    ({"head_dim_v": 128}, "one head dim"),
    ({"head_dim": 36, "scale": 0.1}, "multiples of 8"),
    ({"head_dim": 264, "scale": 0.1}, "multiples of 8 up to 256"),
    ({"align": 4}, "16-byte"),
    ({"seq_q": None}, "dynamic"),
    ({"seq_kv": None}, "dynamic"),
    ({"causal": "top_left", "seq_q": 136, "seq_kv": 128}, "past seq_kv"),
    ({"causal": "bottom_right", "seq_q": 64, "seq_kv": 128}, "top-left"),
])
def test_unsupported_problems_fall_to_the_sm80_kernel(kw, why):
    p = problem(**kw)
    assert why in h.refusal(p, "sm90a")
    assert not h.supports(p) and at.supports(p, "sm90a")
    k = at.choose(p, "sm90a")
    assert k.config.family == "cutlass2x_sm80" and k.arch == "sm90a"


@pytest.mark.parametrize("seq_q", [1, 13, 20, 77, 1500])
def test_any_query_length_runs_on_the_hopper_kernel(seq_q):
    """Whisper's 1500 frames: TMA zero-fills Q past seq_q, the O store clips and the
    log-sum-exp store is predicated, so no multiple of 8 is needed."""
    p = problem(64, seq_q, 1500)
    assert h.refusal(p, "sm90a") is None
    assert at.choose(p, "sm90a").config.family == "cutlass3x_sm90"


def test_configs_fit_shared_memory_and_hold_the_examples():
    example = {(128, 64, 32), (128, 64, 64), (128, 128, 128), (128, 64, 256)}
    tiles = {(c.tile, c.kernel_schedule) for c in fam.CONFIGS}
    assert {(t, fam.COOPERATIVE) for t in example} <= tiles
    assert ((128, 128, 64), fam.PINGPONG) in tiles and ((128, 64, 48), fam.COOPERATIVE) in tiles
    for c in fam.CONFIGS:
        q, kv, d = c.tile
        assert q in fam.BLOCK_QS and kv in (64, 128) and d in fam.HEAD_TILES and d % 16 == 0
        assert q == fam.BLOCK_Q or d <= fam.SMALL_HEAD          # 192 queries: small heads only
        assert fam.smem_bytes(kv, d, c.stages, c.kernel_schedule, q) <= fam.SMEM_LIMIT
        assert c.stages in (4, 5)
    # 256 x 128 x 5 stages would need 384 KiB: not a config
    assert not any(c.tile == (128, 128, 256) for c in fam.CONFIGS)
    assert len({AttentionKernelSm90(arch="sm90a", dtype="f16", config=c).name for c in fam.CONFIGS}) \
        == len(fam.CONFIGS)


def test_a_given_config_is_used_and_checked():
    cfg = fam.config_for(64, 128, fam.PINGPONG)
    k = at.choose(problem(64), "sm90a", cfg)
    assert k.config == cfg and k.name == "cutlass3x_sm90_fmha_fwd_f16_128x128x64_s5_pingpong"
    with pytest.raises(ValueError, match="cannot run head dim"):
        fam.choose(problem(80), "sm90a", cfg)
    with pytest.raises(ValueError, match="no Hopper attention config"):
        fam.config_for(48, 256)
    # the sm80 kernel ignores a Hopper config
    assert at.choose(problem(64, bias="add"), "sm90a", cfg).config.family == "cutlass2x_sm80"


@pytest.mark.parametrize("head_dim,heads", [(40, {48, 64}), (64, {64}), (80, {80, 128}),
                                            (160, {160, 256}), (256, {256})])
def test_search_space_starts_with_the_default(head_dim, heads):
    space = fam.search_space(problem(head_dim))
    assert space[0] == fam.config_for(fam.head_tile(head_dim))
    assert {c.tile[2] for c in space} == heads
    assert len(set(space)) == len(space)


def test_learned_table_rows_choose_the_config(monkeypatch, tmp_path):
    from cutlass_offload.families import attention_sm90_table as t
    f = tmp_path / "table.json"
    f.write_text('{"rows": {"%s": {"head": 48, "block_kv": 128, "schedule": "%s"}}}'
                 % (t.class_key(40, False, 4096, 77), fam.COOPERATIVE))
    monkeypatch.setattr(t, "TABLE_FILE", f)
    t._rows.cache_clear()
    try:
        assert at.choose(problem(40, 3000, 100), "sm90a").config.tile == (128, 128, 48)
        assert at.choose(problem(40, 3000, 300), "sm90a").config == fam.config_for(64)   # another class
        # a class is head dim, mask and length buckets: the dtype is not part of it
        assert at.choose(problem(40, 2049, 65, dtype="bf16"), "sm90a").config.tile == (128, 128, 48)
        f.write_text("{not json")
        t._rows.cache_clear()
        with pytest.warns(UserWarning, match="unreadable"):
            assert at.choose(problem(40, 3000, 100), "sm90a").config == fam.config_for(64)
    finally:
        t._rows.cache_clear()


def test_length_buckets():
    from cutlass_offload.families.attention_sm90_table import bucket
    assert [bucket(n) for n in (1, 2, 3, 77, 128, 1500, 4096)] == [1, 2, 4, 128, 128, 2048, 4096]


def test_sm80_target_never_gets_the_hopper_kernel():
    assert at.choose(problem(64), "sm80").config.family == "cutlass2x_sm80"
    assert "targets sm90a" in h.refusal(problem(64), "sm80")
    with pytest.raises(ValueError, match="targets"):
        h.choose(problem(64), "sm80")


def test_bottom_right_with_more_queries_runs_as_equal_lengths():
    """The region runs bottom-right causal on the last seq_kv queries only
    (AttentionRegion.kernel_problem): equal lengths, where CausalFusion matches."""
    r = AttentionRegion(name="r", form="sdpa", nodes=("a",), q="q", k="k", v="v",
                        problem=problem(64, 200, 128, causal="bottom_right"))
    assert r.kernel_problem.seq_q == 128
    assert at.choose(r.kernel_problem, "sm90a").causal


def test_negative_and_zero_scales_are_refused():
    # a negative scale reaches the kernel as -scale on -q (the region's ``negate``)
    for s in (-0.1, 0.0, float("inf"), float("nan")):
        assert "scale" in h.refusal(problem(scale=s), "sm90a")


def test_names_distinct_and_checked():
    ks = {at.choose(problem(d, dtype=dt, causal=c), "sm90a").name
          for d in (32, 64, 128, 256) for dt in ("f16", "bf16") for c in ("none", "top_left")}
    assert len(ks) == 16
    assert at.choose(problem(40), "sm90a").name == "cutlass3x_sm90_fmha_fwd_f16_128x64x64_s5_coop"
    bad = KernelConfig(family="cutlass3x_sm90", tile=(128, 256, 64), stages=5,
                       kernel_schedule="KernelTmaWarpSpecializedCooperative")
    with pytest.raises(ValueError, match="Hopper attention configs"):
        h.check(AttentionKernelSm90(arch="sm90a", dtype="f16", config=bad))
    with pytest.raises(ValueError, match="arch"):
        AttentionKernelSm90(arch="sm80", dtype="f16", config=h.config_for(64))
    with pytest.raises(ValueError, match="dtype"):
        AttentionKernelSm90(arch="sm90a", dtype="f32", config=h.config_for(64))


def test_workspace_is_the_log_sum_exp_rows():
    k = at.choose(problem(40), "sm90a")
    assert at.workspace_bytes(k, 2, 8, 4096, 40) == 2 * 8 * 4096 * 4


# --- generated code ---------------------------------------------------------------

@pytest.mark.parametrize("dtype,element", [("f16", "cutlass::half_t"), ("bf16", "cutlass::bfloat16_t")])
@pytest.mark.parametrize("causal,fusion", [("none", "ResidualFusion"), ("top_left", "CausalFusion")])
def test_emitted_template_arguments(dtype, element, causal, fusion):
    k = at.choose(problem(80, dtype=dtype, causal=causal), "sm90a")
    src = emit_kernel(k)
    code = src.code
    assert src.name == k.name and src.args_type == "CoAttentionArgs"
    assert f"namespace {k.name} {{" in code
    assert f"using Element = {element};" in code
    assert "cute::Shape<cute::_128, cute::_128, cute::_128>" in code
    assert f"cutlass::fmha::collective::{fusion}, cutlass::gemm::KernelTmaWarpSpecializedCooperative" in code
    assert "Tag::kStagesKV, cute::Int<5>" in code
    assert f"constexpr bool kCausal = {'true' if causal != 'none' else 'false'};" in code
    assert "88_hopper_fmha/kernel/fmha_kernel_builder.hpp" in src.includes
    assert "88_hopper_fmha/collective/fmha_fusion.hpp" in src.includes


def test_scale_is_the_regions_not_the_hard_coded_one():
    code = emit_kernel(at.choose(problem(40), "sm90a")).code
    assert "p.mainloop.scale_softmax = a.scale;" in code
    assert "p.mainloop.scale_softmax_log2 = float(double(a.scale) * 1.4426950408889634);" in code


def test_run_checks_and_never_allocates():
    code = emit_kernel(at.choose(problem(64, causal="top_left"), "sm90a")).code
    for needle in ("CO_WORKSPACE_TOO_SMALL", "CO_CANNOT_IMPLEMENT", "prepare_smem()",
                   "CO_LAUNCH_FAILED", "if (a.head_dim % kAlign) return false;",
                   "a.head_dim != a.head_dim_v", "if (a.bias != nullptr) return false;",
                   "(a.causal == 1 && a.seq_q <= a.seq_kv) || (a.causal == 2 && a.seq_q == a.seq_kv)",
                   "static_cast<float*>(a.workspace)",
                   "co_opt_in_smem(cutlass::device_kernel<Kernel>, kSmemBytes, done, 9)"):
        assert needle in code, needle
    assert "cudaMalloc" not in code and "new " not in code


def test_unit_with_sm80_and_sm90_kernels(no_table):
    kernels = {k.name: k for k in (
        at.choose(problem(40), "sm90a"), at.choose(problem(64), "sm90a"),
        at.choose(problem(160, causal="top_left", seq_q=64, seq_kv=64), "sm90a"),
        at.choose(problem(64, bias="add"), "sm90a"))}
    assert len(kernels) == 3              # head dims 40 and 64 share one Hopper kernel
    hopper = [k for k in kernels.values() if k.config.family == "cutlass3x_sm90"]
    tu = emit_unit([emit_kernel(k) for k in hopper], "attention")
    assert tu.kernels == tuple(k.name for k in hopper)
    assert tu.text.count("#include <88_hopper_fmha/kernel/fmha_kernel_builder.hpp>") == 1
    assert tu.flags == ("-ftz=true",)     # the Hopper FMHA's exp2f as one MUFU.EX2
    # the sm80 kernel compiles without it, so never in the Hopper kernels' unit
    assert {shards.unit_class(k) for k in hopper} == {"attention3x"}
    (sm80,) = [k for k in kernels.values() if k not in hopper]
    assert shards.unit_class(sm80) == "common"
    assert len(shards.header_compatible_groups(list(kernels.values()))) == 2
    with pytest.raises(ValueError, match="different nvcc flags.*-ftz=true.*\\(none\\)"):
        emit_unit([emit_kernel(k) for k in kernels.values()], "attention")
    sm80_tu = emit_unit([emit_kernel(sm80)], "attention")
    assert sm80_tu.flags == ()
    assert sm80_tu.text.count("#include <41_fused_multi_head_attention/kernel_forward.h>") == 1


def test_ftz_off_compiles_the_hopper_kernel_as_before(monkeypatch):
    """emit/attention_sm90.FTZ False (A/B runs): no flags, so the unit's cache key and
    compile command are those of a kernel without them."""
    from cutlass_offload.build import toolchain
    from cutlass_offload.emit import attention_sm90 as emitter
    k = at.choose(problem(40), "sm90a")
    on = emit_unit([emit_kernel(k)], "attention")
    monkeypatch.setattr(emitter, "FTZ", False)
    off = emit_unit([emit_kernel(k)], "attention")
    assert (on.flags, off.flags) == (("-ftz=true",), ())
    assert on.text == off.text
    cmd_on = toolchain.compile_command("nvcc", "sm90a", "u.cu", "u.o", flags=on.flags)
    cmd_off = toolchain.compile_command("nvcc", "sm90a", "u.cu", "u.o", flags=off.flags)
    assert "-ftz=true" in cmd_on and "-ftz=true" not in cmd_off
    assert toolchain.flags_signature(cmd_on) != toolchain.flags_signature(cmd_off)


def test_shard_planner_prices_the_hopper_kernel_apart_from_the_gemms():
    """Its row (attention_sm90): a second FMHA kernel in a unit costs well over a second
    GEMM mainloop (measured; shards.COST), and the GEMMs' row does not price it."""
    k = at.choose(problem(64), "sm90a")
    fixed, per_kernel, _ = shards.COST["attention_sm90"]
    gemm_fixed, gemm_mainloop, _ = shards.COST["cutlass3x_sm90"]
    assert shards.estimate([k]) == fixed + per_kernel != gemm_fixed + gemm_mainloop
    other = at.choose(problem(160, causal="top_left", seq_q=64, seq_kv=64), "sm90a")
    assert shards.estimate([k, other]) == fixed + 2 * per_kernel
    assert per_kernel > 1.5 * gemm_mainloop
    assert shards.peak_memory([k]) == shards.PEAK_MEMORY["cutlass3x_sm90"]
    assert shards.estimate([at.choose(problem(64, bias="add"), "sm90a")]) == sum(shards.COST["attention"][:2])


# --- the heaviest-first (lpt) tile order of causal problems ----------------------------

def test_lpt_order_is_for_causal_problems_only():
    lpt = fam.config_for(64, 128, fam.PINGPONG, order="lpt")
    assert lpt in fam.CONFIGS and lpt.tag.endswith("_lpt")
    assert {c.tile_scheduler for c in fam.CONFIGS} == set(fam.TILE_ORDERS)
    k = fam.choose(problem(64, causal="top_left"), "sm90a", lpt)
    assert k.name == "cutlass3x_sm90_fmha_fwd_f16_128x128x64_s5_pingpong_lpt_causal"
    with pytest.raises(ValueError, match="lpt tile order is for causal"):
        fam.choose(problem(64), "sm90a", lpt)
    with pytest.raises(ValueError, match="lpt tile order is for causal"):
        h.check(AttentionKernelSm90(arch="sm90a", dtype="f16", config=lpt, causal=False))
    with pytest.raises(ValueError, match="tile schedulers"):
        AttentionKernelSm90(arch="sm90a", dtype="f16", causal=True, config=KernelConfig(
            family="cutlass3x_sm90", tile=(128, 64, 64), stages=5,
            kernel_schedule=fam.COOPERATIVE, tile_scheduler="stream_k"))
    # searches time both orders of a causal problem, only the example's without a mask
    causal_space = fam.search_space(problem(64, causal="top_left"))
    assert {c.tile_scheduler for c in causal_space} == set(fam.TILE_ORDERS)
    assert {c.tile_scheduler for c in fam.search_space(problem(64))} == {"persistent"}
    assert len(causal_space) == 2 * len(fam.search_space(problem(64)))


@pytest.mark.usefixtures("cutlass_tma_epilogue")
@pytest.mark.parametrize("schedule,scheduler,persistent", [
    (fam.PINGPONG, "LptPersistentTileScheduler", True),
    (fam.COOPERATIVE, "LptIndividualTileScheduler", False)])
def test_lpt_kernels_run_the_builders_collectives_under_our_scheduler(schedule, scheduler, persistent):
    k = fam.choose(problem(64, causal="top_left"), "sm90a", fam.config_for(64, 128, schedule, order="lpt"))
    src = emit_kernel(k)
    assert h.LPT_SCHEDULER in src.preamble and "struct LptPersistentTileScheduler" in h.LPT_SCHEDULER
    assert f"co_fmha::{scheduler}," in src.code
    assert "cutlass::fmha::kernel::FmhaKernelTmaWarpSpecialized<" in src.code
    assert "typename Builder::CollectiveMainloop, typename Builder::CollectiveEpilogue" in src.code
    # the builder's ping-pong mapping, spelled out (fmha_kernel_builder.hpp)
    assert ("Tag::kIsPersistent, cute::true_type" in src.code) is persistent
    assert ("Tag::kLoadsQSeparately, cute::true_type" in src.code) is persistent
    assert f"constexpr bool kGridBhByTiles = {'false' if persistent else 'true'};" in src.code
    # the example's order keeps the builder's kernel and no extra preamble
    plain = emit_kernel(fam.choose(problem(64, causal="top_left"), "sm90a", fam.config_for(64, 128, schedule)))
    assert h.LPT_SCHEDULER not in plain.preamble and "co_fmha::" not in plain.code
    assert "cutlass::fmha::kernel::FmhaBuilder<" in plain.code and ">::Kernel;" in plain.code
    # both orders share a translation unit (the scheduler header is guarded, emitted once)
    unit = emit_unit([src, plain], "test")
    assert unit.text.count("#ifndef CO_FMHA_LPT_SCHEDULER_H") == 1


@pytest.mark.parametrize("seq,order", [(128, "persistent"), (77, "persistent"), (129, "lpt"), (2048, "lpt")])
def test_causal_problems_of_several_query_tiles_default_to_heaviest_first(seq, order, no_table):
    k = at.choose(problem(64, seq_q=seq, seq_kv=seq, causal="top_left"), "sm90a")
    assert k.config.tile_scheduler == order == (fam.CAUSAL_DEFAULT_ORDER if seq > fam.BLOCK_Q else "persistent")
    assert at.choose(problem(64, seq_q=seq, seq_kv=seq), "sm90a").config.tile_scheduler == "persistent"


def test_three_consumer_warpgroups_for_small_head_tiles():
    """BlockQ 192 (FlashAttention-3's tile for small head dims): the example's
    kNumMmaWarpGroups option set to 3; offered to searches of small head dims only,
    never the default."""
    c = fam.config_for(64, 128, fam.PINGPONG, block_q=192)
    k = fam.choose(problem(40, seq_q=4096, seq_kv=4096), "sm90a", c)
    assert k.name == "cutlass3x_sm90_fmha_fwd_f16_192x128x64_s5_pingpong"
    code = emit_kernel(k).code
    assert "Tag::kNumMmaWarpGroups, cute::Int<3>" in code and "constexpr int64_t kBlockQ = 192;" in code
    assert "kNumMmaWarpGroups" not in emit_kernel(fam.choose(problem(40), "sm90a")).code
    lpt = emit_kernel(fam.choose(problem(64, seq_q=512, seq_kv=512, causal="top_left"), "sm90a",
                                 fam.config_for(64, 128, fam.PINGPONG, "lpt", block_q=192))).code
    assert "Tag::kNumMmaWarpGroups, cute::Int<3>" in lpt and "co_fmha::LptPersistentTileScheduler" in lpt
    with pytest.raises(ValueError, match="no Hopper attention config"):
        fam.config_for(128, 128, block_q=192)                       # head tiles up to 64 only
    assert {c.tile[0] for c in fam.search_space(problem(40))} == set(fam.BLOCK_QS)
    assert {c.tile[0] for c in fam.search_space(problem(128))} == {fam.BLOCK_Q}
    assert fam.choose(problem(40, seq_q=4096, seq_kv=4096), "sm90a").config.tile[0] in fam.BLOCK_QS
    assert fam.default_config(problem(40)).tile[0] == fam.BLOCK_Q


def test_a_region_on_the_sm80_kernel_says_why_on_a_hopper_target():
    """A padding mask (an additive bias) keeps BERT-style attention on the sm80 kernel
    on sm_90a; the report says so (fresh-user trial, session 54). An unmasked one runs
    the Hopper kernel and has no such note."""
    import torch
    import torch.nn.functional as F

    import cutlass_offload as co

    class M(torch.nn.Module):
        def forward(self, q, m):
            return F.scaled_dot_product_attention(q, q, q, attn_mask=m), F.scaled_dot_product_attention(q, q, q)
    q = torch.randn(2, 4, 64, 64).half()
    rep = co.explain(M(), (q, torch.randn(2, 1, 64, 64).half()), arch="sm_90a").report
    notes = {r["epilogue"]: [n for n in r["notes"] if "sm80 attention kernel" in n] for r in rep.regions}
    assert notes == {"bias": ["runs the sm80 attention kernel on sm_90a: an additive bias / boolean mask: "
                              "the Hopper attention kernel has no bias"], "plain": []}
