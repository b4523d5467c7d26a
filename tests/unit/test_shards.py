"""Shard planning (no nvcc): balance, grouping, job slots."""
from cutlass_offload.build.shards import estimate, plan_shards
from cutlass_offload.ir import GemmEpilogue, GemmKernel, KernelConfig

SM90 = KernelConfig("cutlass3x_sm90", (128, 128, 64), 0, kernel_schedule="KernelTmaWarpSpecializedCooperative")
SM80 = KernelConfig("cutlass2x_sm80", (128, 128, 32), 3, warp=(64, 64, 32), instruction=(16, 8, 16))
ACTS = ("identity", "relu", "gelu_erf", "gelu_tanh", "silu", "sigmoid")


def kernels(n, config=SM90, dtype="f16"):
    return [GemmKernel("sm90a", dtype, "col", 8, 8, 8,
                       GemmEpilogue(bias=bool(i % 2), activation=ACTS[i % 6],
                                    residual=("none", "add", "mul")[i // 6 % 3]), config)
            for i in range(n)]


def test_one_kernel_per_shard_when_slots_allow():
    shards = plan_shards(kernels(8), slots=16)
    assert sorted(len(s) for s in shards) == [1] * 8


def test_balanced_when_slots_are_few():
    shards = plan_shards(kernels(12), slots=4)
    assert sorted(len(s) for s in shards) == [3, 3, 3, 3]
    assert sorted(k.name for s in shards for k in s) == sorted(k.name for k in kernels(12))


def test_families_and_dtypes_never_mix_and_longest_first():
    ks = kernels(6) + kernels(6, SM80) + kernels(2, dtype="bf16")
    shards = plan_shards(ks, slots=5)
    assert len(shards) <= 5
    for s in shards:
        assert len({(k.config.family, k.dtype) for k in s}) == 1
    assert [estimate(s) for s in shards] == sorted((estimate(s) for s in shards), reverse=True)


def test_one_slot_one_shard_per_group():
    shards = plan_shards(kernels(5) + kernels(3, SM80), slots=1)
    assert sorted(len(s) for s in shards) == [3, 5]


def test_split_only_when_it_shortens_the_longest():
    # 2.x kernels are cheap: a 2-kernel 2.x group is not split while a 3.x shard is longer
    shards = plan_shards(kernels(4) + kernels(2, SM80), slots=3)
    assert sorted((s[0].config.family, len(s)) for s in shards) == [
        ("cutlass2x_sm80", 2), ("cutlass3x_sm90", 2), ("cutlass3x_sm90", 2)]


def test_kernels_sharing_a_mainloop_stay_together():
    """bert-base's case: two epilogues on one 64x128 ping-pong mainloop and one
    128x128 cooperative kernel, two slots: the mainloops are not mixed."""
    pingpong = KernelConfig("cutlass3x_sm90", (64, 128, 64), 0, kernel_schedule="KernelTmaWarpSpecializedPingpong")
    ks = [GemmKernel("sm90a", "f16", "col", 8, 8, 8, GemmEpilogue(bias=True), pingpong),
          GemmKernel("sm90a", "f16", "col", 8, 8, 8, GemmEpilogue(bias=True, residual="add"), pingpong),
          GemmKernel("sm90a", "f16", "col", 8, 8, 8, GemmEpilogue(bias=True, activation="gelu_erf"), SM90)]
    shards = plan_shards(ks, slots=2)
    assert sorted(sorted(k.config.tile for k in s) for s in shards) == [
        [(64, 128, 64), (64, 128, 64)], [(128, 128, 64)]]
    assert estimate(ks[:2]) < estimate([ks[0], ks[2]])


def test_single_strategy_keeps_3x_convs_apart_from_gemm_headers():
    """CUTLASS 3.x conv kernels and GEMM headers cannot share a translation unit."""
    from cutlass_offload.build.shards import header_compatible_groups as _header_compatible_groups
    from cutlass_offload.ir import ConvKernel, GemmEpilogue, GemmKernel, KernelConfig
    ep = GemmEpilogue(bias=True)
    conv3 = ConvKernel("sm90a", "f16", 8, 8, 8, ep, KernelConfig("cutlass3x_sm90", (128, 128, 64), 0,
                       kernel_schedule="KernelImplicitTmaWarpSpecializedSm90"), iterator="")
    conv2 = ConvKernel("sm90a", "f16", 1, 1, 8, ep, KernelConfig("cutlass2x_sm80", (64, 64, 32), 2,
                       warp=(32, 32, 32), instruction=(16, 8, 16)), iterator="analytic")
    gemm = GemmKernel("sm90a", "f16", "col", 8, 8, 8, ep, KernelConfig("cutlass3x_sm90", (128, 128, 64), 0))
    assert _header_compatible_groups([conv3, gemm, conv2]) == [[conv3], [gemm, conv2]]
    assert _header_compatible_groups([conv2, gemm]) == [[conv2, gemm]]
    assert _header_compatible_groups([conv3]) == [[conv3]]


def test_few_cores_merge_into_single_strategy_units():
    """On 2 job slots concurrent nvcc gains less than a repeated fixed cost: a few
    3.x kernels of two groups share one unit (as in ``single``); on 16 slots they are
    spread, one kernel per shard; many kernels still split on 2 slots."""
    from cutlass_offload.build.shards import choose_shards, predicted_wall
    few = kernels(3) + kernels(2, dtype="bf16")
    assert [len(s) for s in choose_shards(few, slots=2)] == [5]
    assert choose_shards([], slots=2) == []              # everything reused from the cache
    assert sorted(len(s) for s in choose_shards(few, slots=16)) == [1] * 5
    from dataclasses import replace
    many = [replace(k, config=replace(SM90, tile=(128, 16 * (i + 1), 64)))   # 12 mainloops
            for i, k in enumerate(kernels(12))]
    two = choose_shards(many, slots=2, memory=200 * 2**30)    # memory to spare: the model alone
    assert len(two) == 2 and predicted_wall(two, 2) < predicted_wall([many], 2)


def test_unit_names_say_what_they_hold(monkeypatch):
    """A shard of one kind keeps its old name (its cache entries still hit); a
    mixed one names each family, kind and dtype (issue 20: gpt2 at sm_90a built a
    unit called shard_sm80_gemm_f16_6k holding sm90 GEMMs, the FMHA and a norm)."""
    from cutlass_offload import build
    from cutlass_offload.ir import NormKernel
    assert build.shard_name(kernels(6, SM80)) == "shard_sm80_gemm_f16_6k"
    norm = NormKernel("sm90a", "layer_norm", "f16", 8, True, True)
    mixed = kernels(4) + kernels(1, SM80) + [norm]
    assert build.shard_name(mixed) == "shard_sm90_gemm_f16_4k+rowwise_layer_norm_f16_1k+sm80_gemm_f16_1k"
    monkeypatch.setattr(build, "_NAME_MAX", 40)            # names prefix folder names: bounded
    assert build.shard_name(mixed) == "shard_sm90_gemm_f16_4k+2k_more"


def test_a_unit_too_big_for_its_share_of_memory_is_cut():
    """One cicc holds every instantiation of its unit: 42 CUTLASS 3.x kernels in one
    unit peaked at 16.6 GB on a 2-core machine, and a second such unit beside it
    was killed by the OOM killer (24 GiB). With 2 slots and 21 GiB, every unit fits
    half of it; with memory to spare, or unknown (0), the plan stays as it was."""
    from dataclasses import replace

    from cutlass_offload.build.shards import choose_shards, fit_memory, peak_memory
    many = [replace(k, config=replace(SM90, tile=(128, 8 * (i % 26 + 1), 64)))
            for i, k in enumerate(kernels(42))]
    assert peak_memory(many) > 15 * 2**30 > peak_memory(many[:1]) * 3
    gib = 2**30
    roomy = choose_shards(many, slots=2, memory=200 * gib)
    tight = choose_shards(many, slots=2, memory=21 * gib)
    assert len(tight) > len(roomy)
    assert all(peak_memory(s) <= 21 * gib / 2 for s in tight)
    assert sorted(k.name for s in tight for k in s) == sorted(k.name for k in many)
    assert fit_memory(roomy, 2, 0) == roomy
    # one unit cut in two on 2 slots: the pieces compile side by side, each within half
    cut = fit_memory([many], 2, 21 * gib)
    assert len(cut) >= 2 and all(peak_memory(s) <= 21 * gib / 2 for s in cut)
    # a one-kernel unit is never cut, even when it alone is over the share
    one = [many[:1]]
    assert fit_memory(one, 2, 1 * gib) == one


def test_peak_memory_grows_with_mainloops_more_than_with_epilogues():
    from dataclasses import replace

    from cutlass_offload.build.shards import peak_memory
    epilogues = kernels(6)                                   # one mainloop, six epilogues
    mainloops = [replace(k, config=replace(SM90, tile=(128, 64 + 16 * i, 64)))
                 for i, k in enumerate(kernels(6))]
    assert peak_memory([]) < peak_memory(epilogues[:1]) < peak_memory(epilogues) < peak_memory(mainloops)


def test_hopper_fmha_kernels_get_units_of_their_own_before_gemms_split_further():
    """sd-unet's case: its three FMHA kernels (head dims 40, 80, 160) and GEMMs on five
    mainloops, six slots. An FMHA kernel costs about 2x a GEMM mainloop to compile
    (shards.COST's attention_sm90 row); priced as a GEMM kernel, they shared a unit,
    the build's longest. Now no unit holds all three, and the plan's longest unit is
    shorter than they would be together."""
    from cutlass_offload.families import attention_sm90
    from cutlass_offload.ir.attention import AttentionProblem

    def fmha(head_dim, seq):
        return attention_sm90.choose(AttentionProblem(heads=8, seq_q=seq, seq_kv=seq, head_dim=head_dim,
                                                      head_dim_v=head_dim, dtype="f16", scale=head_dim ** -0.5,
                                                      batch=2))
    attention = [fmha(40, 4096), fmha(80, 1024), fmha(160, 256)]
    assert len({k.name for k in attention}) == 3
    gemms = [GemmKernel("sm90a", "f16", "col", 8, 8, 8, ep,
                        KernelConfig("cutlass3x_sm90", tile, 0, kernel_schedule="KernelTmaWarpSpecializedCooperative"))
             for tile in ((128, 64, 64), (64, 128, 64), (128, 96, 64), (64, 64, 128), (128, 192, 64))
             for ep in (GemmEpilogue(), GemmEpilogue(bias=True, residual="add"))]
    shards = plan_shards(attention + gemms, slots=6)
    assert len(shards) == 6
    per_unit = [sum(k.kind == "attention" for k in s) for s in shards]
    assert sum(per_unit) == 3 and max(per_unit) <= 2
    assert not any(0 < n < len(s) for n, s in zip(per_unit, shards))    # never beside GEMMs
    assert max(estimate(s) for s in shards) < estimate(attention)
