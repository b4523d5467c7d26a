"""benchmarks/corpus.py without a GPU: what one model contributes (offloaded problems,
fallbacks and unanchored ops with their shapes), the distinct tables across models,
resuming, and the JSON it writes."""
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import corpus  # noqa: E402
from cutlass_offload.partition import kv_groups  # noqa: E402


class Mixed(nn.Module):
    """One of each: an offloaded conv2d and linear, a grouped conv2d (fallback), a
    conv3d (no anchor: a fallback from partition/unanchored.py), a grouped-query SDPA with 2 K/V heads
    (a fallback with partition/kv_groups.GQA_IN_PLACE off)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.c3 = nn.Conv3d(16, 16, (1, 3, 3), stride=(1, 2, 2))
        self.fc = nn.Linear(16, 32)

    def forward(self, x, q, k, v):
        y = self.dw(self.conv(x))
        z = self.c3(y.unsqueeze(2)).flatten(2)          # (2, 16, 9)
        a = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.fc(z.transpose(1, 2).contiguous()), a


def _mixed(name, dtype, batch, seq):
    torch.manual_seed(0)
    h = torch.float16
    model = Mixed().to(h).eval()
    inputs = (torch.randn(2, 16, 8, 8, dtype=h), torch.randn(2, 8, 16, 32, dtype=h),
              torch.randn(2, 2, 16, 32, dtype=h), torch.randn(2, 2, 16, 32, dtype=h))
    return model, inputs


def test_collect_lists_offloaded_problems_and_pytorch_ops(monkeypatch):
    monkeypatch.setattr(corpus, "load_model", _mixed)
    monkeypatch.setattr(kv_groups, "GQA_IN_PLACE", False)
    record, entries = corpus.collect("mixed")
    assert record["regions"] == {"conv2d": 1, "gemm": 1}
    assert record["problems"] == {"gemm": [1, 1], "conv2d": [1, 1], "attention": [0, 0]}
    (conv,) = entries["conv2d"]
    assert (conv["problem"]["c"], conv["problem"]["k"], conv["problem"]["pad"]) == (16, 16, (1, 1, 1, 1))
    assert (conv["problem"]["p"], conv["count"], conv["forms"]) == (8, 1, ["conv2d"])
    (gemm,) = entries["gemm"]
    assert (gemm["problem"]["m"], gemm["problem"]["n"], gemm["problem"]["k"]) == (18, 32, 16)
    assert gemm["flops"] == 2 * 18 * 32 * 16
    ops = {e["shape"].get("spatial_dims", "attn"): e for e in entries["pytorch"]}
    assert ops[2]["shape"]["groups"] == 4 and "grouped" in ops[2]["reason"]
    assert ops[2]["args"][0] == {"shape": [2, 16, 8, 8], "stride": [1024, 64, 8, 1],
                                 "dtype": "float16"}
    assert ops[3]["target"] == "aten.conv3d.default" and "3-D convolution" in ops[3]["reason"]
    assert ops[3]["shape"]["out"] == [2, 16, 1, 3, 3] and ops[3]["flops"] == 2 * 2 * 16 * 9 * 16 * 9
    att = ops["attn"]["shape"]
    assert (att["heads"], att["kv_heads"], att["enable_gqa"], att["seq_kv"]) == (8, 2, True, 16)
    assert record["pytorch_ops"] == {"conv": 2, "attention": 1}
    assert record["fallbacks"] == {"conv2d": 1, "sdpa": 1, "conv3d": 1}


def _entry(n, count):
    return {"problem": {"n": n}, "shape": f"N{n}", "flops": float(n), "count": count,
            "forms": ["linear"]}


def test_merge_replaces_a_models_counts_and_drops_orphans():
    c = corpus.load_corpus(Path("/nonexistent/corpus.json"))
    corpus.merge(c, "a", {"gemm": [_entry(1, 2), _entry(2, 1)]})
    corpus.merge(c, "b", {"gemm": [_entry(2, 5)]})
    assert [(e["id"], e["problem"]["n"], e["counts"]) for e in c["gemm"]] == [
        ("gemm-0", 2, {"a": 1, "b": 5}), ("gemm-1", 1, {"a": 2})]       # by FLOPs
    corpus.merge(c, "a", {"gemm": [_entry(3, 1)]})                       # a captured again
    assert [(e["problem"]["n"], e["counts"]) for e in c["gemm"]] == [(3, {"a": 1}), (2, {"b": 5})]
    assert c["gemm"][1]["forms"] == {"b": ["linear"]}


def _record() -> dict:
    """What collect() records for a model with one GEMM region."""
    return {"batch": 1, "seq": 1, "inputs": [], "capture_s": 0.0, "partition_s": 0.0,
            "regions": {"gemm": 1}, "fallbacks": {}, "pytorch_ops": {},
            "problems": {"gemm": [1, 1], "conv2d": [0, 0], "attention": [0, 0]},
            "gflop": {"offloaded": 0.0, "pytorch": 0.0}}


def test_main_resumes_and_writes_valid_json(monkeypatch, tmp_path, capsys):
    calls = []

    def fake_collect(name):
        calls.append(name)
        if name == "broken":
            raise ImportError("timm missing")
        return _record(), {"gemm": [_entry(7, 1)]}

    monkeypatch.setattr(corpus, "collect", fake_collect)
    out = tmp_path / "c.json"
    assert corpus.main(["--models", "m1", "broken", "--out", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["models"]["m1"]["status"] == "ok" and data["models"]["broken"]["status"] == "error"
    assert data["gemm"][0]["counts"] == {"m1": 1} and data["versions"]["torch"] == torch.__version__
    assert corpus.main(["--models", "m1", "--out", str(out)]) == 0      # kept, not captured
    assert calls == ["m1", "broken"]
    corpus.main(["--models", "m1", "--out", str(out), "--force"])
    assert calls[-1] == "m1"
    assert "distinct, all models" in capsys.readouterr().out


def test_a_failed_refresh_keeps_the_models_earlier_record(monkeypatch, tmp_path):
    broken = {"now": False}

    def fake_collect(name):
        if broken["now"]:
            raise ImportError("torchvision missing here")
        return _record(), {"gemm": [_entry(7, 1)]}

    monkeypatch.setattr(corpus, "collect", fake_collect)
    out = tmp_path / "c.json"
    assert corpus.main(["--models", "timm-model", "--out", str(out)]) == 0
    broken["now"] = True
    assert corpus.main(["--models", "timm-model", "--out", str(out), "--force"]) == 1
    data = json.loads(out.read_text())
    kept = data["models"]["timm-model"]
    assert kept["status"] == "ok" and "torchvision missing here" in kept["refresh_error"]
    assert data["gemm"][0]["counts"] == {"timm-model": 1}       # its problems stay
