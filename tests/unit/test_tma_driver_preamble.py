"""The TMA units' preamble (emit/templates/tma_driver.h): every sm90 TMA kernel asks
for it, a unit inlines it once, after the C ABI and before the first CUTLASS
include (the macro it redefines is expanded by cute's TMA headers); 2.x units
have none. No compiler: the build tier compiles these units."""
import pytest

from cutlass_offload.emit import emit_kernel, emit_unit, sm90_parts
from cutlass_offload.families import attention_sm90 as attention_family
from cutlass_offload.ir import AttentionKernelSm90, ConvProblem, GemmEpilogue, GemmProblem
from cutlass_offload.select import choose_kernel
from cutlass_offload.select.conv import choose_conv_kernel

EP = GemmEpilogue(bias=True, activation="relu")


def _gemm(arch="sm90a", align=8):
    p = GemmProblem(n=768, k=768, dtype="f16", layout_b="col", align_a=align, align_b=align,
                    align_c=align, epilogue=EP, m=None, m_hint=4096)
    return choose_kernel(p, arch, table=False)


def _conv(**kw):
    fields = dict(c=64, k=64, h=56, w=56, r=3, s=3, dtype="f16", align_a=8, align_b=8, align_c=8,
                  pad=(1, 1, 1, 1), stride=(1, 1), epilogue=EP, n_hint=8)
    return choose_conv_kernel(ConvProblem(**{**fields, **kw}), "sm90a", 132)


def sm90_kernels():
    """One kernel per sm90 emitter (the conv picks: TMA implicit GEMM, direct, im2col)."""
    return {
        "gemm": _gemm(),
        "tma conv": _conv(),
        "direct conv": _conv(r=1, s=1, pad=(0, 0, 0, 0)),
        "im2col conv": _conv(c=3, align_a=1, align_b=1),
        "attention": AttentionKernelSm90(arch="sm90a", dtype="f16",
                                         config=attention_family.CONFIGS[0]),
    }


@pytest.mark.parametrize("what", list(sm90_kernels()))
def test_sm90_units_look_the_encode_up_once(what):
    k = sm90_kernels()[what]
    src = emit_kernel(k)
    assert src.preamble == (sm90_parts.TMA_DRIVER,)
    text = emit_unit([src, src], "test").text
    assert text.count("#define CO_TMA_DRIVER_H") == 1
    at = text.index("#define CUTLASS_CUDA_DRIVER_WRAPPER_CALL(func) co_driver::call_##func")
    assert text.index("struct CoGemmArgs") < at                    # after the C ABI
    cutlass = [inc for inc in src.includes if inc.startswith(("cutlass/", "cute/"))]
    assert cutlass and at < min(text.index(f"#include <{inc}>") for inc in cutlass)


def test_2x_units_have_no_preamble():
    src = emit_kernel(_gemm(arch="sm80"))
    assert src.preamble == ()
    assert "co_driver" not in emit_unit([src], "test").text


def test_the_preamble_redefines_cutlass_driver_calls_for_both_encodes():
    text = sm90_parts.TMA_DRIVER
    for fn in ("cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col"):
        assert f"call_{fn}(Args... args)" in text and f'entry_point("{fn}", 12000)' in text
    assert "#undef CUTLASS_CUDA_DRIVER_WRAPPER_CALL" in text
