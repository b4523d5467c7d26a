"""What the CUTLASS 2.x (``cutlass2x_sm80``) GEMM and conv emitters share.

gemm_sm80.py and conv_sm80.py instantiate the same mainloop building blocks and
the same two epilogues, D = post(residual_op(activation(acc + bias), C)):

* no residual: ``LinearCombinationGeneric``, ``act(alpha * acc + C)`` with the
  bias broadcast through the source C (ScaleType::NoBetaScaling), or no source
  at all without a bias (ScaleType::OnlyAlphaScaling);
* residual: ``LinearCombinationResidualBlock``,
  ``post(binary(act(alpha * acc + vector), beta * C))`` with the bias as the
  broadcast vector (a null vector pointer loads zeros).

Both wrap the activation in ``RoundedActivation``: PyTorch runs the region's ops
one at a time and rounds each result to the tensor dtype, so the epilogue rounds
``acc + bias`` and the activation's output to ElementOutput as well. The fused
result then has PyTorch's inf / NaN pattern under fp16 overflow (gelu(-inf) and
silu(-inf) are NaN, inf - x stays inf, inf * 0 is NaN) instead of finite values
computed from an fp32 intermediate that PyTorch never had. The conversions are
CUTLASS's round-to-nearest ``NumericArrayConverter`` (no saturation: overflow
gives inf, NaN stays NaN); for f32 they are the identity.

This module holds the element/functor tables, the epilogue type text and its
substitution values, the dtype/alignment/tile/shared-memory checks and the
known-good configurations; each emitter keeps its own operation, launcher and
the checks specific to it. See the emitters' docstrings for the rules.
"""
from __future__ import annotations

from ..dtypes import CPP
from ..families.sm80 import (  # noqa: F401 - the family's rules, re-exported for the emitters
    ALIGNMENTS, BYTES, FAMILY, INSTRUCTION, SMEM_LIMIT, check_alignments, check_smem,
    check_warp_tiling, config, cp_async_ok, known_configs)
from ..ir import GemmEpilogue
from .activations import FUNCTOR, HEAVY


ELEMENT = CPP
THREAD = "cutlass::epilogue::thread::"
# ir activation -> functor template (activations.py); the identity is a functor here
ACTIVATION = {a: f or THREAD + "Identity" for a, f in FUNCTOR.items()}
BINARY = {"add": "cutlass::plus", "mul": "cutlass::multiplies"}
POST = {"identity": THREAD + "Identity", "relu": THREAD + "ReLu"}

INCLUDES_COMMON = (
    "cutlass/cutlass.h",
    "cutlass/numeric_types.h",
    "cutlass/numeric_conversion.h",
    "cutlass/functional.h",
    "cutlass/epilogue/thread/activation.h",
)
INCLUDE_PLAIN_EPILOGUE = "cutlass/epilogue/thread/linear_combination_generic.h"
INCLUDE_RESIDUAL_EPILOGUE = "cutlass/epilogue/thread/linear_combination_residual_block.h"

# ---------------------------------------------------------------------------
# C++ templates (string.Template, substituted strictly)
# ---------------------------------------------------------------------------

# The activation as both epilogues call it, on a fragment Array<ElementCompute, N>:
# its input (alpha * acc + bias) and its output rounded to ElementOutput, where
# PyTorch's separate ops round them (see the module docstring). The post
# activation (relu) needs no rounding: relu commutes with round-to-nearest.
# The element and tile type aliases both 2.x emitters open with (layouts between them).
ELEMENT_TYPES = """\
using ElementA = ${element};
using ElementB = ${element};
using ElementOutput = ${element};
using ElementAccumulator = float;
using ElementCompute = float;
"""
TILE_TYPES = """\
using ThreadblockShape = cutlass::gemm::GemmShape<${tile_m}, ${tile_n}, ${tile_k}>;
using WarpShape = cutlass::gemm::GemmShape<${warp_m}, ${warp_n}, ${warp_k}>;
using InstructionShape = cutlass::gemm::GemmShape<${inst_m}, ${inst_n}, ${inst_k}>;
using Swizzle = cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>;
constexpr int kStages = ${stages};
constexpr int kAlignA = ${align_a};
constexpr int kAlignB = ${align_b};
constexpr int kAlignC = ${align_c};
"""

ROUNDED_ACTIVATION = """\
// PyTorch rounds each op's result to the tensor dtype (fp16: overflow -> inf);
// round acc + bias and the activation's output the same way, so the fused
// epilogue gives the same inf / NaN, not finite values PyTorch never computed.
template <typename Fragment>
struct RoundedActivation {
  static bool const kIsHeavy = ${is_heavy};
  CUTLASS_HOST_DEVICE
  Fragment operator()(Fragment const& x) const {
    using T = typename Fragment::Element;
    static constexpr int N = int(Fragment::kElements);
    cutlass::NumericArrayConverter<ElementOutput, T, N, cutlass::FloatRoundStyle::round_to_nearest> narrow;
    cutlass::NumericArrayConverter<T, ElementOutput, N, cutlass::FloatRoundStyle::round_to_nearest> widen;
    ${activation}<Fragment> act;
    return widen(narrow(act(widen(narrow(x)))));
  }
};
"""

# The EpilogueOp of the plain variant: D = act(alpha * acc + C), C = the broadcast bias.
EPILOGUE_PLAIN = ROUNDED_ACTIVATION + """\
// D = ${semantics}
using EpilogueOp = cutlass::epilogue::thread::LinearCombinationGeneric<
    RoundedActivation, ElementOutput, kAlignC, ElementAccumulator, ElementCompute,
    cutlass::epilogue::thread::ScaleType::${scale_type},
    cutlass::FloatRoundStyle::round_to_nearest, ${is_heavy}>;
"""

# The EpilogueOp of the residual variant: D = post(binary(act(alpha * acc + vector), beta * C)).
EPILOGUE_RESIDUAL = ROUNDED_ACTIVATION + """\
// D = ${semantics}
using EpilogueOp = cutlass::epilogue::thread::LinearCombinationResidualBlock<
    ElementOutput, ElementAccumulator, ElementCompute, ElementOutput, kAlignC,
    RoundedActivation, ${binary_op}, ${post_op}>;
"""

# The whole kernel: types, operation (epilogue + device op + arguments), launcher.
KERNEL = """\
// ${name}
namespace ${name} {

${types}
${operation}
${launcher}
}  // namespace ${name}
"""


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------

# ---------------------------------------------------------------------------
# Substitution values
# ---------------------------------------------------------------------------

def semantics(ep: GemmEpilogue, acc: str, source: str) -> str:
    """The epilogue as a formula, for the ``// D = ...`` comment; ``acc`` is the
    accumulator's name, ``source`` the residual's."""
    x = f"{acc} + bias" if ep.bias else acc
    if ep.activation != "identity":
        x = f"{ep.activation}({x})"
    if ep.residual != "none":
        x = f"{x} {'+' if ep.residual == 'add' else '*'} {source}"
    if ep.post_activation != "identity":
        x = f"{ep.post_activation}({x})"
    return x


def shape_values(kernel) -> dict:
    """Element, tile / warp / instruction shapes, stages and alignments of ``kernel``."""
    cfg = kernel.config
    return {
        "element": ELEMENT[kernel.dtype],
        "tile_m": cfg.tile[0], "tile_n": cfg.tile[1], "tile_k": cfg.tile[2],
        "warp_m": cfg.warp[0], "warp_n": cfg.warp[1], "warp_k": cfg.warp[2],
        "inst_m": cfg.instruction[0], "inst_n": cfg.instruction[1],
        "inst_k": cfg.instruction[2],
        "stages": cfg.stages,
        "align_a": kernel.align_a, "align_b": kernel.align_b, "align_c": kernel.align_c,
    }


def epilogue_values(ep: GemmEpilogue) -> dict:
    """Values of EPILOGUE_PLAIN / EPILOGUE_RESIDUAL and of the arguments built with them."""
    return {
        "activation": ACTIVATION[ep.activation],
        "is_heavy": "true" if ep.activation in HEAVY else "false",
        # Plain variant: bias broadcast through C, or no source at all.
        "scale_type": "NoBetaScaling" if ep.bias else "OnlyAlphaScaling",
        "beta": 1 if ep.bias else 0,
        "source_ptr": "args.bias" if ep.bias else "nullptr",
        # Residual variant.
        "binary_op": BINARY.get(ep.residual, ""),
        "post_op": POST[ep.post_activation],
        "vector_ptr": "const_cast<void*>(args.bias)" if ep.bias else "nullptr",
    }


# ---------------------------------------------------------------------------
# Known-good configurations
# ---------------------------------------------------------------------------
