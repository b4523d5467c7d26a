"""prelude.h's CoParamsCache (the launchers' Params of recent calls) compiled and run
on the host, no GPU: a call hits only on byte-equal arguments (every field counts,
CoGemmArgs' tail padding does not), the 16 most recent survive, the oldest are
replaced first, and a stored Params comes back byte for byte. The emitters' use of
it is checked in tests/unit/test_params_cache_emit.py; GPU calls in
tests/gpu/test_params_cache.py."""
import subprocess

import pytest

from cutlass_offload.build.toolchain import find_nvcc
from cutlass_offload.emit import TEMPLATES

pytestmark = pytest.mark.build

PROGRAM = r"""
#include <cstdio>
#include <cstring>
#include "prelude.h"

struct Params { alignas(64) unsigned char tma[128]; int64_t m; void* d; };

static CoGemmArgs args(int i) {
  CoGemmArgs a;
  std::memset(&a, 0, sizeof(a));
  a.m = 128; a.n = 256; a.k = 64; a.l = 1;
  a.d = reinterpret_cast<void*>(uintptr_t(0x10000) * (i + 1));
  return a;
}

static Params params(int i) {
  Params p;
  std::memset(&p, 0, sizeof(p));
  for (int j = 0; j < 128; ++j) p.tma[j] = static_cast<unsigned char>(i * 7 + j);
  p.m = 1000 + i;
  p.d = args(i).d;
  return p;
}

int main() {
  CoParamsCache<CoGemmArgs, Params> cache;
  std::printf("empty %d\n", int(cache.find(args(0)).has_value()));
  for (int i = 0; i < 20; ++i) cache.put(args(i), params(i));
  int hits = 0, exact = 0;
  for (int i = 0; i < 20; ++i) {
    auto p = cache.find(args(i));
    if (p) {
      ++hits;
      Params want = params(i);
      exact += std::memcmp(&*p, &want, sizeof(Params)) == 0;
      if (i < 4) std::printf("evicted %d hit\n", i);
    }
  }
  std::printf("hits %d exact %d\n", hits, exact);
  // every field is part of the key; the tail padding is not
  CoGemmArgs a = args(19);
  a.pdl = 1;
  std::printf("pdl %d\n", int(cache.find(a).has_value()));
  a = args(19);
  a.workspace_bytes = 16;
  std::printf("workspace_bytes %d\n", int(cache.find(a).has_value()));
  a = args(19);
  a.batch_stride_d = 1;
  std::printf("batch_stride_d %d\n", int(cache.find(a).has_value()));
  a = args(19);
  std::memset(reinterpret_cast<char*>(&a) + offsetof(CoGemmArgs, pdl) + sizeof(int32_t), 0x5a,
              sizeof(CoGemmArgs) - offsetof(CoGemmArgs, pdl) - sizeof(int32_t));
  std::printf("padding %d\n", int(cache.find(a).has_value()));
  // the next put replaces the oldest survivor (args 4), not the newest
  cache.put(args(20), params(20));
  std::printf("after put: 4 %d 5 %d 20 %d\n", int(cache.find(args(4)).has_value()),
              int(cache.find(args(5)).has_value()), int(cache.find(args(20)).has_value()));
  return 0;
}
"""

EXPECTED = """empty 0
hits 16 exact 16
pdl 0
workspace_bytes 0
batch_stride_d 0
padding 1
after put: 4 0 5 1 20 1
"""


def test_params_cache_keys_on_every_argument_byte(tmp_path):
    src, exe = tmp_path / "cache.cu", tmp_path / "cache"
    src.write_text(PROGRAM)
    subprocess.run([find_nvcc(), "-std=c++17", "-I", str(TEMPLATES), str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    assert got == EXPECTED
