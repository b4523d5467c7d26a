"""The module that replaces one GEMM region in the graph and calls the library."""
from __future__ import annotations

import math

import torch

from ..ir import GemmKernel, GemmRegion
from .library import CoGemmArgs
from .ops import contiguous_strides
from .region import VERIFY_TOLERANCE, RegionModule  # noqa: F401  (re-exported)


def _strip(dims) -> tuple:
    """Batch dims without leading 1s (they broadcast away)."""
    dims = tuple(dims)
    i = 0
    while i < len(dims) and dims[i] == 1:
        i += 1
    return dims[i:]


class GemmRegionModule(RegionModule):
    """A GEMM region: ``roles`` maps "a", "b", "bias", "c" to input positions."""

    @staticmethod
    def operand_nodes(region) -> tuple:
        return (("a", region.a), ("b", region.b), ("bias", region.bias), ("c", region.c))

    def __init__(self, region: GemmRegion, kernel: GemmKernel, fallback: torch.fx.GraphModule,
                 roles: dict, library_getter):
        super().__init__(region, kernel, fallback, library_getter)
        self._ia, self._ib = roles["a"], roles["b"]      # positions among the inputs
        self._ibias, self._ic = roles.get("bias"), roles.get("c")
        self.primary = self._ia
        self._args = CoGemmArgs()
        self._args.set_launch(kernel.launch)      # the same knobs on every call
        p = region.problem
        self._n, self._k = p.n, p.k
        # D's columns: half the GEMM's N under a GLU epilogue (gate and up interleaved)
        self._n_out = p.n // 2 if p.epilogue.glu else p.n
        self._align = (kernel.align_a, kernel.align_b, kernel.align_c)
        self._operands = tuple((i, f) for i, f in ((self._ia, "a"), (self._ib, "b"),
                                                   (self._ibias, "bias"), (self._ic, "c"))
                               if i is not None)

    _out_field = "d"

    def output_strides(self, shape) -> tuple:
        """The strides of this module's output of ``shape`` (a fresh row-major tensor)."""
        return contiguous_strides(shape)

    def _ws_key(self, args) -> tuple:
        return (args.m, args.n, args.k, args.l)

    def _fast_operands(self):
        e = self._esize
        al_a, al_b, al_c = self._align
        aligns = {"a": al_a * e, "b": al_b * e, "bias": al_c * e, "c": al_c * e}
        return tuple((i, f, aligns[f]) for i, f in self._operands)

    def _fast_out_align(self) -> int:
        return self._align[2] * self._esize

    # -- mapping PyTorch tensors onto (L, M, K) x (L, K, N) -> (L, M, N) -------------

    def _ok(self, t, ld, bstride, align) -> bool:
        return (t.data_ptr() % (align * self._esize) == 0 and ld % align == 0
                and bstride % align == 0)

    def _same_kind(self, a, t) -> bool:
        """The kernel's dtype, on the same device as A (else PyTorch runs the call)."""
        return t.dtype == self._dtype and a.dtype == self._dtype and t.device == a.device

    def _out_shape(self, out, args) -> tuple:
        return tuple(out.shape)

    def _map_direct(self, xs, template, out_shape):
        e = self._esize
        al_a, al_b, al_c = self._align
        a, b = xs[self._ia], xs[self._ib]
        pa, pb = a.data_ptr(), b.data_ptr()
        if pa % (al_a * e) or pb % (al_b * e):
            return None
        args = template
        args.a, args.b = pa, pb
        if self._ibias is not None:
            args.bias = xs[self._ibias].data_ptr()
            if args.bias % (al_c * e):
                return None
        if self._ic is not None:
            args.c = xs[self._ic].data_ptr()
            if args.c % (al_c * e):
                return None
        out = torch.empty(out_shape, dtype=self._dtype, device=a.device)
        args.d = out.data_ptr()
        if args.d % (al_c * e):
            return None
        return out, args, []

    def _map_general(self, xs):
        r, n, k, n_out = self.region, self._n, self._k, self._n_out
        al_a, al_b, al_c = self._align
        a, b = xs[self._ia], xs[self._ib]
        if not self._same_kind(a, b):
            return None
        bl = b.transpose(-1, -2) if r.b_nk else b          # logical (..., K, N)
        if a.shape[-1] != k or bl.dim() < 2 or bl.shape[-2] != k or bl.shape[-1] != n:
            return None                      # not the problem this kernel was built for
        col_a = self.kernel.layout_a == "col"
        if r.batch_mode == "fold":
            if bl.numel() != k * n or (col_a and a.dim() != 2):
                return None
            if r.form == "linear":
                out_shape = a.shape[:-1] + (n_out,)
            else:
                out_shape = torch.broadcast_shapes(a.shape[:-2], bl.shape[:-2]) + (a.shape[-2], n_out)
            a3 = a.reshape(1, -1, k) if not col_a else a
            b3 = bl.reshape(1, k, n)
        elif r.batch_mode == "b_broadcast":   # a Linear on a column-major A: L = A's leading dims
            if a.dim() < 3 or bl.numel() != k * n:
                return None
            out_shape = a.shape[:-1] + (n_out,)
            a3, b3 = a, bl.reshape(1, k, n)
        else:
            if a.dim() < 2 or (r.batch_mode == "a_broadcast" and a.numel() != a.shape[-2] * k) or \
                    (r.batch_mode == "batched" and _strip(a.shape[:-2]) != _strip(bl.shape[:-2])):
                return None
            try:
                batch = torch.broadcast_shapes(a.shape[:-2], bl.shape[:-2])
            except RuntimeError:
                return None
            lsize = math.prod(batch)
            m = a.shape[-2]
            out_shape = batch + (m, n_out)
            if r.batch_mode == "expand":      # one batch stride per operand: expand (copy) both
                a = a.expand(batch + (m, k))
                bl = bl.expand(batch + (k, n))
            a3 = a.reshape(1, m, k) if r.batch_mode == "a_broadcast" else a.reshape(lsize, m, k)
            b3 = bl.reshape(lsize, k, n)
        if col_a:
            # (L, M, K) with M contiguous: a view where A's leading dims merge, else a
            # column-major copy (never a row-major one, which this kernel cannot read)
            m = a3.shape[-2]
            at = a3.transpose(-1, -2).reshape(-1, k, m)
            if at.stride(-1) != 1 and m > 1:
                at = at.contiguous()
            a3 = at.transpose(-1, -2)
        lsize = a3.shape[0] if r.batch_mode == "b_broadcast" else (b3.shape[0] if r.batch_mode != "fold" else 1)
        m = a3.shape[1]
        if not col_a and a3.stride(-1) != 1 and k > 1:
            a3 = a3.contiguous()
        if self.kernel.layout_b == "col":
            if b3.stride(-2) != 1 and k > 1:
                b3 = b3.transpose(-1, -2).contiguous().transpose(-1, -2)
            ldb = b3.stride(-1) if n > 1 else k
        else:
            if b3.stride(-1) != 1 and n > 1:
                b3 = b3.contiguous()
            ldb = b3.stride(-2) if k > 1 else n
        if col_a:
            lda = a3.stride(-1) if k > 1 else m
            if m % al_a:                      # the contiguous extent, dynamic: checked per call
                return None
        else:
            lda = a3.stride(-2) if m > 1 else k
        bsa = 0 if (r.batch_mode not in ("batched", "expand", "b_broadcast") or lsize == 1) else a3.stride(0)
        bsb = 0 if (lsize == 1 or r.batch_mode == "b_broadcast") else b3.stride(0)
        if not (self._ok(a3, lda, bsa, al_a) and self._ok(b3, ldb, bsb, al_b)):
            return None
        out = torch.empty(out_shape, dtype=a.dtype, device=a.device)
        keep = [a3, b3]
        args = self._args
        args.a, args.b, args.d = a3.data_ptr(), b3.data_ptr(), out.data_ptr()
        args.m, args.n, args.k, args.l = m, n, k, lsize
        args.lda, args.ldb, args.ldd = lda, ldb, n_out
        args.batch_stride_a, args.batch_stride_b = bsa, bsb
        args.batch_stride_d = m * n_out if lsize > 1 else 0
        if not self._ok(out, n_out, args.batch_stride_d, al_c):
            return None
        args.bias = None
        if self._ibias is not None:
            if not self._same_kind(a, xs[self._ibias]):
                return None
            bias = xs[self._ibias].reshape(-1).contiguous()
            if bias.numel() != n or not self._ok(bias, n, 0, al_c):
                return None
            args.bias = bias.data_ptr()
            keep.append(bias)
        args.c, args.ldc, args.batch_stride_c = None, 0, 0
        if self._ic is not None:
            c = xs[self._ic]
            if not self._same_kind(a, c) or tuple(c.shape) != tuple(out_shape):
                return None
            c3 = c.reshape(lsize, m, n)
            if c3.stride(-1) != 1 and n > 1:
                c3 = c3.contiguous()
            ldc = c3.stride(-2) if m > 1 else n
            bsc = c3.stride(0) if lsize > 1 else 0
            if not self._ok(c3, ldc, bsc, al_c):
                return None
            args.c, args.ldc, args.batch_stride_c = c3.data_ptr(), ldc, bsc
            keep.append(c3)
        return out, args, keep
