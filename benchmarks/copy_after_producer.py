"""Does a Triton copy run slower after our GEMM than after cuBLAS's? (issue 16)

In whisper-encoder's reduce-overhead forward, Inductor's head-split copies of k and v
ran 8.0 us a call in our graph against 4.9 us in torch.compile's, with the same Triton
source reading tensors of the same shape and strides (session 27,
results/whisper_attention_copies_code_2026-12-04_h200_s27.txt); what differed was the
kernel that wrote their input. This times that copy alone after each producer:

* ``cublas``: ``torch.mm(x, w.t())`` (what torch.compile's graph runs);
* ``ours`` / ``ours_no_pdl``: our GEMM region for the same Linear (the learned table's
  kernel, launched with and without programmatic dependent launch);
* ``none``: the copy alone, again and again on one input (warm in L2).

Each pair (producer, copy) is captured ``--reps`` times into one CUDA graph, replayed
under torch.profiler, and the copy's kernel time per call is reported (median of
``--rounds`` replays), with the producer's. The copy is what Inductor emits for
``y.view(b, s, h, d).transpose(1, 2).contiguous()`` (``torch.compile`` of that).
Prints a table, writes JSON (``--json``, default ./copy_after_producer.json); needs a
CUDA GPU (exit 2 without).

    python benchmarks/copy_after_producer.py [--tokens 6000 --width 768 --heads 12]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PRODUCERS = ("none", "cublas", "ours", "ours_no_pdl")


def _ours(lin, x, pdl: bool):
    """Our compiled Linear (a region op, eager glue), its GEMM launched with PDL or not."""
    import cutlass_offload as co
    from glue_profile import _no_pdl
    with _no_pdl(not pdl):
        return co.compile(lin, (x,), glue="eager")


def _kernel_times(graph) -> dict:
    """{kernel name: mean us per call} over one replay of ``graph`` (glue_profile's
    kernel_profile: CUPTI records kernels inside graph replays)."""
    from glue_profile import kernel_profile
    return {k["name"]: k["us_per_forward"] / k["per_forward"]
            for k in kernel_profile(graph.replay, 1)["top"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=6000, help="rows of the GEMM (batch x sequence)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--reps", type=int, default=20, help="(producer, copy) pairs per graph")
    p.add_argument("--rounds", type=int, default=5, help="profiled replays per producer")
    p.add_argument("--producers", default=",".join(PRODUCERS))
    p.add_argument("--json", default="copy_after_producer.json")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("copy_after_producer.py needs a CUDA GPU", file=sys.stderr)
        return 2
    producers = a.producers.split(",")
    unknown = set(producers) - set(PRODUCERS)
    if unknown:
        p.error(f"unknown producers {sorted(unknown)}; choose from {', '.join(PRODUCERS)}")
    torch.manual_seed(0)
    dev, dt = "cuda", torch.float16
    x = torch.randn(a.tokens, a.width, device=dev, dtype=dt)
    lin = torch.nn.Linear(a.width, a.width, bias=False).to(dev, dt).eval()
    b, s, h = a.batch, a.tokens // a.batch, a.heads

    def split(y):
        return y.view(b, s, h, a.width // h).transpose(1, 2).contiguous()

    copy = torch.compile(split)
    y0 = torch.randn(a.tokens, a.width, device=dev, dtype=dt)

    def producer(name):
        """The callable that writes the copy's input (compiling ours first)."""
        if name == "none":
            return lambda: y0
        if name == "cublas":
            return lambda: torch.mm(x, lin.weight.t())
        ours = _ours(lin, x, pdl=name == "ours")
        return lambda: ours(x)

    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"), "shape": [a.tokens, a.width, a.heads], "producers": {}}
    for name in producers:
        produce = producer(name)
        with torch.no_grad():
            for _ in range(3):                     # compile / warm both outside the graph
                out = copy(produce())
            ref = split(produce())
            torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)   # a GEMM run twice
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(a.reps):
                    copy(produce())
        g.replay()
        rounds = [_kernel_times(g) for _ in range(a.rounds)]
        names = sorted(set().union(*rounds))
        res["producers"][name] = {k: statistics.median(r.get(k, float("nan")) for r in rounds) for k in names}
        print(f"{name}: " + "; ".join(f"{k[:60]} {v:.2f} us" for k, v in res["producers"][name].items()),
              flush=True)
    print("\n| producer | copy us (Triton) | producer us |\n| --- | --- | --- |")
    for name, ks in res["producers"].items():
        tri = [v for k, v in ks.items() if k.startswith("triton")]
        other = [v for k, v in ks.items() if not k.startswith("triton")]
        print(f"| {name} | {', '.join(f'{v:.2f}' for v in tri)} | {', '.join(f'{v:.2f}' for v in other) or '-'} |")
    Path(a.json).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
