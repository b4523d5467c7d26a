"""File integrity: sizes and sha256 of the files of output folders and cache
entries, checked before a file is used; a cheap ELF sanity check before a shared
library is handed to the dynamic loader.

A truncated shared library is not an error for ``dlopen``: it maps the file and
the process dies with SIGBUS when a mapped page lies past the end of the file.
So every file is compared with its recorded size and hash first, and a library
whose record is missing (folders and cache entries written before records
existed) at least has its ELF headers checked against its size.

Large files (``PARALLEL_MIN`` bytes and up: an output folder's weights) are
recorded as the sha256 of each ``CHUNK_BYTES`` chunk rather than of the whole file,
so that writing and checking them is spread over several cores (hashlib and
os.pread release the GIL): one sha256 of sd-unet's 1.73 GB took 1.0 s on the 2-core
machine, every load. A load checks them in a child process instead (``in_child``)
while it deserializes the program: threads here would wait for the GIL that the
deserializer holds.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .errors import DamagedFileError, DiskFullError

_CHUNK = 1 << 20
# files of at least PARALLEL_MIN bytes are recorded chunk by chunk (see above)
PARALLEL_MIN = 64 << 20
CHUNK_BYTES = 16 << 20
MIN_CHUNK_BYTES = 4096        # a record asking for smaller chunks is damaged
# (dev, inode, size, mtime_ns, ctime_ns, tag) -> digest(s): a file is hashed once per
# process while it is unchanged (a warm rebuild looks the same objects up often)
_digests: dict = {}
_digests_lock = threading.Lock()


def _memoized(path, tag, compute):
    """``compute(file, stat)`` for ``path`` opened for reading, remembered under the
    file's identity (_digests) and ``tag`` while the file is unchanged."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, tag)
        with _digests_lock:
            hit = _digests.get(ident)
        if hit is not None:
            return hit
        value = compute(f, st)
    with _digests_lock:
        if len(_digests) > 4096:
            _digests.clear()
        _digests[ident] = value
    return value


def sha256_file(path) -> str:
    """Hex sha256 of a file's bytes. Raises OSError."""
    def whole(f, st):
        h = hashlib.sha256()
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
        return h.hexdigest()
    return _memoized(path, None, whole)


def digests_of_chunks(size: int, chunk_bytes: int, feed, threads: int = 8) -> list:
    """Hex sha256 of each ``chunk_bytes`` chunk of ``size`` bytes (the last one
    shorter), in order, by up to ``threads`` threads: ``feed(h, start, end)``
    updates the hash ``h`` with bytes [start, end). The chunked record's format,
    whatever holds the bytes (a file, or weights in memory: weights.py)."""
    def one(start):
        h = hashlib.sha256()
        feed(h, start, min(start + chunk_bytes, size))
        return h.hexdigest()
    starts = range(0, size, chunk_bytes)
    if not starts:
        return []
    with ThreadPoolExecutor(max(1, min(threads, os.cpu_count() or 1, len(starts)))) as pool:
        return list(pool.map(one, starts))


def chunk_digests(path, chunk_bytes: int = CHUNK_BYTES, in_child: bool = False) -> list:
    """Hex sha256 of each ``chunk_bytes`` chunk of a file (the last one shorter), in
    order, read and hashed by up to 8 threads; with ``in_child``, by a child Python
    process (``_digests_in_child``) when one answers. Raises OSError, ValueError for
    a chunk size below MIN_CHUNK_BYTES."""
    if chunk_bytes < MIN_CHUNK_BYTES:
        raise ValueError(f"chunk_bytes must be at least {MIN_CHUNK_BYTES}, got {chunk_bytes}")

    def chunks(f, st):
        fd = f.fileno()
        if in_child:
            got = _digests_in_child(fd, st.st_size, chunk_bytes)
            if got is not None:
                return got

        def feed(h, start, end):
            # read, not mapped: a file cut short meanwhile gives a short read (and
            # another digest), where a mapping would kill the process with SIGBUS
            while start < end:
                block = os.pread(fd, min(_CHUNK * 4, end - start), start)
                if not block:
                    break
                h.update(block)
                start += len(block)
        return tuple(digests_of_chunks(st.st_size, chunk_bytes, feed))
    return list(_memoized(path, chunk_bytes, chunks))


def remember_chunk_digests(path, chunk_bytes: int, digests) -> None:
    """Take ``digests`` as ``chunk_digests(path, chunk_bytes)`` of the file as it is
    now (its identity: device, inode, size and times), for a writer that hashed the
    bytes it wrote from memory. A file changed afterwards is hashed again."""
    st = os.stat(path)
    if -(-st.st_size // chunk_bytes) != len(digests):
        raise ValueError(f"{len(digests)} chunk digests for {st.st_size} bytes in chunks of {chunk_bytes}")
    ident = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, chunk_bytes)
    with _digests_lock:
        _digests[ident] = tuple(digests)


_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hash_child.py")
_HEX64 = re.compile(rb"[0-9a-f]{64}")


def _digests_in_child(fd: int, size: int, chunk_bytes: int) -> tuple | None:
    """The chunk digests of the open file ``fd`` (``size`` bytes) from a child Python
    running hash_child.py on that very descriptor: it shares no GIL with this
    process, and a file cut short under its mapping kills the child, not this
    process. None when there is no Python to run (an embedded interpreter), the
    child fails, or it answers anything but one digest per chunk: the caller then
    hashes here."""
    if size == 0 or not os.path.basename(sys.executable or "").startswith("python"):
        return None
    try:
        res = subprocess.run([sys.executable, "-I", "-S", _CHILD, str(fd), str(size), str(chunk_bytes)],
                             pass_fds=(fd,), stdin=subprocess.DEVNULL, capture_output=True)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    lines = res.stdout.split()
    if res.returncode != 0 or len(lines) != -(-size // chunk_bytes) \
            or not all(_HEX64.fullmatch(line) for line in lines):
        return None
    return tuple(line.decode() for line in lines)


def record(path) -> dict:
    """{"size", "sha256"} of a file, as manifests and cache metadata store it; for a
    file of PARALLEL_MIN bytes or more {"size", "chunk_bytes", "sha256_chunks"}
    (``chunk_digests``)."""
    size = os.stat(path).st_size
    if size >= PARALLEL_MIN:
        return {"size": size, "chunk_bytes": CHUNK_BYTES,
                "sha256_chunks": chunk_digests(path, CHUNK_BYTES)}
    return {"size": size, "sha256": sha256_file(path)}


def records(folder: Path, skip=()) -> dict:
    """record() of every regular file under ``folder`` by its relative POSIX path
    (names in ``skip`` left out)."""
    folder = Path(folder)
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and not p.is_symlink() and rel not in skip:
            out[rel] = record(p)
    return out


def problem(path, rec: dict, in_child: bool = False) -> str | None:
    """What is wrong with ``path`` against its record (a phrase: "is missing",
    "is truncated (10 of 300 bytes)", ...), or None when size and hash match.
    ``in_child``: chunk digests from a child process (``chunk_digests``)."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    want = rec.get("size")
    if want is not None and size != want:
        if size == 0:
            return f"is empty (0 of {want} bytes)"
        if size < want:
            return f"is truncated ({size} of {want} bytes)"
        return f"has {size} bytes where {want} were written"
    if rec.get("sha256") is not None:
        try:
            digest = sha256_file(path)
        except OSError as e:
            return f"cannot be read ({e.strerror or e})"
        if digest != rec["sha256"]:
            return "is corrupted (its sha256 differs from the one recorded when it was written)"
    chunks, step = rec.get("sha256_chunks"), rec.get("chunk_bytes")
    if chunks is not None:
        if not (isinstance(chunks, list) and isinstance(step, int) and step >= MIN_CHUNK_BYTES):
            return "has a damaged record (its chunk digests are unreadable)"
        try:
            digests = chunk_digests(path, step, in_child)
        except OSError as e:
            return f"cannot be read ({e.strerror or e})"
        for i, (got, want) in enumerate(zip(digests, chunks)):
            if got != want:
                return (f"is corrupted (bytes {i * step}-{min((i + 1) * step, size) - 1} differ "
                        "from what was written)")
        if len(digests) != len(chunks):
            return "has a damaged record (its chunk count does not match its size)"
    return None


def check(path, rec: dict, fix: str, in_child: bool = False) -> None:
    """Raise DamagedFileError (naming ``path`` and ``fix``) unless ``path`` matches
    its record (``in_child``: as ``problem`` takes it)."""
    why = problem(path, rec, in_child)
    if why is not None:
        raise DamagedFileError(path, why, fix)


_PT_LOAD, _SHT_NOBITS = 1, 8


def elf_problem(path) -> str | None:
    """Why ``path`` is not a complete ELF file (a phrase), or None. Checks what a
    truncation breaks, without reading the whole file: the header, and that the
    program and section header tables and every loadable segment lie inside it."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            hdr = f.read(64)
            if size == 0:
                return "is empty"
            if len(hdr) < 52 or hdr[:4] != b"\x7fELF" or hdr[4] not in (1, 2) or hdr[5] not in (1, 2):
                return "is not an ELF shared library (bad header)"
            e = "<" if hdr[5] == 1 else ">"
            wide = hdr[4] == 2
            if wide and len(hdr) < 64:
                return f"is truncated ({size} bytes: not even an ELF header)"
            if wide:
                phoff, shoff = struct.unpack_from(e + "QQ", hdr, 32)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", hdr, 54)
            else:
                phoff, shoff = struct.unpack_from(e + "II", hdr, 28)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", hdr, 42)
            for what, off, n, ent in (("program headers", phoff, phnum, phentsize),
                                      ("section headers", shoff, max(shnum, 1 if shoff else 0), shentsize)):
                if n and off + n * ent > size:
                    return f"is truncated ({size} bytes; its {what} end at byte {off + n * ent})"
            if phnum:
                f.seek(phoff)
                table = f.read(phnum * phentsize)
                for i in range(phnum):
                    if wide:
                        p_type, = struct.unpack_from(e + "I", table, i * phentsize)
                        p_offset, = struct.unpack_from(e + "Q", table, i * phentsize + 8)
                        p_filesz, = struct.unpack_from(e + "Q", table, i * phentsize + 32)
                    else:
                        p_type, p_offset = struct.unpack_from(e + "II", table, i * phentsize)
                        p_filesz, = struct.unpack_from(e + "I", table, i * phentsize + 16)
                    if p_type == _PT_LOAD and p_offset + p_filesz > size:
                        return (f"is truncated ({size} bytes; a loadable segment ends at byte "
                                f"{p_offset + p_filesz})")
            if shnum and shentsize:
                f.seek(shoff)
                table = f.read(shnum * shentsize)
                for i in range(shnum):
                    if wide:
                        sh_type, = struct.unpack_from(e + "I", table, i * shentsize + 4)
                        sh_offset, sh_size = struct.unpack_from(e + "QQ", table, i * shentsize + 24)
                    else:
                        sh_type, = struct.unpack_from(e + "I", table, i * shentsize + 4)
                        sh_offset, sh_size = struct.unpack_from(e + "II", table, i * shentsize + 16)
                    if sh_type != _SHT_NOBITS and sh_offset + sh_size > size:
                        return f"is truncated ({size} bytes; a section ends at byte {sh_offset + sh_size})"
    except FileNotFoundError:
        return "is missing"
    except (OSError, struct.error) as err:
        return f"cannot be read ({getattr(err, 'strerror', None) or err})"
    return None


def is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full(e: OSError, path, hint: str) -> DiskFullError:
    """The DiskFullError for an ENOSPC / EDQUOT ``e`` raised while writing ``path``."""
    return DiskFullError(getattr(e, "filename", None) or path, hint)
