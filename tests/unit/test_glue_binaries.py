"""An output folder carries its glue's compiled C++ wrapper (runtime/glue_binaries.py),
and a load in a process with an empty Inductor cache puts it where the wrapper's
compile finds it. Inductor glue with its C++ wrapper on the CPU (a model without
regions), each step in a fresh process with its own TORCHINDUCTOR_CACHE_DIR: the
save, the load with the binaries (no compile of the wrapper's main.cpp) and, as the
control, the load with them withheld (the wrapper compiles). Plus the install's
guards, on hand-made tars."""
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap

import pytest
import torch

from cutlass_offload.runtime import glue_binaries

SAVE = textwrap.dedent("""
    import sys, torch
    from cutlass_offload import folder
    from cutlass_offload.api import compile_captured
    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions, options_for_glue
    from cutlass_offload.runtime.glue import GlueSpec

    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.sin(x) * 2 + y.cos()

    inputs = (torch.randn(8, 16), torch.randn(8, 16))
    cap = capture(M(), inputs)
    options = options_for_glue(CompileOptions(arch="sm90a"), "inductor")
    compiled = compile_captured(cap, options, glue="inductor", inductor_options={"cpp_wrapper": True})
    compiled(*inputs)                                  # Inductor compiles the glue here
    assert compiled.inductor.used_options.get("cpp_wrapper"), compiled.inductor.used_options
    assert compiled.inductor.cpp_wrapper_keys, "no C++ wrapper recorded"
    folder.save(compiled, cap, inputs, options, sys.argv[1], GlueSpec("inductor", None, {"cpp_wrapper": True}))
""")

LOAD = textwrap.dedent("""
    import json, sys, torch
    from torch._inductor import cpp_builder
    import cutlass_offload as co
    from cutlass_offload.runtime import glue_binaries
    mains = []
    real = cpp_builder.CppBuilder.build
    def build(self, *a, **k):
        cmd = self.get_command_line()
        if ".main.cpp" in cmd and " -E " not in cmd:
            mains.append(cmd[-120:])
        return real(self, *a, **k)
    cpp_builder.CppBuilder.build = build
    if sys.argv[2] == "withheld":
        glue_binaries.install = lambda *a: 0
    compiled, _, inputs = co.load(sys.argv[1])
    x, y = inputs
    x.normal_(), y.normal_()                            # fresh inputs, same shapes
    torch.testing.assert_close(compiled(x, y), torch.sin(x) * 2 + y.cos())
    print(json.dumps({"glue": compiled.glue, "mains": mains,
                      "cpp": bool(compiled.inductor.used_options.get("cpp_wrapper"))}))
""")


def _run(code, args, cache):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), CUTLASS_OFFLOAD_FAST_CALL="0")
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1]) if r.stdout.strip() else {}


def test_a_load_finds_the_folders_compiled_wrapper(tmp_path):
    out = tmp_path / "out"
    _run(SAVE, [out], tmp_path / "inductor_save")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["glue_binaries"] == glue_binaries.GLUE_BINARIES
    assert glue_binaries.GLUE_BINARIES in manifest["files"]       # checked like every file
    assert manifest["glue_kernel_files"] == []                    # a CPU wrapper loads no kernel file
    names = glue_binaries.member_names(out / glue_binaries.GLUE_BINARIES)
    assert any(n.endswith(".main.so") for n in names), names
    served = _run(LOAD, [out, "served"], tmp_path / "inductor_a")
    withheld = _run(LOAD, [out, "withheld"], tmp_path / "inductor_b")
    assert served["glue"] == withheld["glue"] == "inductor" and served["cpp"] and withheld["cpp"]
    assert served["mains"] == [], served
    assert withheld["mains"], withheld


def _tar(path, members):
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


KEY = "c" + "a1" * 20


def test_install_places_only_missing_wrapper_binaries(tmp_path, monkeypatch):
    monkeypatch.setattr(glue_binaries, "inductor_cache_dir", lambda: tmp_path / "cache")
    existing = tmp_path / "cache" / KEY[1:3] / f"{KEY}.main.o"
    existing.parent.mkdir(parents=True)
    existing.write_bytes(b"mine")
    _tar(tmp_path / "b.tar", {f"{KEY[1:3]}/{KEY}.main.so": b"so", f"{KEY[1:3]}/{KEY}.main.o": b"theirs",
                              "../escape.main.so": b"x", f"{KEY[1:3]}/{KEY}.main.cpp": b"src",
                              f"zz/{KEY}.main.so": b"another key's folder"})
    placed = glue_binaries.install(tmp_path / "b.tar", torch.__version__)
    so = tmp_path / "cache" / KEY[1:3] / f"{KEY}.main.so"
    assert so.read_bytes() == b"so" and os.access(so, os.X_OK)
    assert existing.read_bytes() == b"mine"                      # never overwritten
    assert not (tmp_path / "escape.main.so").exists() and not (tmp_path / "cache" / "escape.main.so").exists()
    assert not (tmp_path / "cache" / KEY[1:3] / f"{KEY}.main.cpp").exists()
    assert not (tmp_path / "cache" / "zz").exists()
    assert placed == 1
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_install_skips_another_torch_and_warns_on_a_damaged_tar(tmp_path, monkeypatch):
    monkeypatch.setattr(glue_binaries, "inductor_cache_dir", lambda: tmp_path / "cache")
    _tar(tmp_path / "b.tar", {f"{KEY[1:3]}/{KEY}.main.so": b"so"})
    assert glue_binaries.install(tmp_path / "b.tar", "0.0.0") == 0
    assert not (tmp_path / "cache").exists()
    (tmp_path / "bad.tar").write_bytes(b"not a tar at all" * 10)
    with pytest.warns(RuntimeWarning, match="first call compiles it"):
        assert glue_binaries.install(tmp_path / "bad.tar", torch.__version__) == 0


def test_no_binaries_without_a_cpp_wrapper(tmp_path):
    class Ind:
        first_call_s, failed, cpp_wrapper_keys = 1.0, None, set()

    class Compiled:
        inductor = Ind()

    assert glue_binaries.save_for(Compiled(), tmp_path) is None
    Ind.cpp_wrapper_keys = {KEY}                                  # recorded, but not on disk
    assert glue_binaries.save_for(Compiled(), tmp_path) is None
    assert not (tmp_path / glue_binaries.GLUE_BINARIES).exists()


def _wrapper_source(cache, key, kernel_paths):
    """A GPU wrapper's main.cpp as Inductor's cpp_wrapper_gpu writes its loadKernel calls."""
    src = cache / key[1:3] / f"{key}.main.cpp"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("".join(f'    if (kernel{i} == nullptr) {{\n        kernel{i} = loadKernel("{p}", '
                           f'"triton_poi_fused_{i}", 0, cubin_dir_); \n    }}\n'
                           for i, p in enumerate(kernel_paths)))
    (cache / key[1:3] / f"{key}.main.so").write_bytes(b"so")


def test_a_gpu_wrappers_kernel_binaries_travel_with_it(tmp_path, monkeypatch):
    # a cache hit from glue_cache.bin does not write them, and the wrapper's first call
    # loads them by absolute path: "CUDA driver error: file not found" without them
    cache = tmp_path / "cache"
    monkeypatch.setattr(glue_binaries, "inductor_cache_dir", lambda: cache)
    cubin = cache / "b2" / ("cb2" + "x" * 30 + ".cubin")
    cubin.parent.mkdir(parents=True)
    cubin.write_bytes(b"\x7fELF cubin")
    elsewhere = tmp_path / "aot" / "kernel.cubin"                 # not under the cache: not carried
    _wrapper_source(cache, KEY, [cubin, elsewhere, cubin])
    assert glue_binaries.kernel_files({KEY}) == sorted({str(cubin), str(elsewhere)})
    assert glue_binaries.kernel_files({KEY, "c" + "zz" * 20}) is None   # a source is gone: unknown
    assert glue_binaries.save({KEY}, tmp_path, glue_binaries.kernel_files({KEY})) == glue_binaries.GLUE_BINARIES
    names = glue_binaries.member_names(tmp_path / glue_binaries.GLUE_BINARIES)
    assert sorted(names) == sorted([f"{KEY[1:3]}/{KEY}.main.so", cubin.relative_to(cache).as_posix()])
    fresh = tmp_path / "fresh"
    monkeypatch.setattr(glue_binaries, "inductor_cache_dir", lambda: fresh)
    assert glue_binaries.install(tmp_path / glue_binaries.GLUE_BINARIES, torch.__version__) == 2
    placed = fresh / cubin.relative_to(cache)
    assert placed.read_bytes() == b"\x7fELF cubin" and not os.access(placed, os.X_OK)


def test_the_glue_cache_is_used_only_with_every_kernel_file_in_place(tmp_path):
    present = tmp_path / "k.cubin"
    present.write_bytes(b"k")
    missing = str(tmp_path / "gone.cubin")
    assert glue_binaries.kernels_in_place({"glue_kernel_files": [str(present)]})
    assert glue_binaries.kernels_in_place({"glue_kernel_files": []})
    assert not glue_binaries.kernels_in_place({"glue_kernel_files": [str(present), missing]})
    assert not glue_binaries.kernels_in_place({"glue_kernel_files": [7]})           # not a path
    assert not glue_binaries.kernels_in_place({"glue_kernel_files": None})          # unknown at the save
    # folders of sessions 44-46: binaries without the list may load kernels we cannot name
    assert not glue_binaries.kernels_in_place({"glue_binaries": glue_binaries.GLUE_BINARIES})
    assert glue_binaries.kernels_in_place({"glue_binaries": None})


def test_the_folder_carries_the_kernels_of_every_wrapper_the_process_compiled(tmp_path, monkeypatch):
    # glue_cache.bin holds all the process compiled, so any of its graphs may be a cache hit
    cache = tmp_path / "cache"
    monkeypatch.setattr(glue_binaries, "inductor_cache_dir", lambda: cache)
    other = "c" + "b3" * 20
    cubins = []
    for k in ("cq1", "cq2"):
        c = cache / k[1:3] / (k + "y" * 30 + ".cubin")
        c.parent.mkdir(parents=True, exist_ok=True)
        c.write_bytes(k.encode())
        cubins.append(c)
    _wrapper_source(cache, KEY, [cubins[0]])                      # the glue's wrapper
    _wrapper_source(cache, other, [cubins[1]])                    # another graph's, same process
    monkeypatch.setattr(glue_binaries, "cpp_wrapper_keys", lambda: {KEY, other})

    class Ind:
        first_call_s, failed, cpp_wrapper_keys = 1.0, None, {KEY}

    class Compiled:
        inductor = Ind()

    assert glue_binaries.kernel_files_for(Compiled()) == sorted(map(str, cubins))
    assert glue_binaries.save_for(Compiled(), tmp_path) == glue_binaries.GLUE_BINARIES
    names = glue_binaries.member_names(tmp_path / glue_binaries.GLUE_BINARIES)
    assert sorted(names) == sorted([f"{KEY[1:3]}/{KEY}.main.so", *(c.relative_to(cache).as_posix() for c in cubins)])
    Ind.failed = "boom"                                           # a glue that did not compile
    assert glue_binaries.kernel_files_for(Compiled()) == []
