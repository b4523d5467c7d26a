"""benchmarks/cpp_wrapper_compile.py: how it labels Inductor's host compiler calls
(command lines as torch's cpp_builder writes them) and sums them per kind in a row."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import cpp_wrapper_compile as cwc  # noqa: E402

INC = "-I/t/include -D C10_USING_CUSTOM_GENERATED_MACROS -D NDEBUG -fPIC"


def test_call_kinds_and_levels():
    assert cwc.call_kind(f"g++ /c/ab/x.main.cpp {INC} -O1 -DNDEBUG -c -o /c/ab/x.main.o") == ("main", "1")
    assert cwc.call_kind(f"g++ /c/ab/x.main.cpp {INC} -O3 -DNDEBUG -shared -o /c/ab/x.main.so") == ("main", "3")
    assert cwc.call_kind(f"g++ /c/y.optimized.cpp {INC} -O3 -c -o /c/y.optimized.o") == ("optimized", "3")
    assert cwc.call_kind(f"g++ /tmp/h.h {INC} -O1 -E -P -o /tmp/header.i") == ("header", "1")
    assert cwc.call_kind(f"g++ /c/k.cpp {INC} -O3 -shared -o /c/k.so") == ("kernel+link", "3")
    assert cwc.call_kind("g++ /c/a.o /c/b.o -shared -o /c/x.so -ltorch") == ("link", "-")


def test_row_sums_per_kind_largest_first():
    r = {"model": "bert-base", "device": "cpu", "variant": "separate", "first_call_s": 18.44,
         "compiler_calls": [{"kind": "main", "opt": "1", "s": 2.0}, {"kind": "main", "opt": "1", "s": 0.5},
                            {"kind": "optimized", "opt": "3", "s": 3.0}],
         "isa_checks": [{"isa": "avx512", "s": 1.25}, {"isa": "avx2", "s": 1.0}]}
    assert cwc._row(r) == ("| bert-base | cpu | separate | 18.4 | 5.5 | 2.2 | "
                           "optimized -O3 3.0 s, main -O1 2.5 s |")


def test_variants_name_their_options():
    from cutlass_offload.runtime import glue
    assert cwc.variant_options("o3") == {"cpp_wrapper": True, "cpp_wrapper_build_separate": False}
    assert cwc.variant_options("ours") == {"cpp_wrapper": True, **glue.CPP_WRAPPER_EXTRA_OPTIONS}
    assert cwc.variant_options("ours_no_isa_check")["cpp.vec_isa_ok"] is False
    import pytest
    with pytest.raises(ValueError, match="unknown variant"):
        cwc.variant_options("fast")
