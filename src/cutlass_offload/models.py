"""Built-in models for the CLI, built from configs with random weights (nothing is
downloaded), and the ``package.module:factory`` loader.

The five "zoo" architectures (``llama``, ``whisper-encoder``, ``convnext-tiny``,
``efficientnet-b0``, ``vae-decoder``: the team's zoo list of real architectures) take keyword overrides of
their config (e.g. ``num_hidden_layers=1``) so tests can build a small one. The timm
ones need ``timm`` and a ``torchvision`` built for the installed torch, imported only
when such a model is asked for.
"""
from __future__ import annotations

import importlib

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class _LastHidden(torch.nn.Module):
    """Returns one tensor so exported graphs and comparisons stay simple:
    ``model(**{arg: x}).<key>``."""

    def __init__(self, model, key, arg="input_ids"):
        super().__init__()
        self.model, self.key, self.arg = model, key, arg

    def forward(self, x):
        return getattr(self.model(**{self.arg: x}), self.key)


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


# ----------------------------------------------------------------- the zoo

def llama(batch=4, seq=512, **config):
    """TinyLlama-1.1B's architecture cut to 16 layers (transformers LlamaForCausalLM:
    vocab 32000, hidden 2048, SwiGLU FFN 5632, 32 query / 4 KV heads, RoPE theta 1e4,
    RMSNorm eps 1e-5, untied LM head, no KV cache, SDPA attention).

    Input: token ids (batch, seq) int64; output: logits (batch, seq, 32000).
    config: LlamaConfig fields that replace these (e.g. num_hidden_layers=1).
    """
    from transformers import LlamaConfig, LlamaForCausalLM
    fields = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                  num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=4,
                  max_position_embeddings=2048, rms_norm_eps=1e-5, hidden_act="silu",
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                  tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa")
    cfg = LlamaConfig(**{**fields, **config})
    model = _LastHidden(LlamaForCausalLM(cfg), "logits")
    return model, (torch.randint(0, cfg.vocab_size, (batch, seq)),)


def whisper_encoder(batch=4, seq=3000, **config):
    """whisper-small's audio encoder (transformers WhisperEncoder: conv1d stem, d_model
    768, 12 layers of 12 heads, FFN 3072, SDPA attention).

    Input: log-mel features (batch, 80, seq) float; seq is the number of mel frames
    (3000 = 30 s, the model's 1500 positions): WhisperEncoder takes exactly
    2 x max_source_positions frames, so max_source_positions is seq / 2.
    Output: hidden states (batch, seq / 2, 768). Raises ValueError for an odd seq.
    config: WhisperConfig fields that replace these (e.g. encoder_layers=1).
    """
    if seq % 2:
        raise ValueError(f"whisper-encoder: seq (mel frames) must be even, got {seq}")
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    fields = dict(d_model=768, encoder_layers=12, encoder_attention_heads=12,
                  encoder_ffn_dim=3072, num_mel_bins=80, max_source_positions=seq // 2,
                  attn_implementation="sdpa")
    cfg = WhisperConfig(**{**fields, **config})
    model = _LastHidden(WhisperEncoder(cfg), "last_hidden_state", arg="input_features")
    return model, (torch.randn(batch, cfg.num_mel_bins, seq),)


def _timm():
    """The timm module, or ImportError naming what to install."""
    try:
        import timm
    except (ImportError, RuntimeError) as e:  # a torchvision built for another torch: RuntimeError
        raise ImportError(
            f"the timm models (convnext-tiny, efficientnet-b0) need timm and a torchvision "
            f"built for torch {torch.__version__} (pip install timm torchvision==<the "
            f"release matching that torch>); importing timm failed: {e}") from e
    return timm


def _calibrate_batch_norm(model, make_input, batches=4):
    """Set every BatchNorm's running statistics to those of ``batches`` random inputs
    (train-mode forwards without gradients; cumulative average), so eval-mode
    activations of a randomly initialized net stay near unit scale. Returns the
    model in eval mode."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None                   # None = cumulative average over the batches
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(make_input())
    for m, momentum in zip(bns, momenta):
        m.momentum = momentum
    return model.eval()


def convnext_tiny(batch=32, seq=224, **config):
    """timm ``convnext_tiny`` (depths 3-3-9-3, dims 96-768, 7x7 depthwise convs) with
    layer scale initialized to 0.2 (timm's 1e-6 would make every block a near
    identity). Input (batch, 3, seq, seq) float (224); output logits (batch, 1000).
    config: timm.create_model keyword arguments that replace these.
    Raises ImportError when timm / torchvision are missing."""
    model = _timm().create_model("convnext_tiny", pretrained=False,
                                 **{"ls_init_value": 0.2, **config})
    return model.eval(), (torch.randn(batch, 3, seq, seq),)


def efficientnet_b0(batch=32, seq=224, **config):
    """timm ``efficientnet_b0`` (default config) with BatchNorm statistics calibrated on
    four random batches of 8. Input (batch, 3, seq, seq) float (224); output logits
    (batch, 1000). config: timm.create_model keyword arguments.
    Raises ImportError when timm / torchvision are missing."""
    model = _timm().create_model("efficientnet_b0", pretrained=False, **config)
    model = _calibrate_batch_norm(model, lambda: torch.randn(8, 3, seq, seq))
    return model, (torch.randn(batch, 3, seq, seq),)


class _VaeDecode(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, latent):
        return self.vae.decode(latent, return_dict=False)[0]


def vae_decoder(batch=1, seq=64, **config):
    """Stable Diffusion 1.5's VAE decoder (diffusers AutoencoderKL: block channels
    128/256/512/512, 2 layers per block, 32 groups, 4 latent channels), ``.decode``.

    Input: a latent (batch, 4, seq, seq) float; seq is the latent side (64 -> a
    512 x 512 image); output: the image (batch, 3, 8 seq, 8 seq).
    config: AutoencoderKL arguments that replace these (block types follow
    block_out_channels' length unless given).
    """
    from diffusers import AutoencoderKL
    fields = dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2,
                  block_out_channels=(128, 256, 512, 512), norm_num_groups=32,
                  act_fn="silu", sample_size=512)
    fields.update(config)
    n = len(fields["block_out_channels"])
    fields.setdefault("down_block_types", ("DownEncoderBlock2D",) * n)
    fields.setdefault("up_block_types", ("UpDecoderBlock2D",) * n)
    vae = AutoencoderKL(**fields)
    latent = torch.randn(batch, fields["latent_channels"], seq, seq)
    return _VaeDecode(vae), (latent,)


BUILTIN = {"bert-base": bert_base, "gpt2": gpt2, "mlp": mlp, "sd-unet": sd_unet,
           "resnet50": resnet50, "llama": llama, "whisper-encoder": whisper_encoder,
           "convnext-tiny": convnext_tiny, "efficientnet-b0": efficientnet_b0,
           "vae-decoder": vae_decoder}
# the built-ins that take config overrides (load_model's **config)
CONFIGURABLE = {"llama", "whisper-encoder", "convnext-tiny", "efficientnet-b0", "vae-decoder"}
# Convolutional models run channels_last (NHWC in memory), the layout CUTLASS convs use
CHANNELS_LAST = {"sd-unet", "resnet50", "convnext-tiny", "efficientnet-b0", "vae-decoder"}
# (batch, seq) defaults where the CLI's 8 x 128 does not fit the model; what seq means:
# tokens (bert-base, gpt2, mlp, llama; sd-unet: text tokens), mel frames (whisper-encoder),
# image side in pixels (resnet50, convnext-tiny, efficientnet-b0), latent side (vae-decoder)
DEFAULT_SIZES = {"sd-unet": (2, 77), "resnet50": (8, 224), "llama": (4, 512),
                 "whisper-encoder": (4, 3000), "convnext-tiny": (32, 224),
                 "efficientnet-b0": (32, 224), "vae-decoder": (1, 64)}


def _cast_floating(model: torch.nn.Module, dt: torch.dtype) -> torch.nn.Module:
    """``model`` with its floating-point parameters and buffers of another dtype cast to
    ``dt``, in place. Not ``model.to(dt)``: that casts complex buffers too, dropping
    their imaginary parts (a rotary table made with torch.polar: wrong results, a
    fresh-user trial), and libraries hook it (diffusers warns on every call)."""
    for m in model.modules():
        for p in m.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != dt:
                p.data = p.data.to(dt)      # .data: tied parameters stay one tensor
        for key, b in m.named_buffers(recurse=False):
            if b.is_floating_point() and b.dtype != dt:
                m._buffers[key] = b.to(dt)
    return model


def load_model(name: str, dtype: str = "fp16", batch: int | None = None, seq: int | None = None,
               notes: list | None = None, **config):
    """(model, example_inputs) for a built-in name or ``package.module:factory``.

    A factory is called with no arguments and returns (model, example_inputs).
    batch / seq: None = the model's default (a factory takes neither): 8 x 128
    tokens; sd-unet 2 x 77 text tokens; resnet50 8 x 224 pixels; llama 4 x 512
    tokens; whisper-encoder 4 x 3000 mel frames; convnext-tiny and efficientnet-b0
    32 x 224 pixels; vae-decoder 1 x 64 (latent side). config: overrides of a zoo model's config (CONFIGURABLE; e.g.
    num_hidden_layers=1 for llama), for small test builds.
    Floating inputs and parameters are cast to ``dtype`` (a factory's of another
    dtype: a line saying so appended to ``notes`` when given); the convolutional
    built-ins (CHANNELS_LAST) and their 4-D inputs are put in channels_last format.
    Raises ValueError for an unknown name, config given to a model without
    overrides, batch / seq given with a factory, or a factory that raises or returns
    something else; ImportError when a model's package (transformers, diffusers,
    timm with torchvision) is missing.
    """
    torch.manual_seed(0)
    if config and name not in CONFIGURABLE:
        raise ValueError(f"{name!r} takes no config overrides (only {sorted(CONFIGURABLE)} do)")
    if name in BUILTIN:
        b, s = DEFAULT_SIZES.get(name, (8, 128))
        model, inputs = BUILTIN[name](batch=batch or b, seq=seq or s, **config)
    elif ":" in name:
        if batch is not None or seq is not None:
            raise ValueError(f"batch / seq size the built-in models only; the factory {name!r} makes "
                             "its own example inputs (change them there)")
        mod, fn = name.split(":", 1)
        try:
            factory = getattr(importlib.import_module(mod), fn)
        except ModuleNotFoundError as e:
            hint = (f"; put the folder that holds it on the import path, e.g. "
                    f"`PYTHONPATH=. cutlass-offload compile {name} ...`"
                    if e.name == mod.split(".")[0] else "")
            raise ValueError(f"cannot load model factory {name!r}: {e}{hint}") from e
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load model factory {name!r}: {e}") from e
        try:
            made = factory()
        except Exception as e:  # noqa: BLE001 - the user's factory: one line naming it
            raise ValueError(f"model factory {name!r} raised {type(e).__name__}: {e} (call it in "
                             "Python for the traceback)") from e
        if not (isinstance(made, (tuple, list)) and len(made) == 2
                and isinstance(made[0], torch.nn.Module) and isinstance(made[1], (tuple, list))):
            got = (f"a {type(made).__name__} of {len(made)}: "
                   f"({', '.join(type(m).__name__ for m in made)})"
                   if isinstance(made, (tuple, list)) else type(made).__name__)
            raise ValueError(f"model factory {name!r} must return (model, example_inputs): an "
                             f"nn.Module and a tuple of its forward's positional arguments "
                             f"(keyword arguments are not taken: pass them positionally, or "
                             f"wrap the model); it returned {got}")
        model, inputs = made
    else:
        import difflib
        # (not "import importlib.util": that local name would shadow the module above)
        from importlib.util import find_spec
        near = difflib.get_close_matches(name, sorted(BUILTIN), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        try:
            module = find_spec(name) is not None
        except (ImportError, ValueError):
            module = False
        if module and not near:
            hint = f"{name!r} is a module: name its factory, {name}:FACTORY; "
        raise ValueError(f"unknown model {name!r}: {hint}use one of {sorted(BUILTIN)} or package.module:factory")
    dt = DTYPES[dtype]
    other = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()
                    if p.is_floating_point() and p.dtype != dt})
    if other and notes is not None and name not in BUILTIN:
        notes.append(f"the model's {' / '.join(other)} parameters and floating inputs were cast "
                     f"to {dtype} (--dtype)")
    model = _cast_floating(model, dt).eval()
    inputs = tuple(x.to(dt) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                   for x in inputs)
    if name in CHANNELS_LAST:
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(x.contiguous(memory_format=torch.channels_last)
                       if isinstance(x, torch.Tensor) and x.dim() == 4 else x for x in inputs)
    return model, inputs
