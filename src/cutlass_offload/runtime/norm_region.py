"""The module that replaces one layer_norm / rms_norm region and calls the library.

The input (..., cols) is viewed as packed (rows, cols): a contiguous input is
passed as is, anything else is made contiguous for the call (counted in
``copies``). The output is a new contiguous tensor of the input's shape.
"""
from __future__ import annotations

import torch

from ..ir import NormKernel, NormRegion
from .library import CoNormArgs
from .ops import contiguous_strides
from .region import RegionModule


class AffineNormModule(RegionModule):
    """A norm region with optional per-feature weight and bias (``_iw`` / ``_ib``
    input positions; ``_features`` elements each)."""

    _features = 0

    @staticmethod
    def operand_nodes(region) -> tuple:
        return (("x", region.x), ("weight", region.weight), ("bias", region.bias))

    def _map_affine(self, xs, x, args, keep) -> bool:
        """Point ``args.weight`` / ``args.bias`` at the parameters (contiguous, aligned
        to the kernel's vector, of x's dtype and device; copied if not contiguous);
        False when one does not fit."""
        args.weight = args.bias = None
        for i, field in ((self._iw, "weight"), (self._ib, "bias")):
            if i is None:
                continue
            t = xs[i]
            if t.dtype != self._dtype or t.device != x.device or t.numel() != self._features:
                return False
            t = t.reshape(-1)
            if not t.is_contiguous():
                t = t.contiguous()
            if not self._aligned(t.data_ptr(), self.kernel.vec):
                return False
            setattr(args, field, t.data_ptr())
            keep.append(t)
        return True

    def _affine_operands(self, x_field: str) -> tuple:
        """``_operands`` of a norm region: x, then the affine vectors it has."""
        return tuple((i, f) for i, f in ((self._ix, x_field), (self._iw, "weight"), (self._ib, "bias"))
                     if i is not None)

    def _affine_direct(self, xs, args) -> bool:
        """Cached path: point ``args.weight`` / ``args.bias`` at this call's vectors
        (read in place when the signature was cached); False when one is not aligned."""
        vec = self.kernel.vec
        if self._iw is not None:
            args.weight = xs[self._iw].data_ptr()
            if not self._aligned(args.weight, vec):
                return False
        if self._ib is not None:
            args.bias = xs[self._ib].data_ptr()
            if not self._aligned(args.bias, vec):
                return False
        return True

    _out_field = "output"

    def _fast_operands(self):
        al = self.kernel.vec * self._esize
        return tuple((i, f, al) for i, f in self._operands)

    def _fast_out_align(self) -> int:
        return self.kernel.vec * self._esize

    def _map_direct(self, xs, args, shape):
        """A cached signature: new input / affine / output pointers, alignment checked."""
        x = xs[self._ix]
        vec = self.kernel.vec
        args.input = x.data_ptr()
        if not (self._aligned(args.input, vec) and self._affine_direct(xs, args)):
            return None
        out = torch.empty(shape, dtype=self._dtype, device=x.device)
        args.output = out.data_ptr()
        if not self._aligned(args.output, vec):
            return None
        return self._view(out), args, []

    def _view(self, out):
        """The region's output as PyTorch sees it, from the buffer the kernel writes."""
        return out


class NormRegionModule(AffineNormModule):
    """A norm region: ``roles`` maps "x", "weight", "bias" to input positions.

    A call runs PyTorch instead (``_map`` returns None) when the input is not of
    the kernel's dtype, its last dim is not the compiled cols, it is empty, the
    affine vectors do not fit, or a pointer is not aligned to the kernel's vector.
    """

    def __init__(self, region: NormRegion, kernel: NormKernel, fallback: torch.fx.GraphModule,
                 roles: dict, library_getter):
        super().__init__(region, kernel, fallback, library_getter)
        self._ix = roles["x"]
        self._iw, self._ib = roles.get("weight"), roles.get("bias")
        self.primary = self._ix
        self._cols = self._features = region.problem.cols
        self._eps = region.problem.eps
        self.copies = 0          # non-contiguous inputs made contiguous, over all calls
        self._operands = self._affine_operands("input")

    def _ws_key(self, args) -> tuple:
        return (args.rows, args.cols)

    def _out_shape(self, out, args) -> tuple:
        return tuple(out.shape)

    def output_strides(self, shape) -> tuple:
        """The strides of this module's output of ``shape`` (a fresh row-major tensor)."""
        return contiguous_strides(shape)

    def _map_general(self, xs):
        x = xs[self._ix]
        if x.dtype != self._dtype or x.dim() < 1 or x.shape[-1] != self._cols:
            return None
        rows = x.numel() // self._cols
        if rows == 0:
            return None
        copied = not x.is_contiguous()
        if copied:
            x = x.contiguous()
        keep = [x]
        args = CoNormArgs()
        if not self._map_affine(xs, x, args, keep):
            return None
        out = torch.empty(x.shape, dtype=self._dtype, device=x.device)
        args.input, args.output = x.data_ptr(), out.data_ptr()
        if not (self._aligned(args.input, self.kernel.vec) and self._aligned(args.output, self.kernel.vec)):
            return None
        args.rows, args.cols, args.eps = rows, self._cols, self._eps
        self.copies += copied
        return out, args, keep
