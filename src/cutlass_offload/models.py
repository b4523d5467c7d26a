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


class _UNetSample(torch.nn.Module):
    def __init__(self, unet):
        super().__init__()
        self.unet = unet

    def forward(self, sample, timestep, encoder_hidden_states):
        return self.unet(sample, timestep, encoder_hidden_states, return_dict=False)[0]


def sd_unet(batch=2, seq=77):
    """Stable Diffusion 1.5 UNet (diffusers UNet2DConditionModel: 320/640/1280/1280
    channels, cross-attention dim 768), latent 4x64x64, ``seq`` text tokens."""
    from diffusers import UNet2DConditionModel
    unet = UNet2DConditionModel(
        sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3)
    inputs = (torch.randn(batch, 4, 64, 64), torch.tensor([500] * batch),
              torch.randn(batch, seq, 768))
    return _UNetSample(unet), inputs


class _Bottleneck(torch.nn.Module):
    """ResNet v1.5 bottleneck (stride on the 3x3 conv), as torchvision.models.resnet."""

    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        nn = torch.nn
        cout = width * self.expansion
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        relu = torch.nn.functional.relu
        out = relu(self.bn1(self.conv1(x)))
        out = relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return relu(out + identity)


class ResNet50(torch.nn.Module):
    """ResNet-50 (He et al. 2016) in torchvision's layout: 3-4-6-3 bottlenecks,
    widths 64-128-256-512, 1000 classes. Used when torchvision is not installed."""

    def __init__(self, num_classes=1000):
        super().__init__()
        nn = torch.nn
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(_Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _randomize_bn(model):
    """Non-trivial BatchNorm statistics, so folding them into the convs is tested."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=g) * 0.5 + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)
    return model


def resnet50(batch=8, seq=224):
    """ResNet-50, torchvision's when installed (random weights), else the same
    architecture defined here; input ``batch`` x 3 x ``seq`` x ``seq`` (224)."""
    try:
        from torchvision.models import resnet50 as tv_resnet50
        model = tv_resnet50(weights=None)
    except ImportError:
        model = ResNet50()
    return _randomize_bn(model), (torch.randn(batch, 3, seq, seq),)


BUILTIN = {"bert-base": bert_base, "gpt2": gpt2, "mlp": mlp, "sd-unet": sd_unet,
           "resnet50": resnet50}
# Convolutional models run channels_last (NHWC in memory), the layout CUTLASS convs use
CHANNELS_LAST = {"sd-unet", "resnet50"}
# (batch, seq) defaults where the CLI's 8 x 128 does not fit the model
DEFAULT_SIZES = {"sd-unet": (2, 77), "resnet50": (8, 224)}


def load_model(name: str, dtype: str = "fp16", batch: int | None = None, seq: int | None = None):
    """(model, example_inputs) for a built-in name or ``package.module:factory``.

    A factory is called with no arguments and returns (model, example_inputs).
    batch / seq: None = the model's default (8 x 128; sd-unet 2 x 77 tokens;
    resnet50 8 x 224 pixels). Floating inputs and parameters are cast to ``dtype``;
    the convolutional built-ins (CHANNELS_LAST) and their 4-D inputs are put in
    channels_last memory format. Raises ValueError for an unknown name.
    """
    torch.manual_seed(0)
    if name in BUILTIN:
        b, s = DEFAULT_SIZES.get(name, (8, 128))
        model, inputs = BUILTIN[name](batch=batch or b, seq=seq or s)
    elif ":" in name:
        mod, fn = name.split(":", 1)
        try:
            factory = getattr(importlib.import_module(mod), fn)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load model factory {name!r}: {e}") from e
        model, inputs = factory()
    else:
        raise ValueError(f"unknown model {name!r}: use one of {sorted(BUILTIN)} or package.module:factory")
    dt = DTYPES[dtype]
    model = model.to(dt).eval()
    inputs = tuple(x.to(dt) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in inputs)
    if name in CHANNELS_LAST:
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(x.contiguous(memory_format=torch.channels_last)
                       if isinstance(x, torch.Tensor) and x.dim() == 4 else x for x in inputs)
    return model, inputs
