"""The ctypes mirrors of the C ABI (runtime/library.py) against prelude.h, as the
host compiler lays the structs out: every field's offset and every struct's size
(a field added on one side only would shift every field after it)."""
import ctypes
import subprocess

import pytest

from cutlass_offload.build.toolchain import find_nvcc
from cutlass_offload.emit import TEMPLATES
from cutlass_offload.runtime.library import ARGS_TYPES

pytestmark = pytest.mark.build


def test_ctypes_structs_match_prelude_h(tmp_path):
    lines = ['#include <cstddef>', '#include <cstdio>', '#include "prelude.h"', "int main() {"]
    expected = []
    for name, struct in ARGS_TYPES.items():
        lines.append(f'  std::printf("{name} %zu\\n", sizeof({name}));')
        expected.append(f"{name} {ctypes.sizeof(struct)}")
        for field, _ in struct._fields_:
            lines.append(f'  std::printf("{name}.{field} %zu\\n", offsetof({name}, {field}));')
            expected.append(f"{name}.{field} {getattr(struct, field).offset}")
    lines += ["  return 0;", "}"]
    src, exe = tmp_path / "layout.cu", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([find_nvcc(), "-std=c++17", "-I", str(TEMPLATES), str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    assert [l for l in got if l] == expected
