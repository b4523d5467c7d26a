"""Build tier: build/nvcc_steps.py against nvcc itself on a small CUDA unit with a
kernel in an anonymous namespace (an internal-linkage name, which carries the
module id). The steps' object has nvcc's symbols and the same device code, with
the module id both sides read in place of nvcc's; no GPU needed."""
import re
import shutil
import subprocess

import pytest

from cutlass_offload.build import nvcc_steps, toolchain

pytestmark = pytest.mark.build

SOURCE = """\
namespace {
__global__ void scale(float* x, float s) { x[threadIdx.x] *= s; }
}
__global__ void shift(float* x) { x[threadIdx.x] += 1.0f; }
extern "C" int co_launch(float* x) {
  scale<<<1, 32>>>(x, 2.0f);
  shift<<<1, 32>>>(x);
  return 0;
}
"""


def _section(obj, tmp_path, name):
    out = tmp_path / f"{obj.stem}.{name.strip('.')}"
    subprocess.run(["objcopy", "-O", "binary", f"--only-section={name}", str(obj), str(out)],
                   check=True)
    return out.read_bytes()


def test_steps_object_matches_nvcc_but_for_the_module_id(tmp_path):
    nvcc = toolchain.find_nvcc()
    if shutil.which("objcopy") is None or shutil.which("nm") is None:
        pytest.skip("binutils needed")
    src = tmp_path / "unit.cu"
    src.write_text(SOURCE)
    base = [nvcc, "-std=c++17", "-O3", "-Xcompiler=-fPIC", "-gencode=arch=compute_90a,code=sm_90a",
            "-c", "-t2", str(src)]
    ref, ours = tmp_path / "ref.o", tmp_path / "ours.o"
    (tmp_path / "kref").mkdir()
    (tmp_path / "kours").mkdir()
    subprocess.run(base + ["-o", str(ref), "--keep", "--keep-dir", str(tmp_path / "kref")], check=True)
    res = nvcc_steps.run(base + ["-o", str(ours)], src, tmp_path / "log", keep_dir=tmp_path / "kours")
    assert res is not None and res.ok, res and res.log
    assert res.returncodes == (0,) * len(nvcc_steps.RECIPE)
    ours_id = nvcc_steps.module_id(src)
    nv_id = (tmp_path / "kref" / "unit.module_id").read_text().strip()
    assert (tmp_path / "kours" / "unit.module_id").read_text() == ours_id != nv_id

    # the same device code: nvcc's PTX with its module id where ours has ours
    ours_ptx = (tmp_path / "kours" / "unit.ptx").read_text()
    ref_ptx = (tmp_path / "kref" / "unit.ptx").read_text()
    assert ours_id[1:] in ours_ptx                 # the anonymous namespace's kernel
    assert id_free(ours_ptx, ours_id) == id_free(ref_ptx, nv_id)

    # the same host symbols, the internal-linkage ones under our module id
    def symbols(obj):
        names = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
        return sorted(line.split()[-1] for line in names.splitlines())
    ours_syms, ref_syms = symbols(ours), symbols(ref)
    assert "co_launch" in ours_syms and len(ours_syms) == len(ref_syms)
    assert [s for s in ours_syms if ours_id[1:] in s]
    # (numbers out too: mangled length prefixes of names holding the id change with it)
    assert sorted(re.sub(r"\d+", "#", id_free(s, ours_id)) for s in ours_syms) == \
        sorted(re.sub(r"\d+", "#", id_free(re.sub(r"tmpxft_\w+?_6_", "", s), nv_id))
               for s in ref_syms)
    # and the device code is what the object embeds
    assert ours_id[1:].encode() in _section(ours, tmp_path, ".nv_fatbin")


def id_free(text, module_id):
    """``text`` with the module id (and the length prefix of a mangled name that holds
    it, which changes with the id's length) replaced by a fixed string."""
    mid = re.escape(module_id[1:])
    text = re.sub(r"\d+(_GLOBAL__N__|_INTERNAL_)" + mid, r"L\1ID", text)
    return text.replace(module_id[1:], "ID")
