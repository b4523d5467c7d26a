"""The module that replaces one attention region and calls the library.

Q, K and V are passed in place: the kernel reads BMHK with runtime batch, sequence
and head strides, so a (B, H, L, E) tensor (any permutation of a BSNH buffer) goes
as it is with strides (stride(0), stride(2), stride(1)); broadcast dims get stride
0. Only an operand whose head dim is not contiguous is copied. The output is
allocated BMHK (B, L, H, Ev) (the kernel fixes its head and batch strides) and
returned as the (B, H, L, Ev) view, or as itself when the region took in the
transpose back to (B, L, H, Ev) (``AttentionRegion.out_layout``).

Masks: a boolean mask becomes a 0 / -inf bias of the input dtype, padded so every
row is readable in 16-byte vectors up to round_up(S, 8) (f32: 4) keys; a float
bias is passed in place when its strides and pointer allow, else copied padded.
In SDPA, a query row whose mask hides every key gives 0 (PyTorch's rule; the
kernel would give 0/0): those rows are zeroed after the launch. Bottom-right
causal attention with more queries than keys runs the kernel on the last S
queries only; the first L - S rows see no key (0 in SDPA, NaN in a hand-written
softmax, as PyTorch gives them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ir import CAUSAL_CODE, AttentionKernel, AttentionRegion
from ..masks import mask_pattern
from .library import CoAttentionArgs
from .ops import contiguous_strides
from .region import RegionModule

_BIAS_ALIGN = {"f16": 8, "bf16": 8, "f32": 4}      # elements per 16-byte bias vector


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


class _Finish:
    """What to do with the kernel's BMHK output once it is launched (kept in ``keep``);
    ``dead`` and ``skip`` as passed to ``AttentionRegionModule._finish``."""

    def __init__(self, fn, dead=None, skip=0):
        self.fn, self.dead, self.skip = fn, dead, skip


class AttentionRegionModule(RegionModule):
    """An attention region: ``roles`` maps "q", "k", "v", "bias", "mask" to input
    positions ("mask": a mask folded into the causal argument, read only to check
    the fold once per shape when it depends on dynamic sizes, and by the fallback).

    A call runs PyTorch instead (``_map`` returns None, or the kernel refuses it)
    when an input is not of the kernel's dtype or device, the head dims or head
    count differ from the compiled ones, the batch dims do not broadcast, the mask
    does not broadcast to the logits or (folded) is not the compiled pattern for
    this shape, or a pointer / stride is not aligned to the kernel's accesses.
    """

    @staticmethod
    def operand_nodes(region) -> tuple:
        return (("q", region.q), ("k", region.k), ("v", region.v), ("bias", region.bias),
                ("mask", region.mask))

    def __init__(self, region: AttentionRegion, kernel: AttentionKernel,
                 fallback: torch.fx.GraphModule, roles: dict, library_getter):
        super().__init__(region, kernel, fallback, library_getter)
        self._iq, self._ik, self._iv = roles["q"], roles["k"], roles["v"]
        self._ib, self._im = roles.get("bias"), roles.get("mask")
        self.primary = self._iq
        self._p = region.problem
        self._causal = CAUSAL_CODE[region.problem.causal]
        self._bias_align = _BIAS_ALIGN[kernel.dtype]
        self._fill = 0.0 if region.form == "sdpa" else float("nan")
        self._mask_ok = {}        # (mask shape, seq_q, seq_kv) -> the folded mask fits
        self.copies = 0           # operands copied (head dim not contiguous, -q, padded bias)
        # The cached path (RegionModule._map) serves q, k, v read in place with no bias
        # tensor: a bias is copied or padded per call, or read for dead rows (values).
        # Calls with -q / -k or bottom-right skipped rows move a pointer, so they
        # never match their operands and always map in full.
        self._operands = ((self._iq, "q"), (self._ik, "k"), (self._iv, "v"))

    _out_field = "out"

    def output_strides(self, shape) -> tuple:
        """The strides of this module's output of ``shape`` (see ``_layout``): a fresh
        row-major tensor for out_layout "bmhk" and "contiguous" and for rank 3;
        (B, H, L, Ev) over the kernel's (B, L, H, Ev) buffer for "strided"."""
        r = self.region
        if r.rank == 3 or r.out_layout != "strided":
            return contiguous_strides(shape)
        b, h, l, ev = shape
        return (l * h * ev, ev, h * ev, 1)

    def _fast_operands(self):
        # a bias tensor is copied or padded per call: those regions keep the Python path
        if self._ib is not None:
            return None
        acc = self.kernel.access * self._esize
        return tuple((i, f, acc) for i, f in self._operands)

    def _fast_guards(self) -> tuple:
        # A checked mask is compared with the pattern once per (mask shape, seq_q,
        # seq_kv) (_mask_fits) before a signature is launched, so a signature that
        # holds the mask's metadata (and q's and k's) stands for a checked fold.
        if self._im is not None and self.region.mask_check:
            return (self._im,)
        return ()

    def _fast_out_align(self) -> int:
        return self.kernel.access * self._esize

    def _fast_installable(self, entry) -> bool:
        return not entry[1]         # no work after the launch (_finish)

    def _ws_key(self, args) -> tuple:
        if not self.kernel.needs_workspace:
            return ()             # no workspace whatever the call
        # the kernel says 0 for a call it refuses: ask again on every call, so a
        # refused call never leaves a 0 behind for an accepted one of the same size
        return (args.batch, args.heads, args.seq_q, args.head_dim_v, self.calls)

    def _launched(self, out, keep):
        if keep and isinstance(keep[-1], _Finish):
            return keep[-1].fn(out)
        return out

    # -- masks ---------------------------------------------------------------------
    def _mask_fits(self, mask, seq_q, seq_kv) -> bool:
        """The folded mask is the compiled pattern at this shape (checked once per
        shape: a device sync; never during CUDA graph capture, which then falls back)."""
        key = (tuple(mask.shape), seq_q, seq_kv)
        ok = self._mask_ok.get(key)
        if ok is None:
            if mask.is_cuda and torch.cuda.is_current_stream_capturing():
                return False
            found = mask_pattern(mask, self.region.mask_kind, seq_q, seq_kv)
            ok = (found is not None and found[0] == self._p.causal
                  and found[2] == self._p.window
                  and not (found[1] and found[0] == "bottom_right" and seq_q > seq_kv))
            self._mask_ok[key] = ok
        return ok

    def _bias(self, b, batch, heads, seq_q, seq_kv, skip, device):
        """(bias tensor, (batch, head, query) strides, kv capacity, dead rows or None)
        for the kernel, or None when the mask does not fit."""
        r, dt = self.region, self._dtype
        if b.device != device:
            return None
        if r.bias_kind == "float" and b.dtype != dt:
            return None
        if r.bias_kind != "float" and b.dtype != torch.bool:
            return None
        if b.dim() > r.rank:
            return None
        b = b[(None,) * (r.rank - b.dim())]
        if r.rank == 3:
            b = b.unsqueeze(1)
        for have, want in zip(b.shape, (batch, heads, seq_q, seq_kv)):
            if have not in (1, want):
                return None
        if skip and b.shape[2] != 1:
            b = b[:, :, skip:]
        ab = self._bias_align
        dead, copied = None, 1
        if r.bias_kind == "float":
            if r.form == "sdpa":               # rows of -inf: 0 in PyTorch's SDPA
                dead = torch.isneginf(b).all(-1, keepdim=True)
            if b.shape[-1] != seq_kv:
                b = b.expand(*b.shape[:-1], seq_kv)
            usable = (b.stride(-1) == 1 and seq_kv % ab == 0 and self._aligned(b.data_ptr(), ab)
                      and all(b.stride(i) % ab == 0 for i in range(3) if b.shape[i] != 1))
            if usable:
                return b, self._bias_strides(b), 0, dead, 0
            cap = _round_up(seq_kv, ab)
            bias = F.pad(b, (0, cap - seq_kv)) if cap != seq_kv else b.clone(
                memory_format=torch.contiguous_format)
        else:
            masked = ~b if r.bias_kind == "bool_keep" else b
            if r.form == "sdpa":               # rows with no key: 0 in PyTorch's SDPA
                dead = masked.all(-1, keepdim=True)
            cap = _round_up(seq_kv, ab)
            bias = torch.zeros(tuple(b.shape[:-1]) + (cap,), dtype=dt, device=device)
            bias[..., :seq_kv].masked_fill_(masked, float("-inf"))
        return bias, self._bias_strides(bias), cap, dead, copied

    @staticmethod
    def _bias_strides(b) -> tuple:
        return tuple(0 if b.shape[i] == 1 else b.stride(i) for i in range(3))

    # -- a call --------------------------------------------------------------------
    def _direct_entry(self, mapped):
        """(BMHK output shape, finish after the launch?) for a call with no bias tensor
        and no skipped rows; None (map in full every call) otherwise."""
        _, args, keep = mapped
        if self._ib is not None:
            return None
        finish = bool(keep) and isinstance(keep[-1], _Finish)
        if finish and (keep[-1].dead is not None or keep[-1].skip):
            return None
        return (args.batch, args.seq_q, args.heads, args.head_dim_v), finish

    def _map_direct(self, xs, args, entry):
        shape, finish = entry
        q, k, v = xs[self._iq], xs[self._ik], xs[self._iv]
        # no skipped rows: args.seq_q is the call's seq_q
        if self._im is not None and self.region.mask_check and not self._mask_fits(
                xs[self._im], args.seq_q, args.seq_kv):
            return None
        pq, pk, pv = q.data_ptr(), k.data_ptr(), v.data_ptr()
        acc_bytes = self.kernel.access * self._esize
        if pq % acc_bytes or pk % acc_bytes or pv % acc_bytes:
            return self._map_general(xs)      # the general path copies a misaligned operand
        args.q, args.k, args.v = pq, pk, pv
        out = torch.empty(shape, dtype=self._dtype, device=q.device)
        args.out = out.data_ptr()
        if finish:
            return out, args, [q, k, v, _Finish(lambda o: self._finish(o, None, 0))]
        return self._layout(out), args, [q, k, v]

    def _map_general(self, xs):
        r, p, dt = self.region, self._p, self._dtype
        q, k, v = xs[self._iq], xs[self._ik], xs[self._iv]
        dev = q.device
        for t in (q, k, v):
            if t.dtype != dt or t.device != dev or t.dim() != r.rank:
                return None
        if r.k_transposed:
            k = k.transpose(-1, -2)
        if r.rank == 3:
            q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        e, ev, seq_q, seq_kv = q.shape[3], v.shape[3], q.shape[2], k.shape[2]
        if e != p.head_dim or k.shape[3] != e or ev != p.head_dim_v or v.shape[2] != seq_kv:
            return None
        if seq_kv == 0:
            return None
        group = p.kv_group            # query heads per K/V head (grouped-query attention)
        try:
            if group > 1:
                if k.shape[1] * group != q.shape[1] or v.shape[1] != k.shape[1]:
                    return None
                (batch,), heads = torch.broadcast_shapes(q.shape[:1], k.shape[:1], v.shape[:1]), q.shape[1]
            else:
                batch, heads = torch.broadcast_shapes(q.shape[:2], k.shape[:2], v.shape[:2])
        except RuntimeError:
            return None
        if heads != p.heads:
            return None
        if self._im is not None and r.mask_check and not self._mask_fits(xs[self._im], seq_q, seq_kv):
            return None
        copies = 0
        if q.stride(-1) != 1:
            q, copies = q.contiguous(), copies + 1
        if k.stride(-1) != 1:
            k, copies = k.contiguous(), copies + 1
        if v.stride(-1) != 1:
            v, copies = v.contiguous(), copies + 1
        # A pointer or stride the kernel's accesses do not divide: copy that operand
        # (fresh storage is aligned) rather than fall back. PyTorch 2.11's own SDPA
        # returns wrong values for a misaligned fp16 query with a boolean mask
        # (relative error 1.06 measured on an H200, while its math backend agrees
        # with float64), so the fallback would not be a safe answer here.
        acc_bytes = self.kernel.access * self._esize
        fixed = []
        for t in (q, k, v):
            if t.data_ptr() % acc_bytes or any(t.stride(i) % self.kernel.access
                                                for i in range(3) if t.shape[i] > 1):
                t, copies = t.clone(memory_format=torch.contiguous_format), copies + 1
            fixed.append(t)
        q, k, v = fixed
        if r.negate:                          # the kernel takes scale > 0: -scale on -q or -k
            if q.numel() <= k.numel():
                q = torch.neg(q)
            else:
                k = torch.neg(k)
            copies += 1
        skip = seq_q - seq_kv if p.causal == "bottom_right" and seq_q > seq_kv else 0
        if skip:
            q = q[:, :, skip:]
        rows = seq_q - skip                   # the queries the kernel computes
        q = q.expand(batch, heads, rows, e)
        k = k.expand(batch, heads // group, seq_kv, e)
        v = v.expand(batch, heads // group, seq_kv, ev)
        out = torch.empty((batch, rows, heads, ev), dtype=dt, device=dev)
        args = CoAttentionArgs()
        args.q, args.k, args.v, args.out = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
        args.batch, args.heads, args.seq_q, args.seq_kv = batch, heads, rows, seq_kv
        args.head_dim, args.head_dim_v = e, ev
        args.q_stride_batch, args.q_stride_seq, args.q_stride_head = q.stride(0), q.stride(2), q.stride(1)
        args.k_stride_batch, args.k_stride_seq, args.k_stride_head = k.stride(0), k.stride(2), k.stride(1)
        args.v_stride_batch, args.v_stride_seq, args.v_stride_head = v.stride(0), v.stride(2), v.stride(1)
        args.out_stride_batch, args.out_stride_seq, args.out_stride_head = out.stride(0), out.stride(1), out.stride(2)
        args.scale, args.causal = p.scale, self._causal
        keep = [q, k, v]
        dead = None
        args.bias = None
        args.bias_stride_batch = args.bias_stride_head = args.bias_stride_query = 0
        args.bias_kv_capacity = 0
        if self._ib is not None:
            got = self._bias(xs[self._ib], batch, heads, seq_q, seq_kv, skip, dev)
            if got is None:
                return None
            bias, strides, cap, dead, copied = got
            args.bias = bias.data_ptr()
            args.bias_stride_batch, args.bias_stride_head, args.bias_stride_query = strides
            args.bias_kv_capacity = cap
            keep.append(bias)
            copies += copied
        self.copies += copies
        if not skip and dead is None and r.out_layout != "contiguous":
            return self._layout(out), args, keep
        keep.append(_Finish(lambda o: self._finish(o, dead, skip), dead, skip))
        return out, args, keep

    def _finish(self, out, dead, skip):
        """After the launch: zero the rows that see no key (SDPA), prepend the rows
        bottom-right causal leaves out, then the region's layout."""
        if dead is not None:
            out.transpose(1, 2).masked_fill_(dead, 0.0)
        if skip:
            b, _, h, ev = out.shape
            head = torch.full((b, skip, h, ev), self._fill, dtype=out.dtype, device=out.device)
            out = torch.cat([head, out], dim=1)
        return self._layout(out)

    def _layout(self, out):
        """The region's output from the kernel's (B, L, H, Ev) tensor."""
        r = self.region
        if r.out_layout == "bmhk":
            return out
        if r.rank == 3:
            return out.squeeze(2)
        if r.out_layout == "contiguous":
            return out.transpose(1, 2).contiguous()
        return out.transpose(1, 2)
