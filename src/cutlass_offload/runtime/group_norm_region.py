"""The module that replaces one group_norm (+ SiLU) region and calls the library.

The graph is NCHW (PyTorch's logical layout); the kernel runs NHWC. A
channels_last input (``x.permute(0, 2, 3, 1)`` contiguous) is passed as is,
anything else is converted for the call and counted in ``layout_conversions``
(as ConvRegionModule does, so CompiledModel.layout_conversions() sees both). The
output is allocated NHWC and returned as an NCHW view in channels_last memory
format, so the conv that usually follows needs no conversion (PyTorch's own
group_norm hands back an NCHW-contiguous tensor for a channels_last CUDA input).
"""
from __future__ import annotations

import torch

from ..ir import GroupNormKernel, GroupNormRegion
from .conv_region import nhwc
from .library import CoGroupNormArgs
from .norm_region import AffineNormModule
from .ops import channels_last_strides


class GroupNormRegionModule(AffineNormModule):
    """A group_norm region: ``roles`` maps "x", "weight", "bias" to input positions.

    A call runs PyTorch instead (``_map`` returns None) when the input is not a
    4-D tensor of the kernel's dtype with the compiled (C, H, W), the batch is
    empty, an affine vector does not fit, or a pointer is not aligned to the
    kernel's vector.
    """

    def __init__(self, region: GroupNormRegion, kernel: GroupNormKernel,
                 fallback: torch.fx.GraphModule, roles: dict, library_getter):
        super().__init__(region, kernel, fallback, library_getter)
        self._ix = roles["x"]
        self._iw, self._ib = roles.get("weight"), roles.get("bias")
        self.primary = self._ix
        p = region.problem
        self._chw = (p.c, p.h, p.w)
        self._features = p.c
        self._groups, self._eps = p.groups, p.eps
        self.layout_conversions = 0      # inputs copied to NHWC, over all calls
        self._operands = self._affine_operands("input")

    def _ws_key(self, args) -> tuple:
        return (args.n,)

    def _out_shape(self, out, args) -> tuple:
        return (args.n, args.h, args.w, args.c)          # NHWC

    def _view(self, out):
        return out.permute(0, 3, 1, 2)       # NHWC buffer -> channels_last NCHW

    def output_strides(self, shape) -> tuple:
        """The strides of this module's (N, C, H, W) output: channels_last (NHWC memory)."""
        return channels_last_strides(shape)

    def _map_general(self, xs):
        x = xs[self._ix]
        if x.dtype != self._dtype or x.dim() != 4 or tuple(x.shape[1:]) != self._chw:
            return None
        n = x.shape[0]
        if n == 0:
            return None
        c, h, w = self._chw
        xn, converted = nhwc(x)
        keep = [xn]
        args = CoGroupNormArgs()
        if not self._map_affine(xs, x, args, keep):
            return None
        out = torch.empty((n, h, w, c), dtype=self._dtype, device=x.device)
        args.input, args.output = xn.data_ptr(), out.data_ptr()
        vec = self.kernel.vec
        if not (self._aligned(args.input, vec) and self._aligned(args.output, vec)):
            return None
        args.n, args.h, args.w, args.c, args.groups = n, h, w, c, self._groups
        args.eps = self._eps
        self.layout_conversions += converted
        return out.permute(0, 3, 1, 2), args, keep
