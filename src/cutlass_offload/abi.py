"""The C ABI between a generated library and Python, in one place (a leaf module:
it imports nothing from the pipeline stages).

Every region launcher is ``int co_<region>(const <Args>*, cudaStream_t)`` plus
``int64_t co_<region>_workspace(const <Args>*)`` (bytes), returning a status
code; the argument structs, status codes and symbols are defined in C in
emit/templates/prelude.h, and here as field lists that runtime/library.py turns
into ctypes mirrors. tests/build/test_abi_layout.py compiles prelude.h and
checks every field offset and struct size against those mirrors.

Field kinds: "ptr" (void*), "i64" (int64_t), "i32" (int32_t), "f32" (float).
"""
from __future__ import annotations

_GEMM_INTS = ("m", "n", "k", "l", "lda", "ldb", "ldc", "ldd",
              "batch_stride_a", "batch_stride_b", "batch_stride_c", "batch_stride_d")
_CONV_INTS = ("n", "h", "w", "c", "k", "r", "s", "p", "q",
              "pad_h", "pad_w", "stride_h", "stride_w", "dilation_h", "dilation_w")
_WORKSPACE = (("workspace", "ptr"), ("workspace_bytes", "i64"))

# struct name -> ((field, kind), ...) in declaration order (prelude.h)
ARGS_FIELDS = {
    "CoGemmArgs": (
        *((f, "ptr") for f in ("a", "b", "bias", "c", "d")),
        *((f, "i64") for f in _GEMM_INTS),
        *_WORKSPACE,
        # run-time launch knobs of sm90 GEMMs (ir.GemmLaunch; codes: see prelude.h)
        *((f, "i32") for f in ("raster_order", "swizzle", "splits", "decomposition", "pdl")),
    ),
    "CoConvArgs": (
        *((f, "ptr") for f in ("x", "filter", "bias", "residual", "y")),
        *((f, "i64") for f in _CONV_INTS),
        *_WORKSPACE,
    ),
    "CoNormArgs": (
        *((f, "ptr") for f in ("input", "weight", "bias", "output")),
        ("rows", "i64"), ("cols", "i64"), ("eps", "f32"),
        *_WORKSPACE,
    ),
    "CoGroupNormArgs": (
        *((f, "ptr") for f in ("input", "weight", "bias", "output")),
        *((f, "i64") for f in ("n", "h", "w", "c", "groups")),
        ("eps", "f32"),
        *_WORKSPACE,
    ),
    "CoAttentionArgs": (
        ("q", "ptr"), ("k", "ptr"), ("v", "ptr"), ("bias", "ptr"), ("out", "ptr"),
        ("batch", "i64"), ("heads", "i64"), ("seq_q", "i64"), ("seq_kv", "i64"),
        ("head_dim", "i64"), ("head_dim_v", "i64"),
        ("q_stride_batch", "i64"), ("q_stride_seq", "i64"), ("q_stride_head", "i64"),
        ("k_stride_batch", "i64"), ("k_stride_seq", "i64"), ("k_stride_head", "i64"),
        ("v_stride_batch", "i64"), ("v_stride_seq", "i64"), ("v_stride_head", "i64"),
        ("out_stride_batch", "i64"), ("out_stride_seq", "i64"), ("out_stride_head", "i64"),
        ("bias_stride_batch", "i64"), ("bias_stride_head", "i64"), ("bias_stride_query", "i64"),
        ("bias_kv_capacity", "i64"),
        ("scale", "f32"), ("causal", "i32"),
        *_WORKSPACE,
    ),
}

# enum CoStatus (prelude.h)
CO_OK, CO_CANNOT_IMPLEMENT, CO_WORKSPACE_TOO_SMALL, CO_INIT_FAILED, CO_LAUNCH_FAILED = range(5)
STATUS_NAMES = {CO_OK: "ok", CO_CANNOT_IMPLEMENT: "cannot implement",
                CO_WORKSPACE_TOO_SMALL: "workspace too small", CO_INIT_FAILED: "initialize failed",
                CO_LAUNCH_FAILED: "launch failed"}


def region_symbol(region_name: str) -> str:
    """The launcher symbol of a region (``co_<name>``); its workspace query is the
    same with ``_workspace`` appended. The library exports ``co_*`` only
    (emit/templates/exports.map)."""
    return f"co_{region_name}"


WORKSPACE_SUFFIX = "_workspace"


def workspace_symbol(region_name: str) -> str:
    return region_symbol(region_name) + WORKSPACE_SUFFIX
