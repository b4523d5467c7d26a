"""Emit CUTLASS's memory-efficient fused multi-head attention forward kernel.

The kernel is ``AttentionKernel`` of the nvidia-cutlass wheel's
``examples/41_fused_multi_head_attention/kernel_forward.h`` (the xFormers /
PyTorch "mem-efficient" SDPA kernel, CUTLASS 2.x warp-level MMA, ArchTag Sm80:
it runs on sm_80 and later and is compiled for sm_80 and sm_90a alike). On
sm_90a, ``choose`` takes the Hopper kernel of emit/attention_sm90.py (examples/88,
TMA warp-specialized) for the problems it supports (f16 / bf16, no bias, one head
dim that is a multiple of 8 up to 256, static seq_q % 8 == 0, no mask or top-left
causal) and this kernel for the rest. It is
included from the wheel, never copied: ``extra_include_dirs()`` gives the
folders the compile command needs.

Per (batch, head, block of kQueriesPerBlock queries) the kernel computes
``out = softmax(scale * q @ k^T + bias, causal mask) @ v`` with an online
softmax over blocks of kKeysPerBlock keys, fp32 accumulation.

Template parameters (``AttentionKernel`` fields, chosen like PyTorch's sm80
dispatch, aten/.../mem_eff_attention/kernels/cutlassF.h):

* kQueriesPerBlock x kKeysPerBlock, kMaxK (upper bound of both head dims):
  64x64 k64 and 64x128 k128 keep the output in registers
  (kSingleValueIteration = kMaxK <= kKeysPerBlock, "rf"); 32x128 k65536
  ("gmem") loops over head_dim_v in blocks of 128 and keeps the running output
  in an fp32 buffer in global memory: the caller's workspace for f16/bf16
  (``workspace_size`` > 0), the output itself for f32.
* isAligned: Q/K/V read 16 bytes at a time (8 elements of f16/bf16) or, not
  aligned, 4 elements (``DefaultGemmType::kMinimumAlignment`` = 4 for 16-bit
  and f32 tensor cores, gemm_kernel_utils.h). f32 has one kernel (4 both ways).
* kSupportsBias: an additive bias tile is loaded per (query block, key block).
  kSupportsDropout is always false (inference; the dropout code is compiled
  only with HAS_PYTORCH anyway).
* The causal mask is NOT a template parameter: ``Params::custom_mask_type``
  (NoCustomMask / CausalFromTopLeft / CausalFromBottomRight) is a runtime
  argument, so one kernel serves all three masks (``CoAttentionArgs.causal``).

Layouts (kernel_forward.h Params / advance_to_block): Q, K, V are BMHK with
every stride a runtime argument: batch (int64), sequence and head (int32 in
Params), head_dim contiguous. Any non-negative stride works (0 broadcasts, e.g.
one K/V head shared by every query head), so PyTorch's (B, H, L, E) tensors
are passed as they are. Grouped-query attention (``kernel.kv_group`` = G query
heads per K/V head, compiled in): ``co_attention_kernel`` offsets K and V by head / G
times their (per K/V head) head stride, so they are read in place. The output is BMHK with only the sequence stride
free: its head stride is head_dim_v and its batch stride seq_q * seq stride
(hard-coded in advance_to_block). The bias is (B, H, Mq, Nk) with batch / head
(int64) and query (int32) strides, 0 = broadcast, key stride 1.

Restrictions found in kernel_forward.h (and its iterators), all checked by the
emitted ``run`` (CO_CANNOT_IMPLEMENT) and, where static, by ``choose``:

* Vector accesses are predicated on their FIRST element only (CUTLASS 2.x
  PredicatedTileAccessIterator and epilogue PredicatedTileIterator), so a
  vector straddling the end of a row is read / written whole: head_dim and
  head_dim_v must be multiples of the Q/K/V access width (8 aligned, 4 not
  aligned) and head_dim_v of the output access (4 elements: the epilogue's
  LinearCombination<float, 4>). Head dims that are not multiples of 4 are
  refused; PyTorch's SDPA pads them to a multiple of 8 for the same kernel.
* ``check_supported`` checks V only against kAlignmentV = 1, but the aligned
  kernel reads V 8 at a time (MM1::kAlignmentB): ``run`` checks the real one.
  It never checks the batch strides; ``run`` does.
* The bias is always loaded in 16-byte vectors (TileSmemLoader with
  128 / sizeof_bits elements, even in the not-aligned kernel), predicated on the
  first element: pointer and bias strides must be multiples of 16 bytes and
  every bias row readable up to round_up(seq_kv, 8) (f32: 4) elements
  (``bias_kv_capacity``; xFormers pads its bias the same way).
* int32 arithmetic in advance_to_block / the key loop: seq_q, seq_kv, the
  sequence and head strides, seq_kv * k/v seq stride, heads * head strides,
  seq_q * bias query stride, batch * seq_q and heads * head_dim_v must fit in
  int32; batch and heads <= 65535 (grid z / y).
* Bottom-right causal computes ``num_keys - num_queries`` in uint32: seq_q must
  not exceed seq_kv (rows would see no key).
* K and V head strides 0 (one K/V head for all query heads) make
  advance_to_block take a shortcut that treats heads as queries in every block
  left with one query: not only for seq_q == 1 but in the last query block when
  seq_q % kQueriesPerBlock == 1 (seq_q = 33, 65, ...), since it tests the block's
  remaining queries. The shortcut drops the mask (wrong for top-left causal
  with seq_kv > seq_q), keeps the bias query stride (wrong for a bias that
  varies by query or head; fixed upstream later) and processes kQueriesPerBlock
  heads per block from a block start with ``num_queries = num_heads`` (reads /
  writes past the last head when heads > kQueriesPerBlock and not a multiple of
  it). So the kernel is launched through ``co_attention_kernel`` (in the
  emitted code), which gives advance_to_block a nonzero stand-in K head stride
  where the real K and V head strides are both 0 and removes the stand-in's
  offset after it: the shortcut never fires. ``run`` remaps seq_q == 1 itself,
  correctly, before launching (top-left causal with one query becomes
  seq_kv = 1).
* Scale: the kernel multiplies the logits by the scale (before the bias when it
  supports one) and tracks the row maximum with ``atomicMaxFloat``, which uses
  integer atomicMax for ``value >= 0`` and unsigned atomicMin otherwise. -0.0
  passes ``>= 0`` but is INT_MIN as an int, so it never replaces the initial
  -inf: a row whose logits in a key block are all -0.0 keeps max = -inf and
  exp2(0 - (-inf)) = inf gives NaN (or, with a bias, drops that block). With
  scale <= 0, an all-zero query row (padding) hits exactly that, so only
  finite scales > 0 are taken (PyTorch's default 1/sqrt(E) is); for a negative
  scale negate Q (or K) and pass -scale. Positive scales are safe in practice:
  q.k = +0 times scale > 0 is +0; only a negative q.k whose product with the
  scale underflows (|scale * q.k| < 1.4e-45) becomes -0.0, and it matters only
  if every logit of a row in a key block does. Fully masked rows give
  0/0 = NaN, as in PyTorch's math path.
* f32 runs on tensor cores as 3xTF32 (OpMultiplyAddFastF32), close to fp32.
* Launch: dynamic shared memory is sizeof(SharedStorage) (18.5 KiB for 64x64,
  51 KiB for 64x128 and 32x128 f16/bf16, up to 84 KiB f32); ``run`` raises the
  kernel's limit once per device when above 48 KiB and returns
  CO_CANNOT_IMPLEMENT if the device cannot give it.

kernel_forward.h includes ``<curand_kernel.h>`` unconditionally (used only for
dropout with HAS_PYTORCH). A CUDA toolkit without cuRAND headers (e.g. a bare
nvcc install) needs an empty stand-in: ``compat_headers()``, committed in
``templates/compat`` (``compat_dir()``; ``write_compat_headers(dir)`` writes them
elsewhere), passed with ``-Xcompiler=-idirafter,<dir>`` so a real cuRAND header,
when present, still wins (``include_flags``; build/toolchain.py adds it).
"""
from __future__ import annotations

from pathlib import Path
from string import Template
from typing import Optional

from ..dtypes import CPP
from .. import abi
from ..cutlass_source import cutlass_root
from ..families.attention import (  # noqa: F401 - choose / supports / workspace_bytes re-exported
    DTYPES, FAMILY, TILES, choose, config_for, supports, workspace_bytes)
from ..ir import (BIAS_BROADCAST_DIMS, CAUSAL, CAUSAL_CODE, AttentionProblem,  # noqa: F401
                  AttentionKernel, KernelSource)

_OUTPUT_ACCESS = 4        # epilogue LinearCombination<float, 128 / 32>

TEMPLATES = Path(__file__).parent / "templates"
COMPAT_DIR = TEMPLATES / "compat"
KERNEL_HEADER = "41_fused_multi_head_attention/kernel_forward.h"

# Field order of struct CoAttentionArgs (templates/prelude.h): the C ABI module's
ARGS_FIELDS = abi.ARGS_FIELDS["CoAttentionArgs"]


# ---------------------------------------------------------------------------
# Include paths
# ---------------------------------------------------------------------------

def extra_include_dirs() -> tuple:
    """Folders to add with ``-I`` (after CUTLASS's include/ and tools/util/include)
    when compiling an attention kernel: the wheel's ``examples`` folder, from which
    the kernel is included as ``41_fused_multi_head_attention/kernel_forward.h`` (its
    own relative includes resolve from there; the example's generic folder names
    such as ``gemm/`` stay off the search path). struct CoAttentionArgs is in
    prelude.h. Raises ToolchainError without the wheel."""
    examples = cutlass_root() / "examples"
    return (str(examples),)


def compat_dir() -> str:
    """The package's folder of stand-in headers (``compat_headers()``, committed as
    files), for ``-Xcompiler=-idirafter,<dir>`` (build/toolchain.py passes it to
    every CUTLASS compile)."""
    return str(COMPAT_DIR)


def compat_headers() -> dict:
    """{file name: text} of empty stand-ins for headers kernel_forward.h includes
    but does not use without HAS_PYTORCH (cuRAND: dropout only)."""
    return {"curand_kernel.h": "// cutlass_offload stand-in: kernel_forward.h includes cuRAND "
                               "only for dropout (HAS_PYTORCH).\n#pragma once\n"}


def write_compat_headers(directory) -> str:
    """Write ``compat_headers()`` into ``directory`` (created); return its path.
    Pass it with ``-Xcompiler=-idirafter,<dir>`` (searched after the system
    folders, so the toolkit's own cuRAND header wins when it exists)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in compat_headers().items():
        p = d / name
        if not p.is_file() or p.read_text() != text:
            p.write_text(text)
    return str(d)


def include_flags(compat_dir: Optional[str] = None) -> list:
    """nvcc flags for an attention translation unit: ``-I`` for each of
    ``extra_include_dirs()`` and, with ``compat_dir`` (see write_compat_headers;
    no commas in the path), the after-system-headers fallback folder."""
    flags = []
    for d in extra_include_dirs():
        flags += ["-I", d]
    if compat_dir:
        if "," in compat_dir:
            raise ValueError(f"-Xcompiler splits on commas: {compat_dir!r}")
        flags.append(f"-Xcompiler=-idirafter,{compat_dir}")
    return flags


# ---------------------------------------------------------------------------
# Validation and emission
# ---------------------------------------------------------------------------

def check(kernel: AttentionKernel) -> None:
    """Raise ValueError unless ``kernel`` is an instantiation this module emits."""
    cfg = kernel.config
    if cfg.family != FAMILY:
        raise ValueError(f"attention kernels are {FAMILY}, got family {cfg.family!r}")
    if tuple(cfg.tile) not in TILES:
        raise ValueError(f"attention tile (kQueriesPerBlock, kKeysPerBlock, kMaxK) must be "
                         f"one of {TILES}, got {tuple(cfg.tile)}")
    if cfg != config_for(kernel.dtype, cfg.tile):
        raise ValueError(f"the kernel fixes warp (32, 32, 32), instruction (16, 8, 8) and "
                         f"stages {config_for(kernel.dtype, cfg.tile).stages} for "
                         f"{kernel.dtype}; got {cfg}")
    if kernel.dtype == "f32" and not kernel.aligned:
        raise ValueError("f32 has a single access width (4 elements): use aligned=True")


_KERNEL = """\
// ${name}: fused multi-head attention forward, CUTLASS examples/41 AttentionKernel
// ${semantics}
namespace ${name} {

using Attention = AttentionKernel<
    ${element}, cutlass::arch::Sm80,
    /*isAligned=*/${aligned}, /*kQueriesPerBlock=*/${queries}, /*kKeysPerBlock=*/${keys},
    /*kMaxK=*/${max_k}, /*kSupportsDropout=*/false, /*kSupportsBias=*/${bias}>;
using Element = typename Attention::scalar_t;
using Accum = typename Attention::output_accum_t;

static_assert(Attention::kSingleValueIteration == ${single}, "rf / gmem variant");
static_assert(Attention::kNeedsOutputAccumulatorBuffer == ${needs_workspace}, "workspace");
static_assert(Attention::kAlignmentQ == ${access} && Attention::kAlignmentK == ${access} &&
              Attention::MM1::kAlignmentB == ${access}, "Q/K/V access width");

constexpr int64_t kMaxK = Attention::kMaxK;
constexpr int64_t kAlignQK = Attention::kAlignmentQ;
// kernel_forward.h checks V against kAlignmentV = 1, but MM1 reads it kAlignmentB at a time.
constexpr int64_t kAlignV = Attention::MM1::kAlignmentB;
constexpr int64_t kAlignOut = Attention::MM1::OutputTileIterator::kElementsPerAccess;
constexpr int64_t kAlignAccum = Attention::MM1::OutputTileIteratorAccum::kElementsPerAccess;
// MM0::BiasLoader reads 128-bit vectors whatever isAligned says.
constexpr int64_t kAlignBias = 128 / cutlass::sizeof_bits<Element>::value;
// The fp32 running output lives in the output itself (f32 "gmem" kernels).
constexpr bool kAccumulatesInOutput =
    !Attention::kKeepOutputInRF && !Attention::kNeedsOutputAccumulatorBuffer;
constexpr int kSmemBytes = int(sizeof(typename Attention::SharedStorage));
constexpr int64_t kInt32Max = INT32_MAX;
constexpr int64_t kGridMax = 65535;

static bool fits32(int64_t x) { return x >= 0 && x <= kInt32Max; }
static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static bool ptr_aligned(const void* p, int64_t elems, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % uintptr_t(elems * bytes) == 0;
}
// A Q/K/V operand: non-null, aligned pointer, non-negative strides that are multiples
// of the access width, seq / head strides within int32 (Params fields).
static bool operand_ok(const void* p, int64_t sb, int64_t ss, int64_t sh, int64_t align) {
  return p != nullptr && ptr_aligned(p, align, sizeof(Element)) && sb >= 0 &&
         sb % align == 0 && ss % align == 0 && sh % align == 0 && fits32(ss) && fits32(sh);
}
static bool empty(const CoAttentionArgs& a) {
  return a.batch == 0 || a.heads == 0 || a.seq_q == 0;
}
// One query, one K/V head shared by every query head: heads are run as queries.
static bool heads_as_queries(const CoAttentionArgs& a) {
  return a.seq_q == 1 && a.heads > 1 && a.k_stride_head == 0 && a.v_stride_head == 0;
}
static int64_t accum_bytes(const CoAttentionArgs& a) {
  return Attention::kNeedsOutputAccumulatorBuffer
             ? a.batch * a.seq_q * a.heads * a.head_dim_v * int64_t(sizeof(Accum))
             : 0;
}

// Every restriction of kernel_forward.h (see emit/attention.py) but the workspace.
static bool supported(const CoAttentionArgs& a) {
  if (a.batch < 0 || a.heads < 0 || a.seq_q < 0) return false;
  if (a.seq_kv < 1 || a.head_dim < 1 || a.head_dim_v < 1) return false;
  if (a.head_dim > kMaxK || a.head_dim_v > kMaxK) return false;
  if (a.batch > kGridMax || a.heads > kGridMax || !fits32(a.seq_q) || !fits32(a.seq_kv)) return false;
  if (a.head_dim % kAlignQK || a.head_dim_v % kAlignV || a.head_dim_v % kAlignOut) return false;
  if (!(a.scale > 0.0f) || !(a.scale < INFINITY)) return false;
  if (a.causal < 0 || a.causal > 2) return false;
  if (a.causal == 2 && a.seq_q > a.seq_kv) return false;
${group_check}  if (!operand_ok(a.q, a.q_stride_batch, a.q_stride_seq, a.q_stride_head, kAlignQK)) return false;
  if (!operand_ok(a.k, a.k_stride_batch, a.k_stride_seq, a.k_stride_head, kAlignQK)) return false;
  if (!operand_ok(a.v, a.v_stride_batch, a.v_stride_seq, a.v_stride_head, kAlignV)) return false;
  // int32 products in advance_to_block and the key loop
  if (!fits32(a.seq_kv * a.k_stride_seq) || !fits32(a.seq_kv * a.v_stride_seq)) return false;
  if (!fits32(a.heads * a.q_stride_head) || !fits32(a.heads * a.k_stride_head) ||
      !fits32(a.heads * a.v_stride_head)) return false;
  if (!fits32(a.batch * a.seq_q) || !fits32(a.heads * a.head_dim_v)) return false;
  if ((a.batch * a.seq_q) * (a.heads * a.head_dim_v) > (int64_t(1) << 59)) return false;
  // output: BMHK, head stride head_dim_v, batch stride seq_q * seq stride (kernel-fixed)
  if (a.out == nullptr || !ptr_aligned(a.out, kAlignOut, sizeof(Element))) return false;
  if (a.out_stride_head != a.head_dim_v) return false;
  if (a.out_stride_seq < a.heads * a.head_dim_v || a.out_stride_seq % kAlignOut ||
      !fits32(a.out_stride_seq)) return false;
  if (a.batch > 1 && a.out_stride_batch != a.seq_q * a.out_stride_seq) return false;
  if ((kAccumulatesInOutput || heads_as_queries(a)) &&
      a.out_stride_seq != a.heads * a.head_dim_v) return false;
  if (a.bias != nullptr) {
    if (!Attention::kSupportsBias) return false;
    if (!ptr_aligned(a.bias, kAlignBias, sizeof(Element))) return false;
    if (a.bias_stride_batch < 0 || a.bias_stride_head < 0 || a.bias_stride_query < 0) return false;
    if (a.bias_stride_batch % kAlignBias || a.bias_stride_head % kAlignBias ||
        a.bias_stride_query % kAlignBias) return false;
    if (!fits32(a.bias_stride_query) || !fits32(a.seq_q * a.bias_stride_query) ||
        !fits32(a.heads * a.bias_stride_head)) return false;
    const int64_t capacity = a.bias_kv_capacity > 0 ? a.bias_kv_capacity : a.seq_kv;
    if (capacity < round_up(a.seq_kv, kAlignBias)) return false;
  }
  return true;
}

// kernel_forward.h's attention_kernel_batched_impl with the K / V head offsets
// taken from the real head strides after advance_to_block, which added
// head * k_strideH / v_strideH: k_strideH may be a stand-in (make_params) that keeps
// its one-query shortcut from firing (see emit/attention.py).
template <typename AK>
__global__ void __launch_bounds__(AK::kNumThreads, AK::kMinBlocksPerSm)
    co_attention_kernel(typename AK::Params p, int64_t k_head_stride, int64_t v_head_stride) {
  const int64_t k_added = p.k_strideH, v_added = p.v_strideH;
  if (!p.advance_to_block()) {
    return;
  }
  const int64_t head = blockIdx.y;
${kv_head_offsets}
  AK::attention_kernel(p);
}

static typename Attention::Params make_params(const CoAttentionArgs& a) {
  typename Attention::Params p;
  p.query_ptr = static_cast<Element*>(const_cast<void*>(a.q));
  p.key_ptr = static_cast<Element*>(const_cast<void*>(a.k));
  p.value_ptr = static_cast<Element*>(const_cast<void*>(a.v));
  p.attn_bias_ptr = static_cast<Element*>(const_cast<void*>(a.bias));
  p.output_ptr = static_cast<Element*>(a.out);
  p.output_accum_ptr =
      Attention::kNeedsOutputAccumulatorBuffer ? static_cast<Accum*>(a.workspace) : nullptr;
  p.logsumexp_ptr = nullptr;
  p.scale = a.scale;
  p.head_dim = int32_t(a.head_dim);
  p.head_dim_value = int32_t(a.head_dim_v);
  p.num_batches = int32_t(a.batch);
  p.num_heads = int32_t(a.heads);
  p.num_queries = int32_t(a.seq_q);
  p.num_keys = int32_t(a.seq_kv);
  p.q_strideB = a.q_stride_batch;
  p.k_strideB = a.k_stride_batch;
  p.v_strideB = a.v_stride_batch;
  p.q_strideM = int32_t(a.q_stride_seq);
  p.k_strideM = int32_t(a.k_stride_seq);
  p.v_strideM = int32_t(a.v_stride_seq);
  p.q_strideH = int32_t(a.q_stride_head);
  p.k_strideH = int32_t(a.k_stride_head);
  p.v_strideH = int32_t(a.v_stride_head);
  p.o_strideM = int32_t(a.out_stride_seq);
  p.bias_strideB = a.bias_stride_batch;
  p.bias_strideH = a.bias_stride_head;
  p.bias_strideM = int32_t(a.bias_stride_query);
  p.custom_mask_type = a.causal == 1   ? Attention::CausalFromTopLeft
                       : a.causal == 2 ? Attention::CausalFromBottomRight
                                       : Attention::NoCustomMask;
  p.use_dropout = false;
  if (a.seq_q == 1) {
    // One query: top-left causal sees key 0 only, bottom-right every key.
    if (a.causal == 1) p.num_keys = 1;
    p.custom_mask_type = Attention::NoCustomMask;
    if (heads_as_queries(a)) {
      // The kernel's own shortcut for this case is wrong (see emit/attention.py):
      // do it here, with the bias and the block bounds right.
      p.num_queries = int32_t(a.heads);
      p.num_heads = 1;
      p.q_strideM = int32_t(a.q_stride_head);
      p.o_strideM = int32_t(a.head_dim_v);
      p.bias_strideM = int32_t(a.bias_stride_head);
      p.bias_strideH = 0;
    }
  }
  // Zero K and V head strides would let advance_to_block treat a block with one query
  // left as heads (its shortcut, which also drops the causal mask; see
  // emit/attention.py): a nonzero stand-in keeps it off, co_attention_kernel removes
  // its offset again.
  if (p.k_strideH == 0 && p.v_strideH == 0) p.k_strideH = int32_t(kAlignQK);
  return p;
}

// Raise the kernel's dynamic shared memory limit once per device (prelude.h).
static int prepare_smem() {
  static std::atomic<int> done[kCoMaxDevices];
  return co_opt_in_smem(co_attention_kernel<Attention>, kSmemBytes, done);
}

int64_t workspace_size(const CoAttentionArgs& args) {
  if (empty(args) || !supported(args)) return 0;
  return accum_bytes(args);
}

int run(const CoAttentionArgs& args, cudaStream_t stream) {
  if (args.batch < 0 || args.heads < 0 || args.seq_q < 0) return CO_CANNOT_IMPLEMENT;
  if (empty(args)) return CO_OK;  // empty output: nothing to launch
  if (!supported(args)) return CO_CANNOT_IMPLEMENT;
  const int64_t needed = accum_bytes(args);
  if (needed > 0) {
    if (args.workspace_bytes < needed) return CO_WORKSPACE_TOO_SMALL;
    if (args.workspace == nullptr || !ptr_aligned(args.workspace, kAlignAccum, sizeof(Accum)))
      return CO_CANNOT_IMPLEMENT;
  }
  typename Attention::Params p = make_params(args);
  if (!Attention::check_supported(p)) return CO_CANNOT_IMPLEMENT;
  const int status = prepare_smem();
  if (status != CO_OK) return status;
  co_attention_kernel<Attention><<<p.getBlocksGrid(), p.getThreadsGrid(), kSmemBytes, stream>>>(
      p, args.k_stride_head, args.v_stride_head);
  if (cudaGetLastError() != cudaSuccess) return CO_LAUNCH_FAILED;
  return CO_OK;
}

}  // namespace ${name}
"""


def values(kernel: AttentionKernel) -> dict:
    """The substitution dict of ``kernel``'s C++ (raises ValueError via ``check``)."""
    check(kernel)
    q, k, mk = kernel.config.tile
    bias = " + bias" if kernel.supports_bias else ""
    output = ("output in registers" if kernel.single_value_iteration
              else "fp32 output accumulated in global memory")
    group = f", query head h reads K/V head h / {kernel.kv_group}" if kernel.kv_group > 1 else ""
    semantics = (f"out = softmax(scale * q k^T{bias}, causal mask) v{group}; {kernel.dtype}, "
                 f"{'aligned' if kernel.aligned else 'not aligned'} "
                 f"({kernel.access}-element Q/K/V accesses), {output}")
    return {
        "name": kernel.name,
        "semantics": semantics,
        "element": CPP[kernel.dtype],
        "aligned": "true" if kernel.aligned else "false",
        "queries": q, "keys": k, "max_k": mk,
        "bias": "true" if kernel.supports_bias else "false",
        "single": "true" if kernel.single_value_iteration else "false",
        "needs_workspace": "true" if kernel.needs_workspace else "false",
        "access": kernel.access,
        # grouped-query attention: query head h reads K/V head h / G (the strides are per
        # K/V head); the G = 1 text is what it was before (those cache entries stay valid)
        "group_check": (f"  if (a.heads % {kernel.kv_group}) return false;   // whole K/V head groups\n"
                        if kernel.kv_group > 1 else ""),
        "kv_head_offsets": (
            "  p.key_ptr += head * (k_head_stride - k_added);\n"
            "  p.value_ptr += head * (v_head_stride - v_added);"
            if kernel.kv_group == 1 else
            f"  constexpr int64_t kKvGroup = {kernel.kv_group};   // query heads per K/V head\n"
            "  p.key_ptr += (head / kKvGroup) * k_head_stride - head * k_added;\n"
            "  p.value_ptr += (head / kKvGroup) * v_head_stride - head * v_added;"),
    }


INCLUDES = ("atomic", "cmath", "climits", KERNEL_HEADER)


def emit(kernel: AttentionKernel) -> KernelSource:
    """Return the KernelSource of one attention kernel.

    ``code`` defines ``namespace <kernel.name> { int64_t workspace_size(const
    CoAttentionArgs&); int run(const CoAttentionArgs&, cudaStream_t); }``;
    ``run`` checks every restriction (module docstring) and returns a CoStatus:
    CO_CANNOT_IMPLEMENT for an unsupported call, CO_WORKSPACE_TOO_SMALL, or
    CO_INIT_FAILED / CO_LAUNCH_FAILED from CUDA. ``includes`` need
    ``extra_include_dirs()`` on the include path (and, without cuRAND headers in
    the toolkit, ``compat_dir()`` after the system folders); struct
    CoAttentionArgs comes from prelude.h. Raises ValueError for an illegal kernel
    (see ``check``)."""
    code = Template(_KERNEL).substitute(values(kernel))
    return KernelSource(name=kernel.name, includes=INCLUDES, code=code,
                        args_type="CoAttentionArgs")
