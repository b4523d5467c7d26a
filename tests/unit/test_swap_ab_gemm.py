"""swap_ab sm90a GEMMs (no nvcc, no GPU): the kernel computes D^T = B^T A^T and stores
D^T column-major, i.e. D row-major, so a problem with few rows gets a tile N fitted to
M (KernelConfig.swap_ab). The config, what the emitter writes for it, where the search
proposes it, and where a learned table entry of that kind is passed over."""
from dataclasses import replace

import pytest

from cutlass_offload.emit import gemm_sm90
from cutlass_offload.ir import GemmEpilogue, GemmKernel, GemmProblem, KernelConfig, config_from_dict, config_to_dict
from cutlass_offload.select import DEFAULT_NUM_SMS, sm90

SMS = DEFAULT_NUM_SMS["sm90a"]
SWAP_160 = sm90._config((128, 160, 64), (1, 1, 1), sm90.COOP, swap_ab=True)


def _problem(m, n, k, dtype="f16", epilogue=None, layout_a="row", layout_b="col", batch=1):
    return GemmProblem(n=n, k=k, dtype=dtype, layout_b=layout_b, align_a=8, align_b=8, align_c=8,
                       epilogue=epilogue or GemmEpilogue(), m=m, m_hint=m, layout_a=layout_a,
                       batch=batch, tf32=dtype == "f32")


def _kernel(config, dtype="f16", epilogue=None, layout_a="row", layout_b="col"):
    return GemmKernel(arch="sm90a", dtype=dtype, layout_b=layout_b, align_a=8, align_b=8, align_c=8,
                      epilogue=epilogue or GemmEpilogue(), config=config, layout_a=layout_a)


def test_the_config_names_the_swap_and_round_trips():
    assert SWAP_160.swap_ab and SWAP_160.tag == "128x160x64_c1x1x1_coop_swapab"
    assert config_from_dict(config_to_dict(SWAP_160)) == SWAP_160
    # a table entry written before the field existed reads as not swapped
    old = config_to_dict(sm90.CONFIGS["mid"])
    del old["swap_ab"]
    assert not config_from_dict(old).swap_ab
    for bad in (dict(tile_scheduler="stream_k"), dict(warp=(128, 80, 64)), dict(family="cutlass2x_sm80")):
        with pytest.raises(ValueError, match="swap_ab"):
            replace(SWAP_160, **bad)


def test_the_emitted_kernel_computes_the_transpose_with_the_problems_arguments():
    ep = GemmEpilogue(bias=True, activation="gelu_erf", residual="add")
    code = gemm_sm90.emit(_kernel(SWAP_160, epilogue=ep)).code
    # CUTLASS's problem is (N, M, K, L), its A the problem's B and its B the problem's A
    assert ("{static_cast<int>(args.n), static_cast<int>(args.m), static_cast<int>(args.k),"
            in code)
    assert ("static_cast<ElementA const*>(args.b),\n"
            "       cute::make_stride(int64_t(args.ldb), cute::_1{}, int64_t(args.batch_stride_b)),\n"
            "       static_cast<ElementB const*>(args.a),\n"
            "       cute::make_stride(int64_t(args.lda), cute::_1{}, int64_t(args.batch_stride_a))}"
            in code)
    # C and D column-major (N, M, L) = row-major (M, N, L), with the problem's ldc / ldd
    assert "using LayoutC = cutlass::layout::ColumnMajor;" in code
    assert "using LayoutD = cutlass::layout::ColumnMajor;" in code
    assert "cute::make_stride(cute::_1{}, int64_t(args.ldc), int64_t(args.batch_stride_c))" in code
    assert "cute::make_stride(cute::_1{}, int64_t(args.ldd), int64_t(args.batch_stride_d))" in code
    assert "StrideD, cute::Stride<cute::_1, int64_t, int64_t>>" in code
    # the per-column bias runs along D^T's rows
    assert "Sm90ColBroadcast<0, TileShape, ElementBias" in code and "Sm90RowBroadcast" not in code
    assert "static_cast<ElementC const*>(args.c)" in code


@pytest.mark.usefixtures("cutlass_tma_epilogue")
def test_other_kernels_keep_the_problems_orientation():
    code = gemm_sm90.emit(_kernel(sm90.CONFIGS["mid"], epilogue=GemmEpilogue(bias=True))).code
    assert "{static_cast<int>(args.m), static_cast<int>(args.n)," in code
    assert "using LayoutD = cutlass::layout::RowMajor;" in code
    assert "Sm90RowBroadcast<0, TileShape, ElementBias" in code and "Sm90ColBroadcast" not in code


@pytest.mark.parametrize("kernel, match", [
    (dict(layout_a="col"), "K-contiguous"),
    (dict(layout_b="row"), "K-contiguous"),
    (dict(epilogue=GemmEpilogue(activation="silu", glu=True)), "GLU"),
])
def test_what_a_swapped_kernel_cannot_take_is_refused(kernel, match):
    with pytest.raises(ValueError, match=match):
        gemm_sm90.emit(_kernel(SWAP_160, **kernel))


def test_the_search_proposes_tiles_fitted_to_few_rows():
    # the UNet's 154-token text projections: one 160-wide tile, or two 80-wide ones
    tags = [c.tag for c in sm90.fitted_configs(_problem(154, 24960, 768), SMS) if c.swap_ab]
    assert tags == ["64x160x64_c1x1x1_pingpong_swapab", "128x160x64_c1x1x1_coop_swapab",
                    "64x80x64_c1x1x1_pingpong_swapab", "128x80x64_c1x1x1_coop_swapab"]
    # a handful of rows: the narrowest tile, 16 columns
    assert {c.tile for c in sm90.swap_configs(_problem(2, 4096, 4096), SMS)} == {(64, 16, 64), (128, 16, 64)}
    # and in the full search, after the heuristic's choice
    space = sm90.search_space(_problem(154, 24960, 768), SMS)
    assert space[0] == sm90.choose(_problem(154, 24960, 768), SMS)[0]
    assert sum(c.swap_ab for c in space) >= 4
    # the rules alone never swap: only a measured table entry does (the packaged one
    # for this shape, measured on the H200)
    assert not sm90.choose(_problem(154, 24960, 768), SMS, table=None)[0].swap_ab
    assert sm90.choose(_problem(154, 24960, 768), SMS)[0].swap_ab


@pytest.mark.parametrize("problem", [
    _problem(512, 1280, 1280),                                     # rows enough for its tiles
    _problem(154, 4096, 768, layout_a="col"),                      # A M-contiguous
    _problem(154, 4096, 768, layout_b="row"),                      # B N-contiguous
    _problem(154, 4096, 2048, epilogue=GemmEpilogue(activation="silu", glu=True)),
    _problem(154, 4096, 768, batch=4),                             # batched
    _problem(154, 4096, 768, dtype="f32"),
])
def test_no_swap_proposal_where_it_cannot_apply_or_pay(problem):
    assert sm90.swap_configs(problem, SMS) == ()


def test_the_tiles_cover_the_transposed_output():
    p = _problem(154, 24960, 768)
    assert sm90.tiled_mn(p, SWAP_160) == (24960, 154)
    assert sm90._ctas(p, SWAP_160) == 195                # 24960 / 128 tiles of all 154 rows
    assert sm90.plausible(p, SWAP_160, SMS)


def test_a_swapped_table_entry_is_passed_over_where_the_problem_cannot_take_it():
    glu = _problem(154, 4096, 2048, epilogue=GemmEpilogue(activation="silu", glu=True))
    assert not sm90.takes(glu, SWAP_160)
    assert not sm90.takes(_problem(154, 4096, 768, layout_a="col"), SWAP_160)
    assert sm90.takes(_problem(154, 4096, 768, epilogue=GemmEpilogue(bias=True)), SWAP_160)
    entry = {"m": 154, "n": 4096, "k": 2048, "batch": 1, "layout_b": "col",
             "config": config_to_dict(SWAP_160), "launch": {}, "us": 1.0, "anchor_us": 1.0}
    table = sm90.Table({"gpu": "test", "num_sms": SMS, "entries": [entry]})
    assert sm90.choose(_problem(154, 4096, 2048), SMS, table)[0] == SWAP_160
    assert not sm90.choose(glu, SMS, table)[0].swap_ab


def test_swapped_and_plain_kernels_of_one_tile_are_different_mainloops():
    from cutlass_offload.build import shards
    plain = _kernel(replace(SWAP_160, swap_ab=False))
    assert shards.mainloop(plain) != shards.mainloop(_kernel(SWAP_160))
    assert plain.name != _kernel(SWAP_160).name


def test_kernel_config_docs_the_field():
    assert "swap_ab" in KernelConfig.__doc__
