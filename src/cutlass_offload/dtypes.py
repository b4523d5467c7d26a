"""The dtype table, one row per element type the IR names ("f16", "bf16", "f32"):
its CUTLASS C++ type, its size, its torch dtype. A leaf module (imports nothing
from the pipeline); every stage reads these instead of keeping its own map.

f32 problems run as TF32 tensor-core math on fp32 storage (ir.GemmProblem.tf32).
"""
from __future__ import annotations

import torch

NAMES = ("f16", "bf16", "f32")
CPP = {"f16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t", "f32": "float"}
BYTES = {"f16": 2, "bf16": 2, "f32": 4}
TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
FROM_TORCH = {t: name for name, t in TORCH.items()}
