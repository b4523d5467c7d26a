"""What every offloaded region module shares: binding to the library, the call
path (map inputs -> launch on the current stream -> or fall back), the reused
workspace, and verify mode. Subclasses map PyTorch tensors onto their C ABI."""
from __future__ import annotations

import ctypes
import threading
import warnings

import torch
from torch.nn.modules import module as _nn_module

from ..abi import region_symbol
from ..dtypes import BYTES, TORCH
from ..errors import DeviceError, KernelLaunchError
from . import fast_call, ops
from .library import ARGS_TYPES, CO_CANNOT_IMPLEMENT, CO_OK, STATUS_NAMES, check_device

ESIZE = BYTES
# nn.Module's process-wide forward hooks (register_module_forward_*_hook): dicts
# mutated in place, so holding them is enough
_GLOBAL_HOOKS = tuple(getattr(_nn_module, name, {}) for name in
                      ("_global_forward_pre_hooks", "_global_forward_hooks"))
TORCH_DTYPE = TORCH
# verify mode: norm-wise relative error allowed against the PyTorch subgraph (which
# itself rounds in the same dtype): about 8x the unit roundoff of the output type
VERIFY_TOLERANCE = {"f16": 1e-2, "bf16": 3e-2, "f32": 1e-2}


def disagreement(out: torch.Tensor, ref: torch.Tensor, tol: float) -> str | None:
    """Why ``out`` disagrees with PyTorch's ``ref`` (same shape, any float dtype),
    or None when it agrees.

    Agreement: the same shape, NaN at the same elements, infinities at the same
    elements with the same signs (an fp16 overflow must give PyTorch's inf / NaN,
    not a finite value), and a float64 norm-wise relative error of the finite
    elements of at most ``tol``.
    """
    if out.shape != ref.shape:
        return f"shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o, r = out.double(), ref.double()
    if not torch.equal(o.isnan(), r.isnan()):
        return "NaN at other elements"
    if not torch.equal(o.isposinf(), r.isposinf()) or not torch.equal(o.isneginf(), r.isneginf()):
        return "inf at other elements"
    finite = r.isfinite()
    o, r = o[finite], r[finite]
    err = float((o - r).norm() / r.norm().clamp_min(1e-30))
    if not err <= tol:
        return f"relative error {err:.3e} > {tol:g}"
    return None


def unpooled_empty(shape, dtype, device) -> torch.Tensor:
    """An uninitialized tensor that no CUDA graph memory pool owns, for buffers a
    region keeps across calls (workspaces, prepacked filters).

    The caching allocator routes a thread's allocations to a graph's private pool
    while Inductor's CUDA graph trees warm up or record a graph on that thread
    (``_cuda_beginAllocateCurrentThreadToPool``), and the trees then refuse a
    pool allocation that outlives the call without being an output. So the
    buffer is allocated by a helper thread, then marked as used on the caller's
    current stream. Not during a capture (no cudaMalloc then): callers use a
    per-call temporary instead.
    """
    if torch.device(device).type != "cuda":
        return torch.empty(shape, dtype=dtype, device=device)
    box = []

    def alloc():
        try:
            box.append(torch.empty(shape, dtype=dtype, device=device))
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box.append(e)

    t = threading.Thread(target=alloc, name="cutlass_offload-buffer")
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    box[0].record_stream(torch.cuda.current_stream(device))
    return box[0]


def current_stream(index):
    """cudaStream_t of the current stream: the raw getter Inductor uses when it
    exists (a few us cheaper per call), else the public API."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(index)
    return torch.cuda.current_stream(index).cuda_stream


class RegionModule(torch.nn.Module):
    """Runs one region on the current CUDA stream; same inputs and output as ``fallback``.

    Inputs arrive in the order of ``fallback``'s placeholders. The output is
    allocated through PyTorch's caching allocator; the workspace buffer is reused.
    A call that cannot map onto the kernel (``_map`` returns None, or the kernel's
    can_implement refuses) runs ``fallback`` instead; ``fallback_calls`` counts
    those. CUDA inputs only: a CPU input raises DeviceError.

    Once a call signature has launched from cached args (see ``_map``), later calls
    of it are replayed by the C++ call path (runtime/fast_call.py) when it is
    built; whatever that path declines comes back here.
    """

    primary = 0                    # position of the input whose device the call runs on
    _out_field = None              # the args field the output pointer goes in

    def __init__(self, region, kernel, fallback: torch.fx.GraphModule, library_getter):
        super().__init__()
        self.region, self.kernel, self.fallback = region, kernel, fallback
        self._library_getter = library_getter
        self._fn = None
        self._ws = None
        self._ws_retired = []        # workspaces replaced by larger ones (see _workspace)
        self._ws_shape, self._ws_need = None, 0
        self.fallback_calls = 0
        self._calls = 0              # calls through forward's Python path
        self._fast = None            # fast_call.FastCall once built, or None
        self._fast_sig = None        # the signature of this call when it is cached
        self._fast_sigs = set()      # signatures offered to the C++ path
        self._op_keys = {}           # region-op key the op's C++ kernel may replay -> input order (ops.py)
        self.verify = False          # compare the first kernel call with the fallback
        self.disabled = None         # reason, once verification failed: PyTorch from then on
        self._direct = {}            # call signature -> (args with sizes, output shape)
        self._esize = ESIZE[kernel.dtype]
        self._dtype = TORCH_DTYPE[kernel.dtype]

    def extra_repr(self) -> str:
        return f"{self.region.name} -> {self.kernel.name}"

    # verify / disabled / forward hooks also switch the C++ replay off (the region
    # op's C++ kernel calls the FastCall without asking this module); global module
    # hooks (torch.nn.modules.module.register_module_forward_hook) are not seen there
    @property
    def verify(self) -> bool:
        return self._verify

    @verify.setter
    def verify(self, on: bool) -> None:
        self._verify = bool(on)
        self._sync_fast()

    @property
    def disabled(self):
        return self._disabled

    @disabled.setter
    def disabled(self, reason) -> None:
        self._disabled = reason
        self._sync_fast()

    def _sync_fast(self) -> None:
        fast = self.__dict__.get("_fast")
        if fast is not None:
            d = self.__dict__
            fast.enabled = not (d.get("_verify") or d.get("_disabled") or d.get("_forward_hooks")
                                or d.get("_forward_pre_hooks"))

    def register_forward_hook(self, *args, **kwargs):
        handle = super().register_forward_hook(*args, **kwargs)
        self._sync_fast()
        return handle

    def register_forward_pre_hook(self, *args, **kwargs):
        handle = super().register_forward_pre_hook(*args, **kwargs)
        self._sync_fast()
        return handle

    @property
    def calls(self) -> int:
        """Calls of this region so far (kernel or fallback, either call path)."""
        return self._calls + (self._fast.calls if self._fast is not None else 0)

    @staticmethod
    def operand_nodes(region) -> tuple:
        """((role, graph node name or None), ...): the region's inputs by role."""
        raise NotImplementedError

    def attach(self, gm, by_name) -> None:
        """One-time work on the graph ``gm`` this module is offloaded into (nodes by
        name in ``by_name``); none by default."""

    def _bind(self, device):
        lib = self._library_getter()
        check_device(self.kernel.arch, device)
        self._fn, self._ws_fn = lib.launcher(region_symbol(self.region.name),
                                             ARGS_TYPES[self.kernel.args_type])

    # -- the C++ call path ----------------------------------------------------------
    def _fast_operands(self):
        """((input position, args pointer field, alignment in bytes), ...) that the
        C++ path patches and checks per call, or None when this region never takes it.
        The output field is ``_out_field``; its alignment ``_fast_out_align()``."""
        return None

    def _fast_guards(self) -> tuple:
        """Input positions whose sizes / strides / dtype / device are part of a cached
        signature though the kernel never reads them (checked, not patched)."""
        return ()

    def _fast_out_align(self) -> int:
        return 16

    def _fast_offer(self, xs, args, out):
        """Hand a launched call's cached signature to the C++ path (once per
        signature): its args, and the output's sizes and strides, which must be a
        fresh dense allocation the kernel wrote at ``args.<_out_field>``."""
        sig, self._fast_sig = self._fast_sig, None
        if sig in self._fast_sigs or len(self._fast_sigs) >= 64:
            return
        spec = self._fast_operands()
        # only a launch that read every operand in place stands for its signature
        if spec is None or any(xs[i].data_ptr() != getattr(args, f) for i, f, _ in spec):
            return
        # the C++ path takes tensors and ints (part of the signature), nothing else
        ints = [i for i, x in enumerate(xs) if not isinstance(x, torch.Tensor)]
        if any(type(xs[i]) is not int for i in ints):
            return
        fc = self._fast
        if fc is None:
            module = fast_call.load(block=False)
            if module is None:
                return                       # not built yet: offered again by a later call
            t = type(args)
            fc = module.FastCall(ctypes.cast(self._fn, ctypes.c_void_p).value, ctypes.sizeof(t), len(xs),
                                 [(i, getattr(t, f).offset, a) for i, f, a in spec],
                                 getattr(t, self._out_field).offset, self._fast_out_align(),
                                 t.workspace.offset, t.workspace_bytes.offset,
                                 guards=list(self._fast_guards()), int_inputs=ints)
            fc.set_workspace(self._ws)
            self._fast = fc
            self._sync_fast()
            ops.bind_fast(self)
        self._fast_sigs.add(sig)
        if out.data_ptr() == getattr(args, self._out_field):
            fc.add(xs, bytes(args), out, self._ws_need)      # False: not a dense allocation

    # -- mapping a call onto the C ABI ----------------------------------------------
    # Subclasses set ``_operands`` ((input position, pointer field of the args), ...)
    # and implement ``_map_general(xs)`` -> (out, args, temporaries) or None,
    # ``_map_direct(xs, args, out_shape)`` (set and check the pointers only) and
    # ``_out_shape(out, args)``; or override ``_map`` altogether. A region whose
    # cached path needs more than the output shape overrides ``_direct_entry``.
    _operands = ()

    def _map(self, xs):
        """(out, args, temporaries) for this call, or None when it does not fit the
        kernel (dtype, device, shape, alignment): the caller falls back.

        Calls repeat the same shapes and strides: once a signature has mapped with
        every operand read in place (nothing copied), its args are kept and later
        calls only set and check the pointers.
        """
        sig = tuple((xs[i].shape, xs[i].stride(), xs[i].dtype, xs[i].device) for i, _ in self._operands)
        hit = self._direct.get(sig)
        if hit is not None:
            self._fast_sig = sig if self._fast_installable(hit[1]) else None
            return self._map_direct(xs, *hit)
        self._fast_sig = None
        mapped = self._map_general(xs)
        if (mapped is not None and len(self._direct) < 64
                and all(xs[i].data_ptr() == getattr(mapped[1], f) for i, f in self._operands)):
            entry = self._direct_entry(mapped)
            if entry is not None:
                args = type(mapped[1])()
                ctypes.pointer(args)[0] = mapped[1]
                self._direct[sig] = (args, entry)
                # this very call may stand for the signature in the C++ path too
                self._fast_sig = sig if self._fast_installable(entry) else None
        return mapped

    def _fast_installable(self, entry) -> bool:
        """Whether calls of a cached signature with this ``_direct_entry`` may be
        replayed in C++ (nothing to do after the launch but return the output)."""
        return True

    def _direct_entry(self, mapped):
        """What ``_map_direct`` needs besides the args for this signature (by default
        the output shape), or None when the signature must map in full every call."""
        return self._out_shape(mapped[0], mapped[1])

    def _ws_key(self, args) -> tuple:
        raise NotImplementedError

    def _launched(self, out, keep):
        """The region's result once the kernel is launched (subclasses may finish
        ``out`` on the stream, e.g. rows the kernel does not compute)."""
        return out

    def __call__(self, *xs):
        # without forward hooks, skip nn.Module's call machinery (a few us per call on
        # a slow host): the C++ path below is then the whole cost of a cached call
        if self._forward_pre_hooks or self._forward_hooks or any(_GLOBAL_HOOKS):
            return super().__call__(*xs)
        fast = self._fast
        if fast is not None and not fast.enabled:
            self._sync_fast()             # hooks removed since: the C++ replay may resume
        return self.forward(*xs)

    def forward(self, *xs):
        fast = self._fast
        if fast is not None and not self.verify and not self.disabled:
            out = fast(xs)
            if out is not None:
                return out
        a = xs[self.primary]
        if not a.is_cuda:
            raise DeviceError(_not_on_cuda(self.region.name, a.device))
        if self._fn is None:
            self._bind(a.device)
        self._calls += 1
        if self.disabled:
            self.fallback_calls += 1
            return self.fallback(*xs)
        self._fast_sig = None             # _map sets it for a cached signature
        mapped = self._map(xs)
        if mapped is None:
            self.fallback_calls += 1
            return self.fallback(*xs)
        out, args, keep = mapped   # keep: temporaries that must outlive the launch
        key = self._ws_key(args)
        if key != self._ws_shape:        # workspace size depends on the problem size only
            self._ws_shape, self._ws_need = key, self._ws_fn(ctypes.byref(args))
        need, ws = self._ws_need, None
        if need > 0:
            ws = self._workspace(need, a.device)     # held until the launch
            args.workspace, args.workspace_bytes = ws.data_ptr(), ws.numel()
        else:
            args.workspace, args.workspace_bytes = None, 0
        status = self._fn(ctypes.byref(args), current_stream(a.device.index))
        if status == CO_OK:
            out = self._launched(out, keep)
            if self.verify:
                return self._verified(out, xs)
            if self._fast_sig is not None:
                self._fast_offer(xs, args, out)
            return out
        if status == CO_CANNOT_IMPLEMENT:
            self.fallback_calls += 1
            return self.fallback(*xs)
        raise KernelLaunchError(f"{self.region.name} ({self.kernel.name}): "
                                f"{STATUS_NAMES.get(status, status)}")

    def _workspace(self, need: int, device) -> torch.Tensor:
        """A workspace of at least ``need`` bytes for this launch.

        The region's reused buffer, grown to the next power of two and allocated
        outside any CUDA graph memory pool (``unpooled_empty``). While a graph is
        being captured a too-small buffer is not replaced: the launch gets a
        per-call temporary from the graph's pool. A replaced buffer is kept alive, not
        freed: a graph captured earlier still launches with its address.
        """
        if self._ws is not None and self._ws.numel() >= need:
            return self._ws
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.empty(need, dtype=torch.uint8, device=device)
        if self._ws is not None:
            self._ws_retired.append(self._ws)
        self._ws = unpooled_empty(1 << (need - 1).bit_length(), torch.uint8, device)
        if self._fast is not None:
            self._fast.set_workspace(self._ws)
        return self._ws

    def _verified(self, out, xs):
        """First call in verify mode: compare with the PyTorch subgraph (see
        ``disagreement``); on disagreement warn, keep the PyTorch result and run
        PyTorch for this region from then on."""
        self.verify = False
        ref = self.fallback(*xs)
        why = disagreement(out, ref, VERIFY_TOLERANCE[self.kernel.dtype])
        if why is not None:
            self.disabled = f"verification failed: {why}"
            warnings.warn(f"cutlass_offload: {self.region.name} ({self.kernel.name}) disagrees with "
                          f"PyTorch ({why}); it runs in PyTorch from now on",
                          RuntimeWarning, stacklevel=3)
            return ref
        return out

    def _aligned(self, ptr, align) -> bool:
        return ptr % (align * self._esize) == 0


def _not_on_cuda(region: str, device) -> str:
    """Why a region refuses inputs on ``device``, and what to do: where no CUDA GPU is
    visible, moving the model there is no advice; the folder's reference program (the
    model as exported, co.load's second item) runs anywhere."""
    head = (f"{region}: inputs are on {device}; the compiled model runs its offloaded "
            "regions on a CUDA GPU")
    if not torch.cuda.is_available():
        return (head + ", and this process sees none (torch.cuda.is_available() is False): "
                "run it where one is, or run the model as exported on this device "
                "(co.load(folder)[1], the reference program)")
    return (head + ": move it and its inputs there (model.to('cuda'); a folder: "
            "co.load(folder, device='cuda'))")
