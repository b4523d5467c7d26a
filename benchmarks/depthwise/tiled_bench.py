"""The depthwise kernel's row form against its tiled form (several PT x QT), beside
cuDNN's conv alone, on the 16 depthwise convs of convnext-tiny and efficientnet-b0
(batch 32, fp16, channels_last; benchmarks/depthwise_latency.PROBLEMS).

Each variant's output is poisoned, then checked against float32 (conv + bias, SiLU
where the model has one); device time per call from CUDA-graph replays
(benchmarks/_timing.graph_ms). Prints a table (us; ratio = cuDNN's conv alone / the
best variant) and writes JSON (``--json``, default $OUT/depthwise_tiled.json).
``--write-table FILE`` writes the problems whose fastest tiled shape beats the row
form by MIN_GAIN as the family's table (families/depthwise.py TABLE_FILE), which the
kernel choice reads. Build the variants' library first (build_tiled.sh); needs a GPU.

    bash benchmarks/depthwise/build_tiled.sh
    python benchmarks/depthwise/tiled_bench.py [--batch 32] [--json FILE] [--write-table FILE]
        [--problems 0,4] [--variants 0,1]
"""
import argparse, ctypes, json, os, sys, time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _timing import graph_ms  # noqa: E402
from depthwise_latency import PROBLEMS  # noqa: E402
from kernels_bench import geomean  # noqa: E402
from cutlass_offload.families import depthwise  # noqa: E402
from cutlass_offload.runtime.library import CoConvArgs  # noqa: E402

# the tiled shapes of tiled.cu's variants 1.. : (PT, QT, threads, min_blocks)
TILED = [(2, 2, 256, 1), (1, 4, 256, 1), (4, 1, 256, 1), (1, 4, 128, 4), (2, 2, 128, 4), (1, 2, 128, 4),
         (1, 4, 256, 2), (2, 2, 256, 2), (4, 1, 128, 4)]
VARIANTS = ["rows"] + ["{}x{} t{}b{}".format(*t) for t in TILED]
# the tiled form goes in the table only where it beats the row form by this much
MIN_GAIN = 1.03


def table_rows(rows: list) -> dict:
    """{key: row} of the problems whose fastest tiled shape beats the row form by
    MIN_GAIN (families/depthwise.py key_of; square filters, symmetric padding r // 2)."""
    out = {}
    for r in rows:
        tiled = [(r[n], t) for n, t in zip(VARIANTS[1:], TILED) if r.get(n)]
        if not tiled or not r.get("rows"):
            continue
        us, shape = min(tiled)
        if r["rows"] / us >= MIN_GAIN:
            pad, st = r["r"] // 2, r["stride"]
            key = depthwise.key_of(r["c"], r["h"], r["h"], r["r"], r["r"], (pad,) * 4, (st, st))
            out[key] = {"tiled": list(shape), "us": round(us, 2), "rows_us": round(r["rows"], 2),
                        "cudnn_alone_us": round(r["cudnn_alone"], 2)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32, help="images per conv (default 32)")
    ap.add_argument("--write-table", metavar="FILE",
                    help="write the problems the tiled form runs faster (families/depthwise.py)")
    ap.add_argument("--json", help="results file (default $OUT/depthwise_tiled.json)")
    ap.add_argument("--problems", help="indices into PROBLEMS to run (comma list; default all)")
    ap.add_argument("--variants", help="indices into VARIANTS to run (comma list; default all)")
    args = ap.parse_args(argv)
    picked = [int(i) for i in args.problems.split(",")] if args.problems else range(len(PROBLEMS))
    variants = {int(i) for i in args.variants.split(",")} if args.variants else set(range(len(VARIANTS)))
    lib = ctypes.CDLL(str(HERE / "libdwtiled.so"))
    lib.dw_tiled_run.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(CoConvArgs), ctypes.c_void_p]
    batch = args.batch
    rows = []
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, fp16, batch {batch}")
    print("| model | C | H | RxS | stride | " + " | ".join(f"{v} us" for v in VARIANTS)
          + " | cuDNN alone us | best / cuDNN alone | max rel. err |")
    print("|" + " --- |" * (len(VARIANTS) + 8))
    for model, c, h, r, stride, silu in (PROBLEMS[i] for i in picked):
        torch.manual_seed(0)
        x = torch.randn(batch, c, h, h, device="cuda").half().contiguous(memory_format=torch.channels_last)
        w = (torch.randn(c, 1, r, r, device="cuda") / r).half()
        b = torch.randn(c, device="cuda").half()
        pad = r // 2
        ref = F.conv2d(x.float(), w.float(), b.float(), stride=stride, padding=pad, groups=c)
        ref = F.silu(ref) if silu else ref
        y = torch.empty_like(ref, dtype=torch.half).contiguous(memory_format=torch.channels_last)
        p = q = ref.shape[-1]
        a = CoConvArgs(x.data_ptr(), w.data_ptr(), b.data_ptr(), None, y.data_ptr(), batch, h, h, c, c,
                     r, r, p, q, pad, pad, stride, stride, 1, 1, None, 0)
        stream = torch.cuda.current_stream().cuda_stream
        row = {"model": model, "c": c, "h": h, "r": r, "stride": stride, "silu": silu}
        errs = []
        for v, name in enumerate(VARIANTS):
            if v not in variants:
                continue
            y.fill_(float("nan"))

            def call(v=v):
                st = lib.dw_tiled_run(v, int(silu), ctypes.byref(a), torch.cuda.current_stream().cuda_stream)
                if st != 0:
                    raise RuntimeError(f"status {st}")
            try:
                call()
                torch.cuda.synchronize()
            except RuntimeError as e:
                row[name] = None
                row[name + " status"] = str(e)
                continue
            err = ((y.float() - ref).norm() / ref.norm()).item()
            errs.append(err)
            row[name + " err"] = err
            row[name] = graph_ms(call) * 1000 if err < 1e-2 else None
        alone = graph_ms(lambda: F.conv2d(x, w, None, stride=stride, padding=pad, groups=c)) * 1000
        row["cudnn_alone"] = alone
        times = [row[n] for n in VARIANTS if row.get(n)]
        row["best_ratio"] = alone / min(times) if times else None
        rows.append(row)
        cells = " | ".join(f"{row[n]:.1f}" if row.get(n) else "-" for n in VARIANTS)
        print(f"| {model} | {c} | {h} | {r}x{r} | {stride} | {cells} | {alone:.1f} | "
              f"{row['best_ratio']:.2f} | {max(errs) if errs else float('nan'):.1e} |")
    for n in VARIANTS:
        rs = [r["cudnn_alone"] / r[n] for r in rows if r.get(n)]
        if rs:
            print(f"{n}: geomean cuDNN alone / it {geomean(rs):.2f}x "
                  f"over {len(rs)} (min {min(rs):.2f})")
    best = [r["best_ratio"] for r in rows if r["best_ratio"]]
    print(f"best per problem: geomean {geomean(best):.2f}x (min {min(best):.2f})")
    out = Path(args.json or Path(os.environ.get("OUT", ".")) / "depthwise_tiled.json")
    out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "batch": batch, "variants": VARIANTS, "rows": rows}, indent=1))
    print("wrote", out)
    if args.write_table:
        table = table_rows(rows)
        Path(args.write_table).write_text(json.dumps({
            "gpu": torch.cuda.get_device_name(), "num_sms": torch.cuda.get_device_properties(0).multi_processor_count,
            "date": time.strftime("%Y-%m-%d"), "dtype": "f16", "batch": batch, "min_gain": MIN_GAIN,
            "source": "benchmarks/depthwise/tiled_bench.py --write-table", "rows": table}, indent=1) + "\n")
        print(f"{len(table)} of {len(rows)} problems take the tiled form -> {args.write_table}")


if __name__ == "__main__":
    main()
