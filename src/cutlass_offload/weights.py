"""An output folder's weights beside its program, not inside it: ``weights.bin``
holds the raw bytes of every distinct storage of the ExportedProgram's parameters,
buffers and tensor constants (each ``ALIGN``-byte aligned), ``weights.json`` says
where each tensor lies in it, and ``model.pt2`` holds the program with meta
tensors in their place.

Why: ``torch.export.save`` copies each storage into a ``bytes`` object and writes it
through its zip archive writer; that was 7.5 s of sd-unet's 12.4 s warm compile
(1.73 GB) on the H200 host, and its loader reads every record back (2.0 s of a
7.8 s load on the 2-core machine). Written raw, the weights cost one write each;
loaded, they are views of one private, read-only-backed memory map of the file
(``torch.from_file``, shared=False: pages are read when first touched, by the copy
to the GPU, and writes to them never reach the file). A save that replaces a folder
whose weights.bin holds the very bytes links that file instead of writing it
(``write``'s ``previous``; the bytes are checked, not the record trusted).

weights.json (``FORMAT`` 1)::

    {"format": 1, "bytes": total size of weights.bin,
     "storages": [[offset, nbytes], ...],
     "tensors": [{"kind": "state_dict" | "constants", "name", "storage",
                  "dtype" (torch attribute name, "float16"), "shape", "stride",
                  "storage_offset" (elements), "device" (where it was exported),
                  "parameter" (bool), "requires_grad" (bool)}, ...]}

Tensors sharing a storage (tied weights, views) share it again after loading.
Weights left on the CPU stay a mapping of the file, read page by page after the
folder's checks: a later save swaps a new folder in by rename and never touches
this file, but a file edited or truncated in place under a loaded model is not
checked again (a truncation kills the process with SIGBUS, as for the library).
A program with any other kind of tensor (a subclass, sparse, quantized, on the
meta device) is saved whole by ``torch.export.save`` (``split`` returns None).
"""
from __future__ import annotations

import copy
import ctypes
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from . import integrity
from .errors import DamagedFileError, DeviceError

BIN = "weights.bin"
INDEX = "weights.json"
FORMAT = 1
ALIGN = 64        # bytes: every storage starts at a multiple (the widest dtype's and cache lines')
_KINDS = ("state_dict", "constants")


def _plain(t) -> bool:
    # a pending conjugate / negation is a flag beside the bytes: not stored here
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
            and not t.is_quantized and t.device.type != "meta" and not t.is_conj()
            and not t.is_neg())


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    m = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    if isinstance(t, torch.nn.Parameter):
        return torch.nn.Parameter(m, requires_grad=t.requires_grad)
    return m


def split(ep: torch.export.ExportedProgram):
    """(program, tensors): a shallow copy of ``ep`` whose parameters, buffers and
    tensor constants are meta tensors of the same shape, strides and dtype (and
    without its example inputs, which the folder's inputs.pt holds), and
    [(kind, name, tensor)] of the real ones; None when a tensor is of a kind this
    format does not store (see the module docstring) or the program's layout is
    not the one this was written for. ``ep`` itself is not changed."""
    tables = {"state_dict": getattr(ep, "_state_dict", None), "constants": getattr(ep, "_constants", None)}
    if not all(isinstance(t, dict) for t in tables.values()):
        return None
    tensors = []
    for kind, table in tables.items():
        for name, t in table.items():
            if isinstance(t, torch.Tensor):
                if not _plain(t):
                    return None
                tensors.append((kind, name, t))
    stripped = copy.copy(ep)
    if hasattr(stripped, "_example_inputs"):
        stripped._example_inputs = None     # inputs.pt holds them: not a second copy
    for kind, table in tables.items():
        setattr(stripped, "_" + kind, {n: _meta_like(t) if isinstance(t, torch.Tensor) else t
                                       for n, t in table.items()})
    return stripped, tensors


def _layout(tensors):
    """(storages, spans, entries, total bytes) of weights.bin for ``tensors``: one
    span per start address, as long as the longest storage starting there (two
    storages may share a start and differ in length: frombuffer views of one buffer)."""
    longest = {}
    for _, _, t in tensors:
        st = t.untyped_storage()
        key = (t.device, st.data_ptr())
        if key not in longest or st.nbytes() > longest[key].nbytes():
            longest[key] = st
    index_of, spans, entries = {}, [], []
    offset = 0
    for key, st in longest.items():
        index_of[key] = len(spans)
        spans.append([offset, st.nbytes()])
        offset += -(-st.nbytes() // ALIGN) * ALIGN
    for kind, name, t in tensors:
        key = (t.device, t.untyped_storage().data_ptr())
        entries.append({"kind": kind, "name": name, "storage": index_of[key],
                        "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                        "stride": list(t.stride()), "storage_offset": t.storage_offset(),
                        "device": str(t.device), "parameter": isinstance(t, torch.nn.Parameter),
                        "requires_grad": bool(t.requires_grad)})
    return list(longest.values()), spans, entries, offset


def _bytes(st) -> memoryview:
    """The bytes of a CPU storage, without a copy (the storage must outlive the view)."""
    n = st.nbytes()
    return memoryview((ctypes.c_char * n).from_address(st.data_ptr())) if n else memoryview(b"")


def _stream_digests(storages, spans, total: int, chunk_bytes: int, threads: int = 8) -> list:
    """integrity.chunk_digests of the weights.bin ``write`` would write, computed
    from the storages in memory (CPU copies of device ones) by ``threads`` threads."""
    views = [_bytes(st if st.device.type == "cpu" else st.cpu()) for st in storages]

    def feed(h, at, end):
        for (offset, nbytes), view in zip(spans, views):
            lo, hi = max(at, offset), min(end, offset + nbytes)
            if hi <= lo:
                continue
            if lo > at:
                h.update(bytes(lo - at))          # the alignment padding before this storage
            h.update(view[lo - offset:hi - offset])
            at = hi
        if end > at:
            h.update(bytes(end - at))
    return integrity.digests_of_chunks(total, chunk_bytes, feed, threads)


def _free_host_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _fits(record, total: int) -> bool:
    """Whether a manifest record could describe the weights.bin ``write`` would write:
    its size and a chunked record (the cheap test before any hashing)."""
    return (isinstance(record, dict) and record.get("size") == total
            and isinstance(record.get("sha256_chunks"), list)
            and record.get("chunk_bytes") == integrity.CHUNK_BYTES)


def _reused(storages, spans, total: int, folder: Path, previous) -> bool:
    """Whether one of ``previous`` ([(weights.bin of an earlier save, its manifest
    record)], in order) holds the bytes ``write`` would write, and is now hard-linked
    into ``folder``: its record must give the same size and chunk digests as the
    storages in memory (hashed once, and only if some record has the size), and the
    linked file is hashed again before it is kept (a damaged or replaced file is
    unlinked, and the next candidate or the caller's write follows)."""
    previous = [(Path(p), r) for p, r in previous if _fits(r, total)]
    if not previous:
        return False
    on_device = sum(st.nbytes() for st in storages if st.device.type != "cpu")
    if on_device and on_device > _free_host_bytes() // 2:
        return False             # hashing device weights copies them all to the host at once
    want = _stream_digests(storages, spans, total, integrity.CHUNK_BYTES)
    target = folder / BIN
    for path, record in previous:
        if record["sha256_chunks"] != want:
            continue
        try:
            os.link(path, target)
        except OSError:          # gone meanwhile, another file system, no hard links
            continue
        try:
            if os.stat(target).st_size == total and integrity.chunk_digests(target, integrity.CHUNK_BYTES) == want:
                return True
        except OSError:
            pass
        target.unlink()
    return False


class Cancelled(Exception):
    """``write`` stopped because its ``cancel`` event was set (the save was discarded)."""


def write(tensors, folder, previous=(), cancel=None) -> bool:
    """Write ``tensors`` ([(kind, name, tensor)], from ``split``) as weights.bin and
    weights.json into ``folder``. ``previous``: earlier saves' weights.bin files with
    their manifest records ([(path, record)], integrity.record's chunked form, which
    files of integrity.PARALLEL_MIN bytes and more get; smaller ones are written),
    the folder being replaced first, then recently saved ones (recent_folders.py);
    the first that holds the very bytes (same size and chunk digests, checked again
    on the file) is hard-linked instead of written: a warm recompile into the same
    folder, or into a new one beside an earlier save of the same model, writes none
    of the weights (sd-unet's 1.73 GB took 5.9 s to write on the 2-core machine;
    hashing them in memory and the file about 1 s). Returns whether one was.
    A written file's chunk digests (integrity.record's, for a file of PARALLEL_MIN
    bytes or more) are computed from memory during the write and remembered for it
    (integrity.remember_chunk_digests), so the manifest's record does not read it back.
    ``cancel``: a threading.Event checked between storages (a discarded save need not
    wait for the whole file). Raises OSError (ENOSPC for a full disk), Cancelled."""
    folder = Path(folder)
    storages, spans, entries, total = _layout(tensors)
    reused = _reused(storages, spans, total, folder, previous)
    if not reused:
        on_device = sum(st.nbytes() for st in storages if st.device.type != "cpu")
        # a file the folder's manifest records chunk by chunk is hashed from memory while
        # it is written (hashlib and writes release the GIL), not read back afterwards;
        # device weights then need host copies of all of them at once, so only where the
        # host has room (else each is copied as it is written, and the record reads the file)
        at_once = total >= integrity.PARALLEL_MIN and (
            not on_device or on_device <= _free_host_bytes() // 2)
        hosts = [st if st.device.type == "cpu" or not at_once else st.cpu() for st in storages]
        hashing = None
        if at_once:
            pool = ThreadPoolExecutor(1, thread_name_prefix="co-weights-hash")
            # one thread: it runs beside the write and the compile, so more would only
            # take the GIL from them (on 2 cores partition ran 4x slower with 8)
            hashing = pool.submit(_stream_digests, hosts, spans, total, integrity.CHUNK_BYTES, 1)
            pool.shutdown(wait=False)
        # (on an error the hashing thread finishes alone: it holds its own references)
        with open(folder / BIN, "wb") as f:
            for (start, nbytes), host in zip(spans, hosts):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(f"writing {folder / BIN} was cancelled")
                if f.tell() != start:
                    f.write(b"\0" * (start - f.tell()))
                if nbytes:
                    host = host if host.device.type == "cpu" else host.cpu()   # alive while written
                    f.write(_bytes(host))
            f.truncate(total)
        digests = hashing.result() if hashing is not None else None
        if digests is not None:
            integrity.remember_chunk_digests(folder / BIN, integrity.CHUNK_BYTES, digests)
    index = {"format": FORMAT, "bytes": total, "storages": spans, "tensors": entries}
    (folder / INDEX).write_text(json.dumps(index))
    return reused


def attach(ep: torch.export.ExportedProgram, folder, device=None) -> None:
    """Put the tensors of ``folder``'s weights.bin into ``ep`` (loaded from its
    model.pt2), in place of its meta tensors: on ``device`` (a torch.device; one
    copy per storage, so shared storages stay shared), or with None on the device
    each was exported from (a CPU tensor stays a view of the memory map).

    Raises DeviceError when a tensor's device is not available here,
    DamagedFileError when weights.json is unreadable, of another format, or does
    not describe the program's meta tensors (names, shapes, dtypes, extents inside
    weights.bin). The files' bytes are checked against the manifest first
    (``folder.check_folder``)."""
    folder = Path(folder)
    path = folder / INDEX
    fix = f"compile the model again into {folder}"
    try:
        index = json.loads(path.read_text())
        if index.get("format") != FORMAT:
            raise DamagedFileError(path, f"has format {index.get('format')!r}, this package "
                                         f"reads {FORMAT}", fix)
        total, spans, entries = int(index["bytes"]), index["storages"], index["tensors"]
    except DamagedFileError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DamagedFileError(path, f"is unreadable ({e})", fix) from None
    size = os.path.getsize(folder / BIN)
    if size != total:
        raise DamagedFileError(folder / BIN, f"has {size} bytes where {total} were written", fix)
    blob = (torch.from_file(str(folder / BIN), shared=False, size=total, dtype=torch.uint8)
            if total else torch.empty(0, dtype=torch.uint8))
    tables = {"state_dict": ep._state_dict, "constants": ep._constants}
    placed = {}       # (storage, device) -> that storage's bytes (uint8) there
    for e in entries:
        try:
            kind, name = e["kind"], e["name"]
            old = tables[kind][name]
            dtype = getattr(torch, e["dtype"])
            start, nbytes = (int(v) for v in spans[e["storage"]])
            shape, stride, offset = list(e["shape"]), list(e["stride"]), int(e["storage_offset"])
            if not (isinstance(old, torch.Tensor) and old.device.type == "meta"
                    and list(old.shape) == shape and old.dtype == dtype):
                raise ValueError(f"{kind} entry {name!r} does not match the program")
            numel = nbytes // dtype.itemsize
            last = offset + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else offset - 1
            if not (0 <= start and start + nbytes <= total and start % dtype.itemsize == 0
                    and offset >= 0 and min(stride, default=0) >= 0 and last < numel):
                raise ValueError(f"{kind} entry {name!r} lies outside its storage")
            where = torch.device(e["device"]) if device is None else device
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as err:
            raise DamagedFileError(path, f"does not describe model.pt2's tensors ({err})", fix) from None
        key = (e["storage"], where)
        if key not in placed:           # one copy per storage: shared stays shared, any dtype
            raw = blob[start:start + nbytes]
            if where.type != "cpu":
                try:
                    raw = raw.to(where)
                except (RuntimeError, AssertionError) as err:
                    said = ("was exported there" if device is None else "was asked for")
                    raise DeviceError(f"{folder}: the device {where} {said}, and this machine "
                                      f"cannot use it ({err}); pass another device to load") from None
            placed[key] = raw
        base = placed[key][:numel * dtype.itemsize].view(dtype)
        t = base.as_strided(shape, stride, base.storage_offset() + offset)
        grad = bool(e["requires_grad"])
        if e["parameter"]:
            t = torch.nn.Parameter(t, requires_grad=grad)
        elif grad and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_(True)        # a buffer that required grad when exported
        tables[kind][name] = t
    left = [f"{k}:{n}" for k in _KINDS for n, t in tables[k].items()
            if isinstance(t, torch.Tensor) and t.device.type == "meta"]
    if left:
        raise DamagedFileError(path, f"lacks {len(left)} of the program's tensors ({left[0]}, ...)", fix)
