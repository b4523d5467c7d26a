"""The C++ call path (runtime/fast_call.py) without a GPU: the extension built
against this PyTorch, a fake launcher that records the args it is given, and a
check that a replayed call hands the launcher exactly what the Python mapping would."""
import ctypes
import subprocess
from pathlib import Path

from cutlass_offload.runtime import fast_call

# int co_fake(const void* args, void* stream): records the args and the stream,
# returns the status set with co_fake_set_status (0 = ok)
FAKE_LAUNCHER = r"""
#include <string.h>
static unsigned char last[1024];
static void* last_stream;
static int status, count;
int co_fake(const void* args, void* stream) {
  memcpy(last, args, sizeof(last)); last_stream = stream; ++count; return status;
}
const void* co_fake_last(void) { return last; }
void* co_fake_stream(void) { return last_stream; }
int co_fake_count(void) { return count; }
void co_fake_set_status(int s) { status = s; }
"""


class FakeLauncher:
    """A C function with a region launcher's signature (ctypes, from a tiny .so)."""

    def __init__(self, folder: Path):
        src, lib = folder / "fake.c", folder / "libfake.so"
        src.write_text(FAKE_LAUNCHER)
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
        self.dll = ctypes.CDLL(str(lib))
        self.fn = self.dll.co_fake
        self.fn.restype = ctypes.c_int
        self.address = ctypes.cast(self.fn, ctypes.c_void_p).value
        self.dll.co_fake_last.restype = ctypes.c_void_p
        self.dll.co_fake_stream.restype = ctypes.c_void_p

    def last_args(self, args_type):
        """The last args struct the launcher received, as ``args_type``."""
        return args_type.from_buffer_copy(ctypes.string_at(self.dll.co_fake_last(), ctypes.sizeof(args_type)))

    @property
    def count(self) -> int:
        return self.dll.co_fake_count()

    def set_status(self, status: int):
        self.dll.co_fake_set_status(status)


def fast_call_module():
    """The built extension (fails the test when it cannot be built)."""
    module = fast_call.load(block=True)
    assert module is not None, fast_call.error()
    return module


def masked(args, fields=("workspace", "workspace_bytes")) -> bytes:
    """The raw bytes of an args struct with ``fields`` zeroed."""
    t = type(args)
    copy = t.from_buffer_copy(bytes(args))
    for f in fields:
        setattr(copy, f, 0 if f == "workspace_bytes" else None)
    return bytes(copy)


def replay_matches_python(mod, xs, ys, fake: FakeLauncher) -> bool:
    """Run region module ``mod``'s call path as forward does, on CPU tensors with the
    fake launcher: ``xs`` maps in Python (the full mapping, which stores the signature
    and offers it to the C++ path); ``ys`` (fresh tensors of the same signature) is
    replayed in C++. Asserts that the launcher then receives byte for
    byte the args the full Python mapping of ``ys`` builds, except the output pointer
    (a fresh allocation) and the workspace, and that the result has the Python
    result's shape, strides and dtype. False when the region's signature is not
    replayed in C++ (copied operands, a bias tensor, work after the launch)."""
    fast_call_module()
    mod._fn, mod._ws, mod._ws_need = fake.fn, None, 0
    mod._direct.clear()
    mod._fast, mod._fast_sigs = None, set()
    mapped = mod._map(xs)              # the first call maps in full and stores the signature
    assert mapped is not None, mod.region.name
    if mod._fast_sig is None:
        return False
    out = mod._launched(mapped[0], mapped[2])
    mod._fast_offer(xs, mapped[1], out)
    if mod._fast is None or mod._fast.entries == 0:
        return False
    want = mod._map_general(ys)
    assert want is not None, mod.region.name
    w_out = mod._launched(want[0], want[2])
    before = fake.count
    got = mod._fast(ys)
    assert got is not None and fake.count == before + 1, mod.region.name
    sent = fake.last_args(type(want[1]))
    field = mod._out_field
    assert getattr(sent, field) == got.data_ptr(), mod.region.name
    skip = ("workspace", "workspace_bytes", field)
    assert masked(sent, skip) == masked(want[1], skip), mod.region.name
    assert (got.shape, got.stride(), got.dtype) == (w_out.shape, w_out.stride(), w_out.dtype), mod.region.name
    assert fake.dll.co_fake_stream() is None            # CPU tensors: no stream
    return True
