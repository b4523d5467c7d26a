"""The module that replaces one layer_norm / rms_norm region and calls the library.

The input (..., cols) is viewed as packed (rows, cols): a contiguous input is
passed as is, anything else is made contiguous for the call (counted in
``copies``). The output is a new contiguous tensor of the input's shape.
"""
from __future__ import annotations

import torch

from ..ir import NormKernel, NormRegion
from .library import CoNormArgs
from .region import RegionModule


class NormRegionModule(RegionModule):
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
        self._cols = region.problem.cols
        self._eps = region.problem.eps
        self.copies = 0          # non-contiguous inputs made contiguous, over all calls

    def _ws_key(self, args) -> tuple:
        return (args.rows, args.cols)

    def _vector(self, xs, i, x):
        """The (cols,) parameter at input i, contiguous, or None when it does not fit."""
        t = xs[i]
        if t.dtype != self._dtype or t.device != x.device or t.numel() != self._cols:
            return None
        t = t.reshape(-1)
        if not t.is_contiguous():
            t = t.contiguous()
        return t if self._aligned(t.data_ptr(), self.kernel.vec) else None

    def _map(self, xs):
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
        args.weight = args.bias = None
        if self._iw is not None:
            w = self._vector(xs, self._iw, x)
            if w is None:
                return None
            args.weight = w.data_ptr()
            keep.append(w)
        if self._ib is not None:
            b = self._vector(xs, self._ib, x)
            if b is None:
                return None
            args.bias = b.data_ptr()
            keep.append(b)
        out = torch.empty(x.shape, dtype=self._dtype, device=x.device)
        args.input, args.output = x.data_ptr(), out.data_ptr()
        if not (self._aligned(args.input, self.kernel.vec) and self._aligned(args.output, self.kernel.vec)):
            return None
        args.rows, args.cols, args.eps = rows, self._cols, self._eps
        self.copies += copied
        return out, args, keep
