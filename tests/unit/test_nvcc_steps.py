"""build/nvcc_steps.py without nvcc: the one-gencode recipe read from ``nvcc --dryrun``
output (its environment lines, its seven steps in either order), the module id
shared by cudafe++ and cicc, and what is not recognised (the caller then runs nvcc
itself). tests/build/test_nvcc_steps_build.py compiles with real nvcc."""
from pathlib import Path

from cutlass_offload.build import nvcc_steps

ENV = """\
#$ _HERE_=/cuda/bin
#$ TOP=/cuda/bin/..
#$ CICC_PATH=$TOP/nvvm/bin
#$ LIBRARIES=  "-L/cuda/lib/stubs" "-L/cuda/lib"
#$ PATH=/cuda/bin/../nvvm/bin:/usr/bin
"""
STEPS = [
    '#$ gcc -D__CUDA_ARCH_LIST__=900 -E -x c++ -D__CUDACC__ "k.cu" -o "/K/k.cpp4.ii"',
    '#$ cudafe++ --c++17 --gen_c_file_name "/K/k.cudafe1.cpp" --stub_file_name "k.cudafe1.stub.c" '
    '--gen_module_id_file --module_id_file_name "/K/k.module_id" "/K/k.cpp4.ii"',
    '#$ gcc -D__CUDA_ARCH__=900 -D__CUDA_ARCH_LIST__=900 -E -x c++ "k.cu" -o "/K/k.cpp1.ii"',
    '#$ "$CICC_PATH/cicc" --c++17 -arch compute_90a --module_id_file_name "/K/k.module_id" '
    '"/K/k.cpp1.ii" -o "/K/k.ptx"',
    '#$ ptxas -arch=sm_90a -m64 "/K/k.ptx" -o "/K/k.cubin"',
    '#$ fatbinary --create="/K/k.fatbin" -64 "--image3=kind=elf,sm=90a,file=/K/k.cubin" '
    '--embedded-fatbin="/K/k.fatbin.c"',
    '#$ gcc -D__CUDA_ARCH__=900 -c -x c++ "/K/k.cudafe1.cpp" -o "k.o"',
]


def test_recipe_is_read_with_its_environment_and_a_shared_module_id():
    steps = nvcc_steps.parse_dryrun(ENV + "\n".join(STEPS), {"HOME": "/root"})
    assert steps is not None and len(steps.commands) == len(nvcc_steps.RECIPE)
    assert steps.module_id_file == "/K/k.module_id"
    # cudafe++ reads the id written beforehand instead of generating it
    assert "--gen_module_id_file" not in steps.commands[1]
    assert "--module_id_file_name" in steps.commands[1]
    assert steps.env["CICC_PATH"] == "/cuda/bin/../nvvm/bin" and steps.env["HOME"] == "/root"
    assert "LIBRARIES" not in steps.env            # nvcc's own bookkeeping, not the steps'


def test_steps_in_another_order_are_put_in_recipe_order():
    # nvcc -t prints the two sides interleaved
    shuffled = [STEPS[i] for i in (0, 2, 1, 3, 4, 5, 6)]
    steps = nvcc_steps.parse_dryrun(ENV + "\n".join(shuffled), {})
    assert [nvcc_steps._kind(c) for c in steps.commands] == list(nvcc_steps.RECIPE)


def test_other_recipes_are_not_taken():
    two_gencodes = STEPS[:4] + [STEPS[3].replace("compute_90a", "compute_80")] + STEPS[4:]
    assert nvcc_steps.parse_dryrun(ENV + "\n".join(two_gencodes), {}) is None
    assert nvcc_steps.parse_dryrun(ENV + "\n".join(STEPS[:-1]), {}) is None
    other_id = STEPS[:3] + [STEPS[3].replace("/K/k.module_id", "/K/other")] + STEPS[4:]
    assert nvcc_steps.parse_dryrun(ENV + "\n".join(other_id), {}) is None
    assert nvcc_steps.parse_dryrun("nvcc fatal: unknown option", {}) is None


def test_module_id_is_unique_to_the_source(tmp_path):
    a, b = tmp_path / "unit.cu", tmp_path / "other" / "unit.cu"
    b.parent.mkdir()
    a.write_text("__global__ void k() {}\n")
    b.write_text("__global__ void k(int) {}\n")
    ida, idb = nvcc_steps.module_id(a), nvcc_steps.module_id(b)
    assert ida != idb and ida.endswith("_7_unit_cu_co") and ida.startswith("_")
    assert nvcc_steps.module_id(Path(a)) == ida


def test_a_stand_in_without_dryrun_leaves_the_compile_to_nvcc_itself(tmp_path):
    """... and is asked once: a wrapper that compiles whatever it is given must not
    compile every unit twice."""
    fake = tmp_path / "nvcc"
    calls = tmp_path / "calls"
    fake.write_text(f"#!/bin/sh\necho called >> {calls}\necho compiled\n")
    fake.chmod(0o755)
    src = tmp_path / "unit.cu"
    src.write_text("int x;\n")
    for _ in range(3):
        assert nvcc_steps.run([str(fake), "-c", str(src), "-o", str(tmp_path / "unit.o")], src) is None
    assert calls.read_text().count("called") == 1


def test_objects_built_either_way_share_cache_entries(tmp_path, monkeypatch):
    """The steps' objects differ from nvcc's only in the module id string (a name
    suffix for internal-linkage entities), so one key serves both: an object nvcc
    built serves a build through the steps (stand-in nvcc here: no --dryrun, so the
    steps would fall back to it). The steps are the default."""
    import cutlass_offload as co
    from cutlass_offload.config import knobs
    from fault_helpers import fake_env, nvcc_calls, small_model
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    model, inputs = small_model()

    def kernel_compiles():
        return [c for c in nvcc_calls(tmp_path) if c.startswith("compile")]
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC_STEPS", "0")
    co.compile(model, inputs, arch="sm_80", glue="eager")
    plain = len(kernel_compiles())
    assert plain > 0
    co.compile(model, inputs, arch="sm_80", glue="eager")
    assert len(kernel_compiles()) == plain                  # cached
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC_STEPS", "1")
    co.compile(model, inputs, arch="sm_80", glue="eager")
    assert len(kernel_compiles()) == plain                  # nvcc's objects serve the steps
    monkeypatch.delenv("CUTLASS_OFFLOAD_NVCC_STEPS")
    assert knobs().nvcc_steps                               # the default
