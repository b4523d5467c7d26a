"""The module that replaces one GEMM region in the graph and calls the library."""
from __future__ import annotations

import ctypes
import math
import warnings

import torch

from ..errors import DeviceError, KernelLaunchError
from ..ir import GemmKernel, GemmRegion
from .library import CO_CANNOT_IMPLEMENT, CO_OK, STATUS_NAMES, CoGemmArgs, check_device

_ESIZE = {"f16": 2, "bf16": 2, "f32": 4}
# verify mode: norm-wise relative error allowed against the PyTorch subgraph (which
# itself rounds in the same dtype): about 8x the unit roundoff of the output type
VERIFY_TOLERANCE = {"f16": 1e-2, "bf16": 3e-2, "f32": 1e-2}


def _copy_args(args: CoGemmArgs) -> CoGemmArgs:
    out = CoGemmArgs()
    ctypes.pointer(out)[0] = args
    return out


def _strip(dims) -> tuple:
    """Batch dims without leading 1s (they broadcast away)."""
    dims = tuple(dims)
    i = 0
    while i < len(dims) and dims[i] == 1:
        i += 1
    return dims[i:]


def _current_stream(index):
    """cudaStream_t of the current stream: the raw getter Inductor uses when it
    exists (a few us cheaper per call), else the public API."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(index)
    return torch.cuda.current_stream(index).cuda_stream


class GemmRegionModule(torch.nn.Module):
    """Runs one region on the current CUDA stream; same inputs and output as ``fallback``.

    Inputs arrive in the order of ``fallback``'s placeholders; ``roles`` maps
    "a", "b", "bias", "c" to positions among them. The output tensor is
    allocated through PyTorch's caching allocator; the workspace buffer is reused.
    When a call cannot map onto the kernel (misaligned pointer or stride, a shape
    ``can_implement`` refuses), that call runs ``fallback`` instead and
    ``fallback_calls`` counts it. CUDA inputs only: a CPU input raises DeviceError.
    """

    def __init__(self, region: GemmRegion, kernel: GemmKernel, fallback: torch.fx.GraphModule,
                 roles: dict, library_getter):
        super().__init__()
        self.region, self.kernel, self.fallback = region, kernel, fallback
        self._ia, self._ib = roles["a"], roles["b"]      # positions among the inputs
        self._ibias, self._ic = roles.get("bias"), roles.get("c")
        self._library_getter = library_getter
        self._fn = None
        self._args = CoGemmArgs()
        self._ws = None
        self._ws_shape, self._ws_need = None, 0
        self.fallback_calls = 0
        self.calls = 0
        self.verify = False          # compare the first kernel call with the fallback
        self.disabled = None         # reason, once verification failed: PyTorch from then on
        p = region.problem
        self._n, self._k = p.n, p.k
        self._align = (kernel.align_a, kernel.align_b, kernel.align_c)
        self._esize = _ESIZE[kernel.dtype]
        self._dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[kernel.dtype]
        # inputs that the kernel reads, and their slot among (a, b, bias, c)
        slots = [(0, self._ia), (1, self._ib), (2, self._ibias), (3, self._ic)]
        self._role_slots = tuple(j for j, i in slots if i is not None)
        self._roles = tuple(i for _, i in slots if i is not None)
        self._direct = {}            # signature -> (CoGemmArgs with sizes/strides, out shape)

    def extra_repr(self) -> str:
        return f"{self.region.name} -> {self.kernel.name}"

    def _bind(self, device):
        lib = self._library_getter()
        check_device(self.kernel.arch, device)
        self._fn, self._ws_fn = lib.launcher(f"co_{self.region.name}")

    def forward(self, *xs):
        a = xs[self._ia]
        if not a.is_cuda:
            raise DeviceError(f"{self.region.name}: inputs are on {a.device}; the compiled "
                              "model runs its offloaded regions on a CUDA GPU")
        if self._fn is None:
            self._bind(a.device)
        self.calls += 1
        if self.disabled:
            self.fallback_calls += 1
            return self.fallback(*xs)
        mapped = self._map(xs)
        if mapped is None:
            self.fallback_calls += 1
            return self.fallback(*xs)
        out, args, keep = mapped   # keep: temporaries that must outlive the launch
        shape = (args.m, args.n, args.k, args.l)
        if shape != self._ws_shape:      # workspace size depends on the problem size only
            self._ws_shape, self._ws_need = shape, self._ws_fn(ctypes.byref(args))
        need = self._ws_need
        if need > 0:
            if self._ws is None or self._ws.numel() < need:
                self._ws = torch.empty(need, dtype=torch.uint8, device=a.device)
            args.workspace, args.workspace_bytes = self._ws.data_ptr(), self._ws.numel()
        else:
            args.workspace, args.workspace_bytes = None, 0
        status = self._fn(ctypes.byref(args), _current_stream(a.device.index))
        if status == CO_OK:
            if self.verify:
                return self._verified(out, xs)
            return out
        if status == CO_CANNOT_IMPLEMENT:
            self.fallback_calls += 1
            return self.fallback(*xs)
        raise KernelLaunchError(f"{self.region.name} ({self.kernel.name}): "
                                f"{STATUS_NAMES.get(status, status)}")

    def _verified(self, out, xs):
        """First call in verify mode: compare with the PyTorch subgraph (float64
        norm-wise relative error, tolerance by dtype); on disagreement warn, keep
        the PyTorch result and run PyTorch for this region from then on."""
        self.verify = False
        ref = self.fallback(*xs)
        o, r = out.double(), ref.double()
        err = float((o - r).norm() / r.norm().clamp_min(1e-30))
        tol = VERIFY_TOLERANCE[self.kernel.dtype]
        if not err <= tol:          # NaN fails too
            self.disabled = f"verification failed: relative error {err:.3e} > {tol:g}"
            warnings.warn(f"cutlass_offload: {self.region.name} ({self.kernel.name}) disagrees with "
                          f"PyTorch (relative error {err:.3e}); it runs in PyTorch from now on",
                          RuntimeWarning, stacklevel=3)
            return ref
        return out

    # -- mapping PyTorch tensors onto (L, M, K) x (L, K, N) -> (L, M, N) -------------

    def _ok(self, t, ld, bstride, align) -> bool:
        return (t.data_ptr() % (align * self._esize) == 0 and ld % align == 0
                and bstride % align == 0)

    def _same_kind(self, a, t) -> bool:
        """The kernel's dtype, on the same device as A (else PyTorch runs the call)."""
        return t.dtype == self._dtype and a.dtype == self._dtype and t.device == a.device

    def _map(self, xs):
        """(out, CoGemmArgs, temporaries) for this call, or None when the call does not
        fit the kernel (dtype, device, shape, alignment): the caller falls back.

        Calls repeat the same shapes and strides: once a signature has mapped without
        copying any input, its sizes and strides are kept (in their own CoGemmArgs)
        and later calls only set and check the pointers.
        """
        sig = self._signature(xs)
        args = self._direct.get(sig)
        if args is not None:
            return self._map_direct(xs, args)
        mapped = self._map_general(xs)
        if mapped is not None and len(self._direct) < 64 and self._is_direct(xs, mapped[1]):
            self._direct[sig] = _copy_args(mapped[1]), tuple(mapped[0].shape)
        return mapped

    def _signature(self, xs) -> tuple:
        sig = []
        for i in self._roles:
            t = xs[i]
            sig.append((t.shape, t.stride(), t.dtype, t.device))
        return tuple(sig)

    def _is_direct(self, xs, args) -> bool:
        """True when the kernel reads the inputs themselves (no copy was needed)."""
        ptrs = (args.a, args.b, args.bias, args.c)
        return all(xs[i].data_ptr() == ptrs[j] for j, i in zip(self._role_slots, self._roles))

    def _map_direct(self, xs, cached):
        template, out_shape = cached
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
        r, n, k = self.region, self._n, self._k
        al_a, al_b, al_c = self._align
        a, b = xs[self._ia], xs[self._ib]
        if not self._same_kind(a, b):
            return None
        bl = b.transpose(-1, -2) if r.b_nk else b          # logical (..., K, N)
        if a.shape[-1] != k or bl.dim() < 2 or bl.shape[-2] != k or bl.shape[-1] != n:
            return None                      # not the problem this kernel was built for
        if r.batch_mode == "fold":
            if bl.numel() != k * n:
                return None
            if r.form == "linear":
                out_shape = a.shape[:-1] + (n,)
            else:
                out_shape = torch.broadcast_shapes(a.shape[:-2], bl.shape[:-2]) + (a.shape[-2], n)
            a3 = a.reshape(1, -1, k)
            b3 = bl.reshape(1, k, n)
        else:
            if a.dim() < 2 or (r.batch_mode == "a_broadcast" and a.numel() != a.shape[-2] * k) or \
                    (r.batch_mode == "batched" and _strip(a.shape[:-2]) != _strip(bl.shape[:-2])):
                return None
            batch = torch.broadcast_shapes(a.shape[:-2], bl.shape[:-2])
            lsize = math.prod(batch)
            m = a.shape[-2]
            out_shape = batch + (m, n)
            a3 = a.reshape(1, m, k) if r.batch_mode == "a_broadcast" else a.reshape(lsize, m, k)
            b3 = bl.reshape(lsize, k, n)
        lsize, m = b3.shape[0] if r.batch_mode != "fold" else 1, a3.shape[1]
        if a3.stride(-1) != 1 and k > 1:
            a3 = a3.contiguous()
        if self.kernel.layout_b == "col":
            if b3.stride(-2) != 1 and k > 1:
                b3 = b3.transpose(-1, -2).contiguous().transpose(-1, -2)
            ldb = b3.stride(-1) if n > 1 else k
        else:
            if b3.stride(-1) != 1 and n > 1:
                b3 = b3.contiguous()
            ldb = b3.stride(-2) if k > 1 else n
        lda = a3.stride(-2) if m > 1 else k
        bsa = 0 if (r.batch_mode != "batched" or lsize == 1) else a3.stride(0)
        bsb = 0 if lsize == 1 else b3.stride(0)
        if not (self._ok(a3, lda, bsa, al_a) and self._ok(b3, ldb, bsb, al_b)):
            return None
        out = torch.empty(out_shape, dtype=a.dtype, device=a.device)
        keep = [a3, b3]
        args = self._args
        args.a, args.b, args.d = a3.data_ptr(), b3.data_ptr(), out.data_ptr()
        args.m, args.n, args.k, args.l = m, n, k, lsize
        args.lda, args.ldb, args.ldd = lda, ldb, n
        args.batch_stride_a, args.batch_stride_b = bsa, bsb
        args.batch_stride_d = m * n if lsize > 1 else 0
        if not self._ok(out, n, args.batch_stride_d, al_c):
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
