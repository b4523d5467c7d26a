"""benchmarks/copy_after_producer.py without a GPU: it says so and exits 2."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import copy_after_producer as cap  # noqa: E402


def test_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(cap.torch.cuda, "is_available", lambda: False)
    assert cap.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
