"""benchmarks/compile_profile.py's parts that need no nvcc: the phases of
``nvcc --time``'s CSV, the nesting of -fdevice-time-trace's instantiation events,
and the one-kernel unit it emits for each epilogue form."""
import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compile_profile  # noqa: E402

CSV = """source file name , phase name , phase input files , phase output file , arch , tool, metric , unit
/tmp/a.cu , cudafe++ , /tmp/x.ii  , /tmp/x.cpp , compute_90a , nvcc , 4956.5 , ms
/tmp/a.cu , cicc , /tmp/x.cpp  , /tmp/x.ptx , compute_90a , nvcc , 14217.25 , ms
/tmp/a.cu , ptxas , /tmp/x.ptx  , /tmp/x.cubin , sm_90a , nvcc , 127.0 , ms
/tmp/a.cu , ptxas , /tmp/y.ptx  , /tmp/y.cubin , sm_90a , nvcc , 3.0 , ms
 , nvcc (driver) ,  ,  ,  , nvcc , 0.37 , ms
"""


def test_phases_sum_each_named_phase():
    assert compile_profile.phases(CSV) == {"cudafe++": 4956.5, "cicc": 14217.25, "ptxas": 130.0,
                                           "nvcc (driver)": 0.37}


def _event(name, ts, dur):
    return {"ph": "X", "name": "Instantiating Template Function", "ts": ts, "dur": dur,
            "args": {"detail": name + "<int, float>"}}


def test_instantiation_tree_nests_by_time_and_sums_paths():
    events = [
        _event("device_kernel", 0, 10_000_000),
        _event("GemmUniversal::operator()", 0, 9_000_000),
        _event("Epilogue::store", 100, 5_000_000),
        _event("Mma::load", 6_000_000, 2_000_000),
        _event("Mma::load", 8_000_100, 500_000),        # a second, disjoint instance
        _event("Params", 10_000_000, 1_000_000),        # starts where the kernel ends: top level
        {"ph": "X", "name": "Processing Header File", "ts": 0, "dur": 99_000_000},
        {"ph": "B", "name": "Instantiating Template Class", "ts": 1},
    ]
    tree = compile_profile.instantiation_tree(events, max_depth=2)
    assert tree[0] == [("device_kernel", 10.0), ("Params", 1.0)]
    assert tree[1] == [("GemmUniversal::operator()", 9.0)]
    assert tree[2] == [("GemmUniversal::operator() > Epilogue::store", 5.0),
                       ("GemmUniversal::operator() > Mma::load", 2.5)]
    assert compile_profile.instantiation_tree(events, max_depth=0) == {0: tree[0]}


@pytest.mark.parametrize("form, marker", [("tma", "epilogue::collective::CollectiveBuilder"),
                                          ("staged", "co_staged::StagedEpilogue<"),
                                          ("staged_tma", "co_staged::TmaStagedEpilogue<")])
def test_emits_one_kernel_unit_per_form(tmp_path, form, marker):
    args = argparse.Namespace(tile="128x128x64", cluster="1x1x1", schedule="pingpong", dtype="f16",
                              epilogue="bias_gelu")
    src = compile_profile.emit_unit(form, args, tmp_path).read_text()
    assert marker in src
    assert "cutlass3x_sm90_gemm_f16_tn_128x128x64_c1x1x1_pingpong_align888_bias_gelu" in src
    from cutlass_offload.emit import staged
    assert staged.ENABLED is None and staged.STORE == "tma"      # put back
