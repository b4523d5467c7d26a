"""An output folder carries Inductor's cache artifacts of its compiled glue
(folder.GLUE_CACHE), and a load in a process with an empty Inductor cache serves the
glue's first compile from them. Inductor glue on the CPU (a model without regions),
each step in a fresh process with its own TORCHINDUCTOR_CACHE_DIR: the save, the load
with the artifacts (an FX graph cache hit, no miss) and, as the control, the load
with them withheld (a miss)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
    compiled = compile_captured(cap, options, glue="inductor")
    compiled(*inputs)                                  # Inductor compiles the glue here
    assert compiled.glue == "inductor" and compiled.inductor.first_call_s is not None
    folder.save(compiled, cap, inputs, options, sys.argv[1], GlueSpec("inductor"))
""")

LOAD = textwrap.dedent("""
    import json, sys, torch
    import cutlass_offload as co
    from cutlass_offload import api
    from torch._dynamo.utils import counters
    if sys.argv[2] == "withheld":
        api._load_glue_cache = lambda *a: None
    compiled, _, inputs = co.load(sys.argv[1])
    x, y = inputs
    x.normal_(), y.normal_()                            # fresh inputs, same shapes
    torch.testing.assert_close(compiled(x, y), torch.sin(x) * 2 + y.cos())
    print(json.dumps({"glue": compiled.glue, **counters["inductor"]}))
""")


def _run(code, args, cache):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), CUTLASS_OFFLOAD_FAST_CALL="0")
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_a_load_with_an_empty_inductor_cache_is_served_by_the_folders_artifacts(tmp_path):
    pytest.importorskip("torch._inductor")
    out = tmp_path / "out"
    _run(SAVE, [out], tmp_path / "inductor_save")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["glue_cache"] == "glue_cache.bin" and "glue_cache.bin" in manifest["files"]
    served = json.loads(_run(LOAD, [out, "served"], tmp_path / "inductor_a").splitlines()[-1])
    withheld = json.loads(_run(LOAD, [out, "withheld"], tmp_path / "inductor_b").splitlines()[-1])
    assert served["glue"] == withheld["glue"] == "inductor"
    assert served.get("fxgraph_cache_hit", 0) >= 1 and served.get("fxgraph_cache_miss", 0) == 0, served
    assert withheld.get("fxgraph_cache_miss", 0) >= 1, withheld


def test_a_folder_whose_glue_never_compiled_has_no_artifacts(tmp_path):
    import torch

    import cutlass_offload as co
    co.compile(torch.nn.Linear(4, 4), (torch.randn(2, 4),), arch="sm_90a", out_dir=tmp_path / "m",
               glue="eager")
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["glue_cache"] is None and not (tmp_path / "m" / "glue_cache.bin").exists()
