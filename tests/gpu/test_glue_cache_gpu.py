"""GPU: a folder compiled with CUDA example inputs and Inductor glue through its C++
wrapper, loaded in a new process whose Inductor cache dir is the same path but empty
(a new machine's default one). Session 47's H200 run of sd-unet failed there on the
first call, "CUDA driver error: file not found": the glue cache's FX graph hit gave a
wrapper that loads its Triton kernels' cubins by absolute path, and nothing had put
them back. The folder now carries them (runtime/glue_binaries.py). Checked: the first
call after the load is right (fresh inputs, poisoned outputs, float32 reference),
served by the folder's artifacts (an FX graph cache hit), and a folder whose listed
kernel files are missing loads without its glue cache and still runs right. The model's
``sin`` stays in the glue, so the wrapper has a Triton kernel whose cubin the folder must
carry (its two linears and GELU alone are all regions: a glue without Triton kernels, which
is what session 49's H100 run of an earlier form of this test had)."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.gpu

# the model, in both scripts after their imports
MODEL = textwrap.dedent("""
    import torch
    import torch.nn as nn


    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.f = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256))

        def forward(self, x):
            return self.f(torch.sin(x) * 2)   # sin: a Triton kernel in the glue
""")

SAVE = MODEL + textwrap.dedent("""
    import sys, torch
    import torch.nn as nn
    import cutlass_offload as co
    torch.manual_seed(0)
    model = M().half().cuda().eval()
    x = torch.randn(64, 256, dtype=torch.float16, device="cuda")
    compiled = co.compile(model, (x,), out_dir=sys.argv[1], glue="inductor")
    with torch.no_grad():
        compiled(x)
    assert compiled.glue == "inductor", compiled.glue
    torch.save(model.state_dict(), sys.argv[2])
""")

LOAD = MODEL + textwrap.dedent("""
    import json, sys, torch
    import torch.nn as nn
    import cutlass_offload as co
    from torch._dynamo.utils import counters
    sys.path.insert(0, sys.argv[3])
    from helpers import poison_allocator, rel_err
    compiled, _, inputs = co.load(sys.argv[1], device="cuda")
    ref = M().cuda()
    ref.load_state_dict({k: v.float() for k, v in torch.load(sys.argv[2]).items()})
    x = torch.randn(64, 256, dtype=torch.float16, device="cuda")
    poison_allocator()
    with torch.no_grad():
        out = compiled(x)
        torch.cuda.synchronize()
    err = rel_err(out.float(), ref(x.float()))
    print(json.dumps({"glue": compiled.glue, "err": err, **counters["inductor"]}))
""")


def _run(code, args, cache):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               TRITON_CACHE_DIR=str(cache / "triton"), CUTLASS_OFFLOAD_CACHE_DIR=str(cache / "co"))
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_load_into_an_emptied_inductor_cache_runs_the_cached_cpp_wrapper(tmp_path):
    from cutlass_offload.runtime import glue_binaries
    from helpers import TOLERANCE
    cache, out, weights = tmp_path / "cache", tmp_path / "out", tmp_path / "w.pt"
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _run(SAVE, [out, weights], cache)
    manifest = json.loads((out / "manifest.json").read_text())
    if not manifest.get("glue_binaries"):
        pytest.skip("the glue did not compile with Inductor's C++ wrapper here")
    assert manifest["glue_cache"] and manifest["glue_kernel_files"], manifest.get("glue_kernel_files")
    names = glue_binaries.member_names(out / glue_binaries.GLUE_BINARIES)
    assert any(n.endswith(".cubin") for n in names), names
    for d in ("inductor", "triton"):                  # same paths, emptied: a new machine
        shutil.rmtree(cache / d)
    served = _run(LOAD, [out, weights, tests], cache)
    assert served["glue"] == "inductor" and served["err"] < TOLERANCE[torch.float16], served
    assert served.get("fxgraph_cache_hit", 0) >= 1, served
    # the files the folder lists are gone and not carried: the glue compiles instead
    manifest["glue_kernel_files"] = manifest["glue_kernel_files"] + [str(tmp_path / "gone.cubin")]
    from cutlass_offload import folder
    manifest["checksum"] = folder._manifest_checksum(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    for d in ("inductor", "triton"):
        shutil.rmtree(cache / d)
    compiled = _run(LOAD, [out, weights, tests], cache)
    assert compiled["glue"] == "inductor" and compiled["err"] < TOLERANCE[torch.float16], compiled
    assert compiled.get("fxgraph_cache_hit", 0) == 0, compiled
