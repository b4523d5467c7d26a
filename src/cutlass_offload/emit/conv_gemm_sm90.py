"""C++ for one conv2d fprop lowered onto the sm90a GEMM (family ``cutlass3x_sm90``,
``ConvKernel.iterator`` "direct" or "im2col"; the rules and the why are in
families/conv_gemm_sm90.py).

``emit(kernel)`` returns a ``KernelSource`` whose code defines, inside
``namespace <kernel.name>``::

    int64_t workspace_size(const CoConvArgs& args);        // bytes
    int run(const CoConvArgs& args, cudaStream_t stream);  // a CoStatus

and, nested in it, the GEMM itself (``namespace gemm``, emit/gemm_sm90.py's
template for the same tile config and epilogue, B K-major): the conv is
``gemm::run`` on CoGemmArgs made from the CoConvArgs. Its entry points are
declared weak like every kernel's (emit/__init__.py), so the same conv kernel in
two objects of one library links once; two convs on the same GEMM config share
the CUTLASS template instantiations in a translation unit, which is where the
compile time goes.

* direct: A = x (N*H*W, C), B = filter (K, C), D = y (N*H*W, K), C = the residual
  (same layout as y); no workspace beyond the GEMM's.
* im2col: the workspace holds [A chunk (rows, Kp) | B (K, Kp) | the GEMM's
  workspace], each part 256-byte aligned; B's part is empty when R*S*C is a
  multiple of 8 (Kp = R*S*C: the KRSC filter is B as it lies, read in place; a
  filter not 16-byte aligned is then refused, not copied). Per chunk of at most
  IM2COL_CHUNK_BYTES of A: one ``co_im2col::pack`` launch (templates/im2col.cuh;
  the first also packs B where it is packed), then the GEMM on those rows (D, C
  and the row offset advance together).

The GEMM launches with PDL where its unit compiles CUTLASS's grid dependency
control (persistent kernels, GDC_DEFINES): its prologue overlaps the pack kernel
(or whatever ran before), and griddepcontrol.wait holds its first global read
until that kernel is done. Its other launch knobs (raster order, swizzle, split-K /
stream-K decomposition) are the kernel's ``launch``, compiled in as constants.
``run`` allocates nothing and synchronizes nothing: it can be captured into a
CUDA graph.
"""
from __future__ import annotations

import string
from pathlib import Path

from ..families.conv_gemm_sm90 import CHUNK_ROW_MULTIPLE, IM2COL_CHUNK_BYTES, ITERATORS
from ..ir import DECOMPOSITIONS, RASTER_ORDERS, ConvKernel, GemmKernel, GemmLaunch, KernelSource
from . import gemm_sm90
from .evt_sm90 import ELEMENT, semantics
from . import sm90_parts
from .sm90_parts import CONV_EXTENTS_OK

# templates/im2col.cuh, inlined once per TU (include guard)
_PACK = (Path(__file__).parent / "templates" / "im2col.cuh").read_text()

TEMPLATE = string.Template("""\
// ${name}
// y = ${semantics}
// conv2d fprop as one sm90 GEMM (${iterator}): families/conv_gemm_sm90.py
namespace ${name} {

namespace gemm {
__attribute__((weak)) int64_t workspace_size(const CoGemmArgs& args);
__attribute__((weak)) int run(const CoGemmArgs& args, cudaStream_t stream);
}  // namespace gemm

${gemm_code}

using Element = ${element};
constexpr bool kIm2col = ${im2col};
constexpr int64_t kChunkBytes = ${chunk_bytes};       // IM2COL_CHUNK_BYTES
constexpr int64_t kChunkRowMultiple = ${chunk_rows};  // CHUNK_ROW_MULTIPLE
constexpr int64_t kPartAlign = 256;                   // bytes: each workspace part starts aligned
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
constexpr int32_t kPdl = 1;  // griddepcontrol.wait compiled in: the GEMM may launch early
#else
constexpr int32_t kPdl = 0;
#endif

static inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
static inline bool co_fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }
static inline bool aligned16(const void* p) {
  return p != nullptr && (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}
static inline int64_t packed_k(const CoConvArgs& a) { return round_up(a.r * a.s * a.c, 8); }
// R*S*C a multiple of 8: the filter (K, R*S*C) is B as it lies
static inline bool filter_is_b(const CoConvArgs& a) { return a.r * a.s * a.c % 8 == 0; }

// Rows of A packed at once (mirror of families/conv_gemm_sm90.py chunk_rows)
static inline int64_t chunk_rows(const CoConvArgs& a) {
  int64_t rows = kChunkBytes / (packed_k(a) * int64_t(sizeof(Element)));
  rows = rows / kChunkRowMultiple * kChunkRowMultiple;
  return rows < kChunkRowMultiple ? kChunkRowMultiple : rows;
}

static inline bool args_ok(const CoConvArgs& a) {
""" + CONV_EXTENTS_OK + """  if (a.stride_h < 1 || a.stride_w < 1 || a.dilation_h < 1 || a.dilation_w < 1) return false;
  if (a.k % 8 != 0) return false;                    // rows of y: 16 bytes for TMA
  if (a.p * a.q > INT32_MAX || a.n * a.p > INT32_MAX || a.n * a.p * a.q > INT32_MAX) return false;
  if (!kIm2col) {  // the activation is A as it lies
    return a.r == 1 && a.s == 1 && a.stride_h == 1 && a.stride_w == 1 && a.pad_h == 0 &&
           a.pad_w == 0 && a.p == a.h && a.q == a.w && a.c % 8 == 0;
  }
  // the pack kernel's 32-bit index math (im2col.cuh): one image's offsets, the image
  // rows / columns a window reaches (padding included), one chunk plus B in int range
  constexpr int64_t kHalfInt = int64_t(1) << 30;
  if (a.r * a.s * a.c > INT32_MAX - 8 || a.h * a.w * a.c > INT32_MAX / 2) return false;
  if (a.p * a.stride_h + a.r * a.dilation_h + a.pad_h + a.h > kHalfInt ||
      a.q * a.stride_w + a.s * a.dilation_w + a.pad_w + a.w > kHalfInt) {
    return false;
  }
  const int64_t rows = a.n * a.p * a.q < chunk_rows(a) ? a.n * a.p * a.q : chunk_rows(a);
  return (rows + a.k) * (packed_k(a) / 8 + 1) <= INT32_MAX;  // threads: 2 per 16 columns
}

// The GEMM on output rows [row0, row0 + rows) with A and B at the given addresses
static inline CoGemmArgs gemm_args(const CoConvArgs& a, int64_t row0, int64_t rows, const void* A,
                                   const void* B, void* ws, int64_t ws_bytes) {
  const int64_t kk = kIm2col ? packed_k(a) : a.c;
  CoGemmArgs g{};
  g.a = A;
  g.b = B;
  g.bias = a.bias;
  g.c = a.residual == nullptr ? nullptr : static_cast<const Element*>(a.residual) + row0 * a.k;
  g.d = static_cast<Element*>(a.y) + row0 * a.k;
  g.m = rows;
  g.n = a.k;
  g.k = kk;
  g.l = 1;
  g.lda = kk;
  g.ldb = kk;
  g.ldc = a.k;
  g.ldd = a.k;
  g.batch_stride_a = rows * kk;
  g.batch_stride_b = a.k * kk;
  g.batch_stride_c = rows * a.k;
  g.batch_stride_d = rows * a.k;
  g.workspace = ws;
  g.workspace_bytes = ws_bytes;
  g.raster_order = ${raster_order};   // the kernel's launch knobs (ConvKernel.launch; prelude.h codes)
  g.swizzle = ${swizzle};
  g.splits = ${splits};
  g.decomposition = ${decomposition};
  g.pdl = kPdl;
  return g;
}

// The GEMM's own workspace: the most any chunk needs (a full one and the last)
static inline int64_t gemm_workspace(const CoConvArgs& a, int64_t m, int64_t chunk) {
  int64_t need = gemm::workspace_size(gemm_args(a, 0, m < chunk ? m : chunk, nullptr, nullptr, nullptr, 0));
  if (m > chunk && m % chunk != 0) {
    int64_t last = gemm::workspace_size(gemm_args(a, 0, m % chunk, nullptr, nullptr, nullptr, 0));
    need = last > need ? last : need;
  }
  return need;
}

static inline int64_t a_part(const CoConvArgs& a, int64_t m) {
  const int64_t rows = m < chunk_rows(a) ? m : chunk_rows(a);
  return kIm2col ? round_up(rows * packed_k(a) * int64_t(sizeof(Element)), kPartAlign) : 0;
}
static inline int64_t b_part(const CoConvArgs& a) {
  return kIm2col && !filter_is_b(a) ? round_up(a.k * packed_k(a) * int64_t(sizeof(Element)), kPartAlign) : 0;
}

int64_t workspace_size(const CoConvArgs& args) {
  if (!args_ok(args) || args.n == 0) {
    return 0;
  }
  const int64_t m = args.n * args.p * args.q;
  const int64_t chunk = kIm2col ? chunk_rows(args) : m;
  return a_part(args, m) + b_part(args) + gemm_workspace(args, m, chunk);
}

int run(const CoConvArgs& args, cudaStream_t stream) {
  if (!args_ok(args)) {
    return CO_CANNOT_IMPLEMENT;
  }
  if (args.n == 0) {
    return CO_OK;  // empty output: nothing to launch
  }
  if (args.x == nullptr || args.filter == nullptr || args.y == nullptr${operand_check}) {
    return CO_CANNOT_IMPLEMENT;
  }
  char* ws = static_cast<char*>(args.workspace);
  const int64_t m = args.n * args.p * args.q;
  if (!kIm2col) {  // gemm::run checks its own workspace
    return gemm::run(gemm_args(args, 0, m, args.x, args.filter, ws, args.workspace_bytes), stream);
  }
  // the pack's parts here; what is left is the GEMM's, which gemm::run checks, so no
  // GEMM workspace query runs on this path (each one builds the GEMM's arguments)
  const int64_t chunk = chunk_rows(args), a_bytes = a_part(args, m), b_bytes = b_part(args);
  if (args.workspace == nullptr || args.workspace_bytes < a_bytes + b_bytes) {
    return CO_WORKSPACE_TOO_SMALL;
  }
  if (args.c % 8 == 0 && !aligned16(args.x)) {
    return CO_CANNOT_IMPLEMENT;  // the pack reads 8 channels of x as one 16-byte load
  }
  Element* A = reinterpret_cast<Element*>(ws);
  const bool in_place = filter_is_b(args);
  if (in_place && !aligned16(args.filter)) {
    return CO_CANNOT_IMPLEMENT;  // TMA reads B: a 16-byte aligned base
  }
  const Element* B = in_place ? static_cast<const Element*>(args.filter)
                              : reinterpret_cast<const Element*>(ws + a_bytes);
  for (int64_t row0 = 0; row0 < m; row0 += chunk) {
    const int64_t rows = m - row0 < chunk ? m - row0 : chunk;
    const co_im2col::Geometry geo{args.n, args.h, args.w, args.c, args.k, args.r, args.s,
                                  args.p, args.q, args.pad_h, args.pad_w, args.stride_h,
                                  args.stride_w, args.dilation_h, args.dilation_w,
                                  packed_k(args), row0, rows, row0 == 0 && !in_place ? args.k : 0};
    const int64_t work = (rows + geo.b_rows) * (geo.kp / 16 + geo.kp % 16 / 8) * 2;  // threads
    const int64_t blocks = (work + 255) / 256;
    // a grid-stride loop past 65536 blocks
    co_im2col::pack<Element><<<unsigned(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
        static_cast<const Element*>(args.x), static_cast<const Element*>(args.filter), A,
        const_cast<Element*>(B), geo);  // B written only where b_rows > 0 (not in place)
    if (cudaGetLastError() != cudaSuccess) {
      return CO_LAUNCH_FAILED;
    }
    // chunks run one after another on the stream: the next pack waits for this GEMM
    const int status = gemm::run(gemm_args(args, row0, rows, A, B, ws + a_bytes + b_bytes,
                                           args.workspace_bytes - a_bytes - b_bytes), stream);
    if (status != CO_OK) {
      return status;
    }
  }
  return CO_OK;
}

}  // namespace ${name}
""")


def gemm_kernel(kernel: ConvKernel) -> GemmKernel:
    """The GEMM a lowered conv kernel runs: its config and epilogue, B K-major,
    16-byte alignments throughout (the pack kernel's outputs, or C and K % 8)."""
    return GemmKernel(arch=kernel.arch, dtype=kernel.dtype, layout_b="col", align_a=8, align_b=8,
                      align_c=8, epilogue=kernel.epilogue, config=kernel.config)


def _launch_codes(launch: GemmLaunch) -> dict:
    """CoGemmArgs' launch knob codes (prelude.h) for ``launch``."""
    return {"raster_order": str(RASTER_ORDERS.index(launch.raster)), "swizzle": str(launch.swizzle),
            "splits": str(launch.splits),
            "decomposition": str(DECOMPOSITIONS.index(launch.decomposition))}


def validate(kernel: ConvKernel) -> None:
    """Raise ValueError unless ``kernel`` is a buildable lowered conv: family
    cutlass3x_sm90, iterator "direct" or "im2col", f16/bf16, K-side alignment 8,
    no per-channel residual (the GEMM epilogue's residual is a full tensor),
    direct with alignments 8 on x and the filter, and a config the sm90 GEMM
    family can build (gemm_sm90.validate)."""
    if kernel.iterator not in ITERATORS:
        raise ValueError(f"conv_gemm_sm90 lowers iterators {ITERATORS}, got {kernel.iterator!r}")
    if kernel.dtype not in ("f16", "bf16"):
        raise ValueError(f"convs lowered onto the sm90 GEMM are f16 or bf16, got {kernel.dtype!r}")
    if kernel.align_c != 8:
        raise ValueError(f"align_c must be 8 (K % 8 == 0: 16-byte rows of y), got {kernel.align_c}")
    if kernel.iterator == "direct" and (kernel.align_a, kernel.align_b) != (8, 8):
        raise ValueError("the direct lowering reads x and the filter as the GEMM's A and B: "
                         f"alignments must be 8, got {kernel.align_a}, {kernel.align_b}")
    if kernel.epilogue.residual_broadcast:
        raise ValueError("a per-channel residual is not a GEMM source; the TMA conv takes it")
    if kernel.stride_support != "strided":
        raise ValueError("stride_support must be 'strided' (stride is a run-time argument)")
    gemm_sm90.validate(gemm_kernel(kernel))


def emit(kernel: ConvKernel) -> KernelSource:
    """The ``KernelSource`` of one lowered conv (see the module docstring).

    Raises ValueError for a kernel this lowering cannot build (``validate``)."""
    validate(kernel)
    gk = gemm_kernel(kernel)
    inner = gemm_sm90.values(gk)
    inner["name"] = "gemm"
    ep = kernel.epilogue
    check = " || !aligned16(args.bias)" if ep.bias else ""
    code = TEMPLATE.substitute(
        name=kernel.name, iterator=kernel.iterator,
        semantics=semantics(ep, "conv(x, filter)", "bias[k]", "residual"),
        gemm_code=gemm_sm90.template_for(gk).substitute(inner), element=ELEMENT[kernel.dtype][0],
        im2col="true" if kernel.iterator == "im2col" else "false",
        chunk_bytes=str(IM2COL_CHUNK_BYTES), chunk_rows=str(CHUNK_ROW_MULTIPLE),
        operand_check=check, **_launch_codes(kernel.launch))
    # the pack kernel is named in run() either way (a branch on a constexpr)
    return KernelSource(name=kernel.name, includes=gemm_sm90.includes(gk),
                        code=(gemm_sm90.code_headers(gk) + sm90_parts.wgmma_selector(gk) + _PACK
                              + "\n" + code),
                        args_type="CoConvArgs", defines=gemm_sm90.defines(gk),
                        preamble=gemm_sm90.preamble(gk))

