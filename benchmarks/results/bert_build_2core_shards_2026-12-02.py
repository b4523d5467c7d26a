"""bert-base at sm_90a, cold, 2 cores: the merged unit (choose_shards' pick here) vs
the planned shards (plan_shards forced)."""
import os, sys, time, tempfile, shutil
variant = sys.argv[1]
cache = tempfile.mkdtemp(prefix="co_shard_exp_")
os.environ["CUTLASS_OFFLOAD_CACHE_DIR"] = cache
os.environ["CUTLASS_OFFLOAD_PROGRESS"] = "0"
import cutlass_offload.build as b
from cutlass_offload.build import shards
if variant.startswith("planned"):
    b.choose_shards = shards.plan_shards
if "split" in variant:
    from cutlass_offload.build import toolchain
    n = variant.split("split")[1] or "0"
    orig = toolchain.compile_command
    def cc(*a, **k):
        cmd = orig(*a, **k)
        if k.get("cutlass", True) and (len(a) < 5 or a[4]):
            cmd = cmd[:-3] + [f"--split-compile={n}"] + cmd[-3:]
        return cmd
    toolchain.compile_command = cc
from cutlass_offload.cli import main
out = tempfile.mkdtemp(prefix="co_shard_out_")
t = time.perf_counter()
rc = main(["compile", "bert-base", "--arch", "sm_90a", "--out", out + "/f"])
print(f"{variant}: rc {rc} wall {time.perf_counter() - t:.1f} s", flush=True)
shutil.rmtree(cache, ignore_errors=True)
