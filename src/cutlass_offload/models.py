"""Built-in models for the CLI, built from configs with random weights (nothing is
downloaded), and the ``package.module:factory`` loader."""
from __future__ import annotations

import importlib

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class _LastHidden(torch.nn.Module):
    """Returns one tensor so exported graphs and comparisons stay simple."""

    def __init__(self, model, key):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, input_ids):
        return getattr(self.model(input_ids=input_ids), self.key)


def bert_base(batch=8, seq=128):
    """bert-base-uncased architecture (12 layers, hidden 768, FFN 3072)."""
    from transformers import BertConfig, BertModel
    cfg = BertConfig(attn_implementation="sdpa")
    model = _LastHidden(BertModel(cfg, add_pooling_layer=False), "last_hidden_state")
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return model, (ids,)


def gpt2(batch=8, seq=128):
    """GPT-2 small (12 layers, hidden 768) with its LM head, no KV cache."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(use_cache=False, attn_implementation="sdpa")
    model = _LastHidden(GPT2LMHeadModel(cfg), "logits")
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return model, (ids,)


class MLPBlock(torch.nn.Module):
    """A small transformer-style FFN block: fc1 + GELU, fc2 + residual, ReLU head."""

    def __init__(self, d=256, hidden=1024):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, hidden)
        self.fc2 = torch.nn.Linear(hidden, d)
        self.head = torch.nn.Linear(d, d)

    def forward(self, x):
        h = self.fc2(torch.nn.functional.gelu(self.fc1(x))) + x
        return torch.relu(self.head(h))


def mlp(batch=8, seq=128):
    return MLPBlock(), (torch.randn(batch, seq, 256),)


BUILTIN = {"bert-base": bert_base, "gpt2": gpt2, "mlp": mlp}


def load_model(name: str, dtype: str = "fp16", batch: int = 8, seq: int = 128):
    """(model, example_inputs) for a built-in name or ``package.module:factory``.

    A factory is called with no arguments and returns (model, example_inputs).
    Floating inputs and parameters are cast to ``dtype``. Raises ValueError for an
    unknown name.
    """
    torch.manual_seed(0)
    if name in BUILTIN:
        model, inputs = BUILTIN[name](batch=batch, seq=seq)
    elif ":" in name:
        mod, fn = name.split(":", 1)
        model, inputs = getattr(importlib.import_module(mod), fn)()
    else:
        raise ValueError(f"unknown model {name!r}: use one of {sorted(BUILTIN)} or package.module:factory")
    dt = DTYPES[dtype]
    model = model.to(dt).eval()
    inputs = tuple(x.to(dt) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in inputs)
    return model, inputs
