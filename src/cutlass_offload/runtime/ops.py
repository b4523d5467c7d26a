"""An offloaded region as a PyTorch operator: ``torch.ops.cutlass_offload.region_<T>t_<I>i``.

    region_2t_1i(Tensor t0, Tensor t1, SymInt i0, int key) -> Tensor

One generic op per arity (T tensors, I ints; defined on first use), so that
torch.compile / Inductor treat a region as an opaque extern kernel and compile the
PyTorch glue around it (glue.py, backend.py). ``key`` is the id of a registered
region module (``register``); the tensors and ints are its inputs (tensors, and the
SymInts a region reads under dynamic shapes), split by kind. Why one op per arity
rather than one ``(Tensor[] tensors, SymInt[] ints, str key)`` op: a schema of
tensors and ints alone is one Inductor's C++ wrapper calls straight through the
dispatcher (``aoti_torch_call_dispatcher``, its StableIValue path); a ``Tensor[]``
or a ``str`` sends every call back through Python under torch 2.11
(``codecache.custom_op_wrapper``, ~13 us a call on the H200; docs/measured.md,
session 20). The op:

* real impl (CPU and CUDA dispatch keys): calls the region module, so the C++
  call path, the Python mapping and the PyTorch fallback subgraph all keep
  working; launches on the current CUDA stream; returns a fresh tensor (never an
  alias of an input) with exactly the strides the fake impl promised (a cheap
  check, and a copy if a fallback produced another layout). On CUDA the kernel
  is C++ when the C++ call path builds (csrc/fast_call.cpp ``install_region_op``):
  a region binds its key to its FastCall (with the map from the op's tensors
  and ints to its inputs) once a signature is cached, and those calls never enter
  Python (what keeps Inductor's plain-mode glue from paying ~20 us of Python per
  region call); the ints are part of the cached signature. Everything else is
  handed to the Python impl. A key whose output needed a stride fix-up here is
  unbound for good;
* fake impl: the region's fallback subgraph run on the fake inputs gives the
  output's shape and dtype (symbolic shapes included); its strides are the
  region module's own layout (``RegionModule.output_strides``: channels_last for
  conv and group norm, the attention region's out_layout, contiguous otherwise).
  Inductor lays out the buffers after the op from these strides, so they must be
  the real ones;
* tagged ``needs_exact_strides``: Inductor hands the op its inputs with the
  strides they had when traced (what the kernels were chosen for), never a
  padded or re-ordered copy.

Keys are deterministic: a name made of a digest of the region, its kernel, its
fallback code, the module kind and ``LAYOUT_VERSION``, then the region's name; the
op's ``key`` is that name's id (60 bits of its sha256, ``key_id``), so Inductor's
FX-graph cache serves the same compiled glue to a later process that loads the
same library, and never confuses two libraries or two kernel choices. A second
live module with the same name (the same library loaded twice) gets ``#1``,
``#2``, ... appended. The registry holds its entries weakly: whoever holds the
compiled glue holds its ``RegionEntry`` objects (glue.py, backend.py).

``c_shims(arities)`` is Inductor's ``aot_inductor.custom_ops_to_c_shims`` for these ops:
their C shims in the C++ call path's extension, which a C++ wrapper calls without the
dispatcher (glue.REGION_C_SHIMS).

``region_op(T, I)`` defines the op of an arity (once per process, on first use:
importing this module has no side effect).
"""
from __future__ import annotations

import hashlib
import threading
import weakref

import torch

from ..errors import CutlassOffloadError
from . import fast_call

NAMESPACE = "cutlass_offload"
# part of every key: bump when a region module's output layout rule changes, so a
# glue graph compiled (and cached by Inductor) under the old rule is not reused
LAYOUT_VERSION = 1
MAX_STRIDE_CACHE = 64

_registry: "weakref.WeakValueDictionary[int, RegionEntry]" = weakref.WeakValueDictionary()
_registry_lock = threading.Lock()


class RegionEntry:
    """What the op calls for one key.

    module: the RegionModule. order: None when the module's inputs are exactly the
    op's tensors in order, else one ``(is_tensor, index)`` per module input, picking
    from the op's tensors or ints. key: the entry's name (digest/region[#n]); id: the
    op's ``key`` argument for it (``key_id(key)``). n_tensors / n_ints: the op's arity.
    """

    __slots__ = ("module", "order", "key", "id", "n_tensors", "n_ints", "_strides", "cpp",
                 "__weakref__")

    def __init__(self, module, order, key, n_tensors=0, n_ints=0):
        self.module, self.order, self.key = module, order, key
        self.id = key_id(key)
        self.n_tensors, self.n_ints = n_tensors, n_ints
        self._strides = {}
        self.cpp = True               # the C++ kernel may replay this key (see bind_fast)

    def inputs(self, tensors, ints) -> list:
        if self.order is None:
            return tensors
        return [tensors[i] if is_tensor else ints[i] for is_tensor, i in self.order]

    def strides(self, shape) -> tuple:
        """The module's output strides for an output of ``shape`` (cached)."""
        hit = self._strides.get(shape)
        if hit is None:
            hit = tuple(self.module.output_strides(tuple(shape)))
            if len(self._strides) < MAX_STRIDE_CACHE:
                self._strides[tuple(shape)] = hit
        return hit


def key_id(key: str) -> int:
    """The op's int ``key`` for an entry name: the first 60 bits of its sha256 (an
    int64 for every wrapper Inductor emits; deterministic across processes)."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:15], 16)


def op_name(n_tensors: int, n_ints: int) -> str:
    """The op name of an arity: ``region_<T>t_<I>i``."""
    return f"region_{n_tensors}t_{n_ints}i"


def schema(n_tensors: int, n_ints: int) -> str:
    """The op schema of an arity: tensors, then SymInts, then ``int key``."""
    args = ([f"Tensor t{i}" for i in range(n_tensors)] + [f"SymInt i{i}" for i in range(n_ints)]
            + ["int key"])
    return f"{op_name(n_tensors, n_ints)}({', '.join(args)}) -> Tensor"


def contiguous_strides(shape) -> tuple:
    """Row-major strides of ``shape`` (ints or SymInts), as ``torch.empty`` gives them."""
    strides, acc = [], 1
    for d in reversed(tuple(shape)):
        strides.append(acc)
        acc = acc * (max(d, 1) if isinstance(d, int) else d)
    return tuple(reversed(strides))


def channels_last_strides(shape) -> tuple:
    """Strides of a 4-D (N, C, H, W) tensor stored NHWC (channels_last)."""
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def region_digest(module) -> str:
    """16 hex digits that change with anything that changes what the region
    computes, which kernel runs it, or the layout it returns."""
    h = hashlib.sha256()
    for part in (type(module).__name__, repr(module.region), repr(module.kernel),
                 module.fallback.code, str(LAYOUT_VERSION)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def input_kinds(values) -> list | None:
    """Per region input (the ``meta['val']`` of its input nodes): "tensor" or "int";
    None when one is neither (a region the op cannot express)."""
    kinds = []
    for v in values:
        if isinstance(v, torch.Tensor):
            kinds.append("tensor")
        elif isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool):
            kinds.append("int")
        else:
            return None
    return kinds


def register(module, kinds) -> RegionEntry:
    """Register ``module`` under a fresh key; ``kinds`` ("tensor" / "int" per input,
    see ``input_kinds``). Returns the entry, which the caller must keep alive as
    long as graphs calling the key may run."""
    order, nt, ni = [], 0, 0
    for k in kinds:
        if k == "tensor":
            order.append((True, nt))
            nt += 1
        elif k == "int":
            order.append((False, ni))
            ni += 1
        else:
            raise ValueError(f"unknown input kind {k!r}")
    plain = all(is_tensor for is_tensor, _ in order)
    base = f"{region_digest(module)}/{module.region.name}"
    with _registry_lock:
        key, n = base, 0
        while key_id(key) in _registry:
            n += 1
            key = f"{base}#{n}"
        entry = RegionEntry(module, None if plain else tuple(order), key, nt, ni)
        _registry[entry.id] = entry
    module._op_keys[entry.id] = [] if entry.order is None else list(entry.order)
    weakref.finalize(entry, _forget, module, entry.id)
    bind_fast(module)
    return entry


def call(entry: RegionEntry, tensors, ints=()):
    """``entry``'s region through its op (eagerly, or traced under FX / fake modes)."""
    return region_op(entry.n_tensors, entry.n_ints)(*tensors, *ints, entry.id)


def bind_fast(module) -> None:
    """Bind each C++-eligible op key of ``module`` to its FastCall (when both exist),
    so the op's C++ CUDA kernel replays those calls (RegionModule._fast_offer calls
    this once the FastCall is made)."""
    ext = _op_state["cpp"]
    if ext is None or module._fast is None:
        return
    for key, order in module._op_keys.items():
        ext.bind(key, module._fast, order)


def _unbind(key: int) -> None:
    ext = _op_state["cpp"]
    if ext is not None:
        ext.unbind(key)


def _forget(module, key: int) -> None:
    _unbind(key)
    module._op_keys.pop(key, None)


def lookup(key: int) -> RegionEntry:
    """The live entry whose id is ``key``. Raises CutlassOffloadError when there is
    none (its model was freed, or the graph comes from another process's registry)."""
    entry = _registry.get(key)
    if entry is None:
        raise CutlassOffloadError(
            f"cutlass_offload region op: no region module is registered under key {key} (the "
            "compiled model that owned it was freed, or this graph was compiled elsewhere)")
    return entry


def _same_layout(shape, a, b) -> bool:
    # strides of size-1 dims do not matter (Inductor's own stride asserts skip them)
    return all(x == y for s, x, y in zip(shape, a, b) if s != 1)


def _run(tensors, ints, key):
    """The real impl: the region module's call, in the promised layout, fresh (the
    C++ kernel's fallback on CUDA)."""
    entry = lookup(key)
    mod = entry.module
    before = mod.fallback_calls
    out = mod(*entry.inputs(tensors, ints))
    shape = out.shape
    want = entry.strides(shape)
    got = out.stride()
    if got != want and not _same_layout(shape, got, want):
        if entry.cpp:             # the C++ kernel would return the module's layout as is
            entry.cpp = False
            _forget(mod, key)
        return torch.empty_strided(shape, want, dtype=out.dtype, device=out.device).copy_(out)
    if mod.fallback_calls != before and out.numel():
        # PyTorch's subgraph ran: it may hand back a view of an input
        base = out.untyped_storage().data_ptr()
        if any(t.numel() and t.untyped_storage().data_ptr() == base for t in tensors):
            return torch.empty_strided(shape, want, dtype=out.dtype, device=out.device).copy_(out)
    return out


def _fake(tensors, ints, key):
    """The fake impl: shape and dtype from the fallback subgraph on the fake inputs,
    strides from the region module."""
    entry = lookup(key)
    out = entry.module.fallback(*entry.inputs(tensors, ints))
    return out.new_empty_strided(out.shape, entry.module.output_strides(tuple(out.shape)))


_op_state = {"lib": None, "ops": {}, "cpp": None}
_define_lock = threading.Lock()


def region_op(n_tensors: int, n_ints: int = 0):
    """``torch.ops.cutlass_offload.region_<T>t_<I>i.default``, defined on first use."""
    op = _op_state["ops"].get((n_tensors, n_ints))
    if op is None:
        with _define_lock:
            op = _op_state["ops"].get((n_tensors, n_ints))
            if op is None:
                op = _define(n_tensors, n_ints)
                _op_state["ops"][(n_tensors, n_ints)] = op
    return op


def _split(n_tensors: int, n_ints: int, fn):
    """``fn(tensors, ints, key)`` as the op's flat ``(*tensors, *ints, key)`` impl."""
    def impl(*args):
        return fn(list(args[:n_tensors]), list(args[n_tensors:n_tensors + n_ints]), args[-1])
    return impl


def _define(n_tensors: int, n_ints: int):
    if n_tensors < 0 or n_ints < 0:
        raise ValueError(f"region op arity ({n_tensors}, {n_ints})")
    name = op_name(n_tensors, n_ints)
    if _has_op(name):                 # defined by another copy of this module (a reload)
        return getattr(getattr(torch.ops, NAMESPACE), name).default
    if _op_state["lib"] is None:
        _op_state["lib"] = torch.library.Library(NAMESPACE, "FRAGMENT")
    lib = _op_state["lib"]
    lib.define(schema(n_tensors, n_ints), tags=(torch.Tag.needs_exact_strides,))
    # backend keys only (no CompositeExplicitAutograd): the fake impl serves Meta and
    # FakeTensor, and a call skips no more of the dispatcher than it must
    lib.impl(name, _split(n_tensors, n_ints, _run), "CPU")
    ext = fast_call.load(block=True)          # None: turned off, or it failed to build
    if ext is not None and hasattr(ext, "install_region_op"):
        ext.install_region_op(_run, namespace=NAMESPACE, dispatch_key="CUDA", name=name)
        _op_state["cpp"] = ext
    else:
        lib.impl(name, _split(n_tensors, n_ints, _run), "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", _split(n_tensors, n_ints, _fake), lib=lib)
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def _has_op(name: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"{NAMESPACE}::{name}", "CPU")
    except RuntimeError:
        return False


# -- the ops' C shims (csrc/fast_call.cpp) -----------------------------------------------

def shim_declaration(n_tensors: int, n_ints: int, device: str = "cuda") -> str:
    """The C declaration of an arity's shim, as ``aot_inductor.custom_ops_to_c_shims``
    takes it: ``aoti_torch_<device>_region_<T>t_<I>i``, the op's arguments in order
    (tensor handles, int64s, the key), then the output handle."""
    args = ([f"AtenTensorHandle t{i}" for i in range(n_tensors)]
            + [f"int64_t i{i}" for i in range(n_ints)] + ["int64_t key", "AtenTensorHandle* ret0"])
    return f"AOTITorchError aoti_torch_{device}_{op_name(n_tensors, n_ints)}({', '.join(args)})"


class ShimTable(dict):
    """``{OpOverload: [C declaration]}``, Inductor's ``aot_inductor.custom_ops_to_c_shims``
    for region ops. It pickles as its ops' arities and declarations: Inductor pickles its
    config into the FX-graph cache key, and an OpOverload does not pickle (the cache would
    be bypassed; torch 2.13 says "Cannot produce stable cache key for unpicklable type").
    Read-only once made (deepcopy gives itself)."""

    def __reduce__(self):
        items = sorted((k._opname, tuple(v)) for k, v in self.items())
        return (_shim_table_from, (tuple(items),))

    def __deepcopy__(self, memo):
        return self


def _shim_table_from(items) -> ShimTable:
    table = ShimTable()
    for name, decls in items:
        nt, ni = (int(x[:-1]) for x in name[len("region_"):].split("_"))
        table[region_op(nt, ni)] = list(decls)
    return table


def c_shims(arities, device: str = "cuda") -> ShimTable | None:
    """The shim table for the region ops of ``arities`` ((T, I) pairs) whose shims the
    C++ call path exports, or None when it cannot serve them (not built, turned off,
    its symbols not made global). Makes the extension's symbols global first (only
    here: a process that never asks for shims keeps them local). An arity beyond the
    exported ones is left out: Inductor calls it through the dispatcher as before."""
    ext = fast_call.load(block=True)      # at once where the ops were defined already
    if ext is None:
        return None
    max_t, max_i = getattr(ext, "shim_arities", (0, -1))
    ops = {(nt, ni): region_op(nt, ni) for nt, ni in sorted(set(arities))
           if 1 <= nt <= max_t and 0 <= ni <= max_i}
    if _op_state["cpp"] is None or not fast_call.export_symbols(ext):
        return None          # the ops' CUDA kernels are not the C++ call path's
    table = ShimTable()
    for (nt, ni), op in ops.items():
        table[op] = [shim_declaration(nt, ni, device)]
    return table or None
