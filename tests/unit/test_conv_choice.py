"""The sm90a conv search space and the learned conv table (select/conv.py,
families/conv_sm90_table.py, ir.ConvChoice), and the table benchmarks/_conv_search.py
writes from searched rows: no GPU, no compiler."""
import json
import sys
import warnings
from pathlib import Path

import pytest

from cutlass_offload.emit import conv_gemm_sm90 as emitter
from cutlass_offload.families import conv_sm90_table
from cutlass_offload.ir import ConvChoice, ConvProblem, GemmEpilogue, GemmLaunch, KernelConfig
from cutlass_offload.select import conv_tuning_id, select
from cutlass_offload.select.conv import (IM2COL_SEARCH_MAX_ROWS, TMA_SEARCH, choice_of,
                                         choose_conv_kernel, search_space)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

EP = GemmEpilogue(bias=True)
# SD UNet's deepest 3x3 at batch 2: 8 x 8 x 2560 -> 1280 (40 TMA tiles of 64 x 64)
DEEP = dict(c=2560, k=1280, h=8, w=8, r=3, s=3, dtype="f16", align_a=8, align_b=8, align_c=8,
            pad=(1, 1, 1, 1), stride=(1, 1), dilation=(1, 1), epilogue=EP, n_hint=2)


def _p(**kw):
    return ConvProblem(**{**DEEP, **kw})


@pytest.fixture
def table(tmp_path):
    """Point the conv table at a temporary file; restore the packaged one after."""
    old = conv_sm90_table.TABLE_FILE
    path = tmp_path / "conv_table.json"
    yield path
    conv_sm90_table.use_table(old)


def _write(path, rows, num_sms=132):
    path.write_text(json.dumps({"gpu": "test", "num_sms": num_sms, "rows": rows}))
    conv_sm90_table.use_table(path)


def test_choice_round_trips_and_names_its_parts():
    c = ConvChoice("im2col", KernelConfig("cutlass3x_sm90", (128, 64, 64), 0, cluster=(1, 1, 1),
                                          kernel_schedule="KernelTmaWarpSpecializedCooperative",
                                          tile_scheduler="stream_k"),
                   GemmLaunch(decomposition="split_k", splits=6))
    assert ConvChoice.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    assert c.tag.startswith("im2col_128x64x64") and c.tag.endswith("splitk6")
    with pytest.raises(ValueError):
        ConvChoice("analytic", c.config)


def test_search_space_starts_with_the_rules_choice_then_tma_then_im2col_for_small_outputs():
    p = _p()
    space = search_space(p, "sm90a", 132)
    rules = choice_of(choose_conv_kernel(p, "sm90a", 132, table=False))
    assert space[0] == rules and len({c.tag for c in space}) == len(space)
    tma = [c for c in space if c.iterator == ""]
    assert {(c.config.tile, c.config.cluster) for c in tma} == set(TMA_SEARCH)   # K % 160 == 0
    im2col = [c for c in space if c.iterator == "im2col"]
    split = [c for c in im2col if c.launch.decomposition == "split_k"]
    assert len(im2col) == 1 + len(split)
    # 128 x 64 tiles: 20 output tiles, at most 6 splits in a wave; 128 x 128: 10 tiles, 12
    by_tile = {n: sorted(c.launch.splits for c in split if c.config.tile[1] == n) for n in (64, 128)}
    assert by_tile == {64: [2, 3, 4, 6], 128: [2, 3, 4, 6, 8, 12]}
    assert all(c.config.tile[1] != 160 for c in search_space(_p(k=1024), "sm90a", 132))
    for c in space:                      # every choice builds a kernel for the problem
        k = choose_conv_kernel(p, "sm90a", 132, choice=c)
        assert (k.iterator, k.config, k.launch) == (c.iterator, c.config, c.launch)


def test_search_space_leaves_im2col_out_of_large_outputs_and_is_empty_off_sm90a():
    big = _p(h=64, w=64)                  # 8192 output pixels
    assert 2 * 64 * 64 > IM2COL_SEARCH_MAX_ROWS
    assert all(c.iterator == "" for c in search_space(big, "sm90a", 132))
    assert search_space(_p(), "sm80", 108) == ()
    assert search_space(_p(c=4, k=64, align_a=4, align_b=4, h=224, w=224, n_hint=8), "sm90a",
                        132)[0].iterator == "im2col"     # the C < 8 rule stays first


def test_table_row_decides_for_its_problem_only(table):
    p = _p()
    row = ConvChoice("im2col", KernelConfig("cutlass3x_sm90", (128, 64, 64), 0, cluster=(1, 1, 1),
                                            kernel_schedule="KernelTmaWarpSpecializedCooperative",
                                            tile_scheduler="stream_k"),
                     GemmLaunch(decomposition="split_k", splits=6))
    _write(table, {conv_sm90_table.class_key(p): {"choice": row.to_dict()}})
    k = choose_conv_kernel(p, "sm90a", 132)
    assert (k.iterator, k.launch.splits) == ("im2col", 6)
    assert choose_conv_kernel(_p(n_hint=4), "sm90a", 132).iterator == ""   # another batch
    assert choose_conv_kernel(p, "sm90a", 114).iterator == ""              # another GPU
    assert choose_conv_kernel(p, "sm90a", 132, table=False).iterator == ""
    # a row whose lowering cannot run the problem (a per-channel residual) is passed over
    vec = _p(epilogue=GemmEpilogue(bias=True, residual="mul", residual_broadcast=True))
    assert choose_conv_kernel(vec, "sm90a", 132).iterator == ""


def test_unreadable_table_warns_and_the_rules_choose(table):
    table.write_text("{not json")
    conv_sm90_table.use_table(table)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        k = choose_conv_kernel(_p(), "sm90a", 132)
    assert k.iterator == "" and any("unreadable" in str(x.message) for x in w)


def test_select_takes_a_searched_choice_by_tuning_id():
    from cutlass_offload.ir import ConvRegion, PartitionResult
    from cutlass_offload.config import CompileOptions
    p = _p()
    region = ConvRegion(name="r0", nodes=("n0",), form="conv2d", problem=p, x="x", w="w", bias="b")
    forced = [c for c in search_space(p, "sm90a", 132) if c.config.tile == (128, 160, 64)][0]
    opts = CompileOptions(arch="sm90a", pytorch_when_faster=False)
    plan = select(PartitionResult(regions=(region,), fallbacks=()), "sm90a", opts,
                  {conv_tuning_id(p): forced})
    assert choice_of(plan.kernels[0]) == forced


def test_im2col_reads_a_filter_whose_rows_are_16_bytes_in_place():
    k = choose_conv_kernel(_p(), "sm90a", 132, choice=[c for c in search_space(_p(), "sm90a", 132)
                                                        if c.iterator == "im2col"][0])
    code = emitter.emit(k).code
    assert "filter_is_b(a)" in code and "return kIm2col && !filter_is_b(a)" in code


def test_conv_table_from_searched_rows_keeps_clear_winners_only(tmp_path):
    import _conv_search
    base = {"kind": "conv2d", "n": None, "n_hint": 2, "h": 8, "w": 8, "c": 2560, "k": 1280, "r": 3,
            "s": 3, "pad": [1, 1, 1, 1], "stride": [1, 1], "dilation": [1, 1], "anchor_us": 33.0}
    fast, slow = search_space(_p(), "sm90a", 132)[-1], search_space(_p(), "sm90a", 132)[0]
    choices = {fast.tag: fast.to_dict(), slow.tag: slow.to_dict()}
    rows = [
        # two epilogues of one class: the sum decides (fast wins 40 + 30 against 56 + 50)
        {**base, "search": {slow.tag: 56.0, fast.tag: 40.0}, "search_choices": choices,
         "search_default": slow.tag},
        {**base, "search": {slow.tag: 50.0, fast.tag: 30.0, "x": "fell back"},
         "search_choices": choices, "search_default": slow.tag},
        # another class where the default is within MIN_GAIN: no row
        {**base, "c": 1280, "search": {slow.tag: 30.0, fast.tag: 29.9}, "search_choices": choices,
         "search_default": slow.tag},
    ]
    n = _conv_search.write_table(rows, tmp_path / "t.json", "H200", 132)
    data = json.loads((tmp_path / "t.json").read_text())
    assert n == 1 and list(data["rows"]) == [conv_sm90_table.class_key(_p())]
    row = data["rows"][conv_sm90_table.class_key(_p())]
    assert ConvChoice.from_dict(row["choice"]) == fast and row["us"] == 35.0
    assert row["default_us"] == 53.0


@pytest.mark.parametrize("kw, tile", [
    (dict(c=512, k=512, h=64, w=64, n_hint=1), (128, 128, 64)),    # 128 CTAs: one wave
    (dict(c=960, k=320, h=64, w=64), (128, 160, 64)),              # 64 x 2 tiles of 128 x 160
    (dict(c=960, k=256, h=64, w=64), (128, 128, 64)),              # 160 does not divide 256
    (dict(c=1280, k=1280, h=8, w=8), (64, 64, 64)),                # 128 output pixels
])
def test_tma_rule_counts_whole_waves_and_takes_no_cluster(kw, tile):
    k = choose_conv_kernel(_p(**kw), "sm90a", 132, table=False)
    assert (k.iterator, k.config.tile, k.config.cluster) == ("", tile, (1, 1, 1))
