"""The module that replaces one conv2d region and calls the library.

The graph is NCHW (PyTorch's logical layout); the kernels run NHWC. A tensor
whose memory is channels_last is already NHWC (``x.permute(0, 2, 3, 1)`` is
contiguous), so it is passed as is; anything else is converted for the call and
counted in ``layout_conversions``. The output is allocated NHWC and returned as
an NCHW view in channels_last memory format, so a following conv (or an
elementwise op, which keeps the format) needs no conversion.

Channel padding (``problem.pad_c``, set by select on sm90a for C not a multiple
of 8): the kernel runs C' = C + pad_c channels. Each call copies the input into
a fresh NHWC buffer with zeros in the extra channels, counted in
``channel_pad_copies`` (not in ``layout_conversions``: a channels_last model
cannot avoid it; CompiledModel.channel_pad_copies() sums them). The filter is
padded to KRSC with C' channels once and kept while the weight tensor is the same
one, unmodified (its data pointer and version counter): a graph constant
(``filter_constant``, set by offload) is padded on its first call on a device; a
weight that is a graph input is padded on every call, counted like the input.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..ir import ConvKernel, ConvRegion
from .library import CoConvArgs
from .ops import channels_last_strides
from .region import RegionModule, unpooled_empty


def nhwc(t: torch.Tensor):
    """(NHWC view, converted?) of a 4-D NCHW tensor."""
    v = t.permute(0, 2, 3, 1)
    if v.is_contiguous():
        return v, False
    return v.contiguous(), True


def padded_nhwc(t: torch.Tensor, channels: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """A fresh contiguous (N, H, W, channels) copy of the 4-D NCHW tensor ``t``
    (any memory format; ``channels`` >= its C), zeros in channels C and up, written
    into ``out`` when given (contiguous, of that shape and t's dtype). Also pads a
    (K, C, R, S) filter to KRSC."""
    n, c, h, w = t.shape
    out = t.new_empty((n, h, w, channels)) if out is None else out
    out.narrow(3, c, channels - c).zero_()      # only the pad channels: the copy fills the rest
    out.narrow(3, 0, c).copy_(t.permute(0, 2, 3, 1))
    return out


def _version(t: torch.Tensor):
    # inference tensors keep no version counter; they cannot be written outside
    # inference mode, and a weight is not written inside it
    return None if t.is_inference() else t._version


class ConvRegionModule(RegionModule):
    """A conv2d fprop region: ``roles`` maps "x", "w", "bias", "c" to input positions.

    Input x: (N, C, H, W) of the region's dtype, any memory format (channels_last
    avoids a copy); weight (K, C, R, S) (prepack it to channels_last once: see
    ``attach``: prepack_weight); bias (K,) or (1, K, 1, 1); residual of
    the output's shape, or per-channel when the kernel broadcasts it, or (N, K, 1, 1)
    per sample (``residual_per_sample``). Output:
    (N, K, P, Q) in channels_last memory format.
    """

    def __init__(self, region: ConvRegion, kernel: ConvKernel, fallback: torch.fx.GraphModule,
                 roles: dict, library_getter):
        super().__init__(region, kernel, fallback, library_getter)
        self._ix, self._iw = roles["x"], roles["w"]
        self._ibias, self._ic = roles.get("bias"), roles.get("c")
        self.primary = self._ix
        p = region.problem
        self._p = p
        self._chw = (p.c, p.h, p.w)
        self._kcrs = (p.k, p.c // p.groups, p.r, p.s)      # (C, 1, R, S) when depthwise
        self.layout_conversions = 0      # operands copied to NHWC, over all calls
        self._c_kernel = p.c_kernel      # C' (> C when the kernel runs zero-padded channels)
        self.channel_pad_copies = 0      # operands copied into C'-channel buffers, over all calls
        self.filter_constant = False     # offload: the weight is a graph constant (get_attr)
        self._filter_cache = None        # (weight seen, its version, padded KRSC filter)
        self._operands = tuple((i, f) for i, f in ((self._ix, "x"), (self._iw, "filter"),
                                                   (self._ibias, "bias"), (self._ic, "residual"))
                               if i is not None)

    _out_field = "y"

    @staticmethod
    def operand_nodes(region: ConvRegion) -> tuple:
        return (("x", region.x), ("w", region.w), ("bias", region.bias), ("c", region.c))

    def attach(self, gm, by_name) -> None:
        """A weight the graph holds is prepacked to channels_last once, and its
        zero-padded copy (problem.pad_c) then made once, not per call."""
        w = by_name[self.region.w]
        prepack_weight(gm, w)
        self.filter_constant = w.op == "get_attr"

    def output_strides(self, shape) -> tuple:
        """The strides of this module's (N, K, P, Q) output: channels_last (NHWC memory)."""
        return channels_last_strides(shape)

    def _ws_key(self, args) -> tuple:
        return (args.n,)

    def _fast_operands(self):
        kern, e = self.kernel, self._esize
        aligns = {"x": kern.align_a * e, "filter": kern.align_b * e,
                  "bias": kern.align_c * e, "residual": kern.align_c * e}
        return tuple((i, f, aligns[f]) for i, f in self._operands)

    def _fast_out_align(self) -> int:
        return self.kernel.align_c * self._esize

    def _out_shape(self, out, args) -> tuple:
        return (args.n, args.p, args.q, args.k)          # NHWC

    def _map_direct(self, xs, args, shape):
        kern = self.kernel
        x = xs[self._ix]
        args.x, args.filter = x.data_ptr(), xs[self._iw].data_ptr()
        if not (self._aligned(args.x, kern.align_a) and self._aligned(args.filter, kern.align_b)):
            return None
        if self._ibias is not None:
            args.bias = xs[self._ibias].data_ptr()
            if not self._aligned(args.bias, kern.align_c):
                return None
        if self._ic is not None:
            args.residual = xs[self._ic].data_ptr()
            if not self._aligned(args.residual, kern.align_c):
                return None
        out = torch.empty(shape, dtype=self._dtype, device=x.device)
        args.y = out.data_ptr()
        if not self._aligned(args.y, kern.align_c):
            return None
        return out.permute(0, 3, 1, 2), args, []

    def _map_general(self, xs):
        p, kern = self._p, self.kernel
        x, w = xs[self._ix], xs[self._iw]
        if x.dtype != self._dtype or w.dtype != self._dtype or w.device != x.device:
            return None
        if x.dim() != 4 or tuple(x.shape[1:]) != self._chw or tuple(w.shape) != self._kcrs:
            return None                       # not the problem this kernel was built for
        n = x.shape[0]
        if n == 0:
            return None
        if self._c_kernel != p.c:
            xn, wn = padded_nhwc(x, self._c_kernel), self._padded_filter(w)
            conversions = 0
        else:
            xn, cx = nhwc(x)
            wn, cw = nhwc(w)
            conversions = cx + cw
        keep = [xn, wn]
        out_nhwc = torch.empty((n, p.p, p.q, p.k), dtype=self._dtype, device=x.device)
        args = CoConvArgs()
        args.x, args.filter, args.y = xn.data_ptr(), wn.data_ptr(), out_nhwc.data_ptr()
        if not (self._aligned(args.x, kern.align_a) and self._aligned(args.filter, kern.align_b)
                and self._aligned(args.y, kern.align_c)):
            return None
        args.bias = None
        if self._ibias is not None:
            b = xs[self._ibias]
            if b.dtype != self._dtype or b.device != x.device or b.numel() != p.k:
                return None
            b = b.reshape(-1).contiguous()
            if not self._aligned(b.data_ptr(), kern.align_c):
                return None
            args.bias = b.data_ptr()
            keep.append(b)
        args.residual = None
        if self._ic is not None:
            c = xs[self._ic]
            if c.dtype != self._dtype or c.device != x.device:
                return None
            if kern.epilogue.residual_per_sample:
                # (N, K, 1, 1): the kernel reads row n of the (N, K) vector
                if tuple(c.shape) != (n, p.k, 1, 1):
                    return None
                cn = c.reshape(n, p.k).contiguous()
            elif kern.epilogue.residual_broadcast:
                if c.numel() != p.k:
                    return None
                cn = c.reshape(-1).contiguous()
            else:
                if tuple(c.shape) != (n, p.k, p.p, p.q):
                    return None
                cn, cc = nhwc(c)
                conversions += cc
            if not self._aligned(cn.data_ptr(), kern.align_c):
                return None
            args.residual = cn.data_ptr()
            keep.append(cn)
        args.n, args.h, args.w, args.c = n, p.h, p.w, self._c_kernel
        args.k, args.r, args.s, args.p, args.q = p.k, p.r, p.s, p.p, p.q
        args.pad_h, args.pad_w = p.pad[0], p.pad[2]
        args.stride_h, args.stride_w = p.stride
        args.dilation_h, args.dilation_w = p.dilation
        self.layout_conversions += conversions
        if self._c_kernel != p.c:
            self.channel_pad_copies += 1                  # the input
        return out_nhwc.permute(0, 3, 1, 2), args, keep

    def _padded_filter(self, w: torch.Tensor) -> torch.Tensor:
        """The (K, R, S, C') zero-padded KRSC copy of the (K, C, R, S) weight ``w``:
        cached for a constant weight while it is the same memory, unmodified (the
        cache holds ``w``, so no other tensor can take its address); made per
        call, and counted, otherwise. Never cached while a CUDA graph is being
        captured: the copy would run only at replay."""
        hit = self._filter_cache
        if (hit is not None and hit[0].data_ptr() == w.data_ptr() and hit[0].device == w.device
                and hit[0].stride() == w.stride() and hit[1] == _version(w)):
            return hit[2]
        self.channel_pad_copies += 1
        if self.filter_constant and not (w.is_cuda and torch.cuda.is_current_stream_capturing()):
            # kept across calls: outside any CUDA graph pool (Inductor's graph trees
            # warm up with this thread's allocations routed to theirs)
            k, _, r, s = w.shape
            wp = padded_nhwc(w, self._c_kernel, unpooled_empty((k, r, s, self._c_kernel), w.dtype, w.device))
            self._filter_cache = (w, _version(w), wp)
            return wp
        return padded_nhwc(w, self._c_kernel)


def prepack_weight(gm: fx.GraphModule, node: fx.Node) -> None:
    """A conv weight held by the module (get_attr) becomes channels_last (KRSC in
    memory) once, instead of a copy per call. The user's model keeps its own
    tensor: the attribute is replaced, not modified."""
    if node.op != "get_attr":
        return
    owner, _, name = node.target.rpartition(".")
    mod = gm.get_submodule(owner) if owner else gm
    t = getattr(mod, name)
    if not isinstance(t, torch.Tensor) or t.dim() != 4 or t.is_contiguous(memory_format=torch.channels_last):
        return
    packed = t.detach().contiguous(memory_format=torch.channels_last)
    if isinstance(t, torch.nn.Parameter):
        packed = torch.nn.Parameter(packed, requires_grad=t.requires_grad)
    if name in getattr(mod, "_parameters", {}):
        mod._parameters[name] = packed
    elif name in getattr(mod, "_buffers", {}):
        mod._buffers[name] = packed
    else:
        setattr(mod, name, packed)
