"""The C ABI over one CuTe DSL GEMM exported ahead of time (emit/dsl_gemm_sm90.py):
C++ that defines ``namespace <name> { workspace_size; run }`` over the DSL's entry
point, as the C++ emitters' units do, so a DSL kernel stands where a C++ one does
(build/dsl.py links it)."""
from __future__ import annotations

import string

# The C ABI over one exported kernel (after prelude.h and the DSL's header
# ``${prefix}.h``): what the C++ emitters' units define, so a DSL kernel can stand
# where a C++ one does. Placeholders ${...}; string.Template.substitute is strict.
SHIM = """\
// ${name}: CuTe DSL kernel ${prefix} (emit/dsl_gemm_sm90.py)
namespace ${name} {

static ${prefix}_Kernel_Module_t co_module;
static std::once_flag co_loaded;

int64_t workspace_size(const CoGemmArgs&) { return 0; }

static inline bool co_fits(int64_t v) { return v >= 0 && v <= INT32_MAX; }
static inline bool co_aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

int run(const CoGemmArgs& args, cudaStream_t stream) {
  if (!(co_fits(args.m) && co_fits(args.n) && co_fits(args.k) && co_fits(args.l))) {
    return CO_CANNOT_IMPLEMENT;
  }
  if (args.m == 0 || args.n == 0 || args.l == 0) {
    return CO_OK;
  }
  // 16-byte rows and bases (TMA; the kernel was compiled for contiguous extents
  // divisible by 8); no split-K. Raster, swizzle and PDL knobs are not taken: it
  // launches without PDL, which is always safe
  bool ok = co_aligned(args.a) && co_aligned(args.b) && co_aligned(args.d) &&
            args.k % 8 == 0 && args.n % 8 == 0 && args.lda % 8 == 0 && args.ldb % 8 == 0 &&
            args.ldd % 8 == 0 && args.splits <= 1 && args.decomposition == 0${checks};
  if (!ok) {
    return CO_CANNOT_IMPLEMENT;
  }
  std::call_once(co_loaded, [] { ${prefix}_Kernel_Module_Load(&co_module); });
  const int32_t m = int32_t(args.m), n = int32_t(args.n), k = int32_t(args.k), l = int32_t(args.l);
  ${prefix}_Tensor_a_t a{const_cast<void*>(args.a), {m, k, l}, {args.lda, args.batch_stride_a}};
  ${prefix}_Tensor_b_t b{const_cast<void*>(args.b), {${b_rows}, k, l}, {args.ldb, args.batch_stride_b}};
  ${prefix}_Tensor_d_t d{args.d, {m, n, l}, {args.ldd, args.batch_stride_d}};
  // operands the epilogue does not read get D's pointer (never dereferenced)
  ${prefix}_Tensor_bias_t bias{const_cast<void*>(${bias_ptr}), {n}};
  ${prefix}_Tensor_c_t c{const_cast<void*>(${c_ptr}), {m, n, l}, {${c_strides}}};
  return cute_dsl_${prefix}_wrapper(&co_module, &a, &b, &d, &bias, &c, stream) == 0
             ? CO_OK : CO_LAUNCH_FAILED;
}

}  // namespace ${name}
"""


def shim(name: str, prefix: str, bias: bool, residual: str, gated: bool = False) -> str:
    """The C++ of ``namespace <name> { workspace_size; run }`` over the exported
    kernel ``prefix`` (``SHIM``): CoGemmArgs (prelude.h) -> the DSL's tensor structs.
    A is (M, K, L) with strides (lda, batch), B (N, K, L) K-contiguous (layout_b
    "col"; gated: (2N, K, L), rows gate_0, up_0, gate_1, ...), D and C (M, N, L).
    Needs <mutex> and the DSL's header before it."""
    checks = ""
    if bias:
        checks += " && args.bias != nullptr && co_aligned(args.bias)"
    if residual != "none":
        checks += " && args.c != nullptr && co_aligned(args.c) && args.ldc % 8 == 0"
    return string.Template(SHIM).substitute(
        name=name, prefix=prefix, checks=checks, b_rows="2 * n" if gated else "n",
        bias_ptr="args.bias" if bias else "args.d",
        c_ptr="args.c" if residual != "none" else "args.d",
        c_strides="args.ldc, args.batch_stride_c" if residual != "none"
        else "args.ldd, args.batch_stride_d")
