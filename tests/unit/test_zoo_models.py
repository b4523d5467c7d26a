"""The zoo built-ins (models.py; shared/zoo/README.md), no GPU: their full configs
build (on the meta device, no memory), small builds run a forward, export, and our
partitioner finds their GEMMs, convs, attentions and norms. The timm models are
skipped when timm (with a torchvision for this torch) cannot be imported."""
import collections

import pytest
import torch

from cutlass_offload import models
from cutlass_offload.capture import capture
from cutlass_offload.config import CompileOptions
from cutlass_offload.ir import AttentionRegion, GemmRegion
from cutlass_offload.partition import partition

# small builds of each architecture: (batch, seq, config overrides)
SMALL = {
    "llama": (2, 32, dict(num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                          num_attention_heads=8, num_key_value_heads=2, vocab_size=1000)),
    "whisper-encoder": (2, 64, dict(encoder_layers=2, d_model=128, encoder_attention_heads=4,
                                    encoder_ffn_dim=256)),
    "vae-decoder": (1, 8, dict(block_out_channels=(32, 64), layers_per_block=1)),
    "convnext-tiny": (2, 64, dict(depths=(1, 1, 1, 1), dims=(32, 64, 128, 256))),
    "efficientnet-b0": (2, 64, {}),
}


def _timm_missing():
    try:
        models._timm()
    except ImportError as e:
        return str(e)
    return None


TIMM_MISSING = _timm_missing()
needs_timm = pytest.mark.skipif(TIMM_MISSING is not None, reason=f"timm unusable: {TIMM_MISSING}")


def _small(name, dtype):
    batch, seq, config = SMALL[name]
    return models.load_model(name, dtype, batch, seq, **config)


def _partition(name):
    model, inputs = _small(name, "fp16")
    cap = capture(model, inputs)
    part = partition(cap.graph_module, CompileOptions(arch="sm90a"))
    kinds = collections.Counter(type(r).__name__ for r in part.regions)
    return part, kinds


def _forward(name):
    model, inputs = _small(name, "fp32")
    with torch.no_grad():
        out = model(*inputs)
    assert torch.isfinite(out).all()
    return out, inputs


# ------------------------------------------------------------------ full configs

@pytest.mark.parametrize("name,params,shape", [
    ("llama", 835_782_656, (4, 512)),            # TinyLlama-1.1B with 16 of its 22 layers
    ("whisper-encoder", 88_154_112, (4, 80, 3000)),
    ("vae-decoder", 83_653_863, (1, 4, 64, 64)),  # the whole AutoencoderKL; decode runs
])
def test_full_configs_build_on_meta(name, params, shape):
    with torch.device("meta"):
        model, inputs = models.BUILTIN[name](*models.DEFAULT_SIZES[name])
    assert sum(p.numel() for p in model.parameters()) == params
    assert tuple(inputs[0].shape) == shape


def test_llama_config_is_tinyllamas():
    with torch.device("meta"):
        model, _ = models.llama()
    cfg = model.model.config
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (2048, 5632, 16)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.rms_norm_eps) == (32, 4, 1e-5)
    assert cfg.rope_parameters["rope_theta"] == 10000.0 and not cfg.tie_word_embeddings
    assert cfg.use_cache is False and cfg._attn_implementation == "sdpa"


# ------------------------------------------------------------------ small builds

def test_llama_small_forward_and_partition():
    out, (ids,) = _forward("llama")
    assert out.shape == (*ids.shape, 1000)             # logits
    part, kinds = _partition("llama")
    layers = 2
    # q + k + v as one GEMM (partition/parallel_gemm.py), o, gate + up as one GEMM with
    # a GLU epilogue (partition/gated_gemm.py, any K), down per layer + the LM head;
    # 2 RMS norms per layer + final
    assert kinds == {"GemmRegion": 4 * layers + 1, "NormRegion": 2 * layers + 1,
                     "AttentionRegion": layers}
    glu = [r for r in part.regions if isinstance(r, GemmRegion) and r.problem.epilogue.glu]
    assert [(r.problem.n, r.problem.epilogue.tag) for r in glu] == [(2 * 512, "glu_silu")] * layers
    qkv = [r for r in part.regions if any("combines" in n for n in r.notes)]
    assert [r.problem.n for r in qkv] == [256 + 2 * 64] * layers     # 8 query, 2 KV heads of 32
    att = [r for r in part.regions if isinstance(r, AttentionRegion)]
    # transformers repeats the 2 KV heads (its mask is materialized under export), so
    # the SDPA is a plain 8-head causal attention
    assert {(r.problem.heads, r.problem.head_dim, r.problem.causal) for r in att} == {(8, 32, "top_left")}
    assert not [f for f in part.fallbacks if f.op in ("sdpa", "linear")]


def test_whisper_encoder_small_forward_and_partition():
    out, (feats,) = _forward("whisper-encoder")
    assert out.shape == (2, 32, 128)                   # seq / 2 positions
    part, kinds = _partition("whisper-encoder")
    # q + k + v as one GEMM, out, fc1, fc2 per layer; 2 layer norms per layer + final;
    # the conv1d stem's two convs as conv2d regions over a height of 1, each with its GELU
    assert kinds == {"GemmRegion": 8, "NormRegion": 5, "AttentionRegion": 2, "ConvRegion": 2}
    convs = [r for r in part.regions if type(r).__name__ == "ConvRegion"]
    assert [(r.problem.h, r.problem.epilogue.activation) for r in convs] == [(1, "gelu_erf")] * 2
    assert part.fallbacks == ()


def test_whisper_encoder_rejects_an_odd_frame_count():
    with pytest.raises(ValueError, match="even"):
        models.load_model("whisper-encoder", "fp32", 1, 63, encoder_layers=1)


def test_vae_decoder_small_forward_and_partition():
    out, (latent,) = _forward("vae-decoder")
    assert out.shape == (1, 3, 16, 16)                 # 2 blocks: one 2x upsample
    assert latent.is_contiguous(memory_format=torch.channels_last)
    part, kinds = _partition("vae-decoder")
    assert kinds["ConvRegion"] >= 10 and kinds["GroupNormRegion"] >= 8
    (att,) = [r for r in part.regions if isinstance(r, AttentionRegion)]
    assert (att.problem.heads, att.problem.head_dim, att.problem.seq_q) == (1, 64, 64)
    # the mid-block attention's q, k, v projections read a transposed view: one
    # combined GEMM reading A column-major, one A per batch entry; its 3-D group norm
    # is a region over a height of 1 (partition/lift_1d.py)
    qkv, out_proj = [r for r in part.regions if type(r).__name__ == "GemmRegion"]
    assert (qkv.problem.layout_a, qkv.batch_mode, qkv.problem.n) == ("col", "b_broadcast", 192)
    assert out_proj.problem.layout_a == "row"
    assert part.fallbacks == ()


@needs_timm
def test_convnext_tiny_small_forward_and_partition():
    out, _ = _forward("convnext-tiny")
    assert out.shape == (2, 1000)
    model, _ = _small("convnext-tiny", "fp32")
    gammas = [b.gamma.detach() for b in model.modules() if hasattr(b, "gamma")]
    assert len(gammas) == 4 and all(torch.all(g == torch.tensor(0.2)) for g in gammas)
    part, kinds = _partition("convnext-tiny")
    # stem + 3 downsamples and the four blocks' 7x7 depthwise convs (families/depthwise.py)
    assert kinds["ConvRegion"] == 8 and kinds["GemmRegion"] == 9 and kinds["NormRegion"] == 9
    assert not part.fallbacks, part.fallbacks


@needs_timm
def test_efficientnet_b0_small_forward_and_partition():
    out, _ = _forward("efficientnet-b0")
    assert out.shape == (2, 1000)
    part, kinds = _partition("efficientnet-b0")
    # the 16 depthwise convs too (families/depthwise.py)
    assert kinds == {"ConvRegion": 81, "GemmRegion": 1}
    assert not part.fallbacks, part.fallbacks


# ------------------------------------------------------------------ loader rules

def test_timm_missing_names_what_to_install(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "timm", None)      # import timm -> ImportError
    with pytest.raises(ImportError, match="torchvision"):
        models.load_model("convnext-tiny", "fp32", 1, 32)


def test_overrides_only_for_zoo_models():
    with pytest.raises(ValueError, match="no config overrides"):
        models.load_model("mlp", "fp32", 2, 4, hidden=8)


def test_a_factory_that_cannot_be_imported_says_how_to_fix_it():
    with pytest.raises(ValueError, match=r"no_such_module_xyz.*PYTHONPATH=\. cutlass-offload compile"):
        models.load_model("no_such_module_xyz:factory", "fp16")
    with pytest.raises(ValueError, match="has no attribute 'no_factory'") as e:
        models.load_model("os:no_factory", "fp16")
    assert "PYTHONPATH" not in str(e.value)          # the module imported: the path is not why


def _factories():
    """Factories of a module made for the test: bare (returns a model alone), boom
    (raises), fp64 (a float64 model), bad_forward (a forward that raises)."""
    import types
    mod = types.ModuleType("co_test_factories")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 16)

        def forward(self, x):
            return self.a(x)

    class Bad(Block):
        def forward(self, x):
            raise TypeError("forward broke")

    class DataDependent(Block):
        def forward(self, x):
            y = self.a(x)
            return y * 2 if y.sum() > 0 else y       # torch.export cannot guard on data

    def boom():
        raise RuntimeError("no weights here")
    mod.bare = Block
    mod.boom = boom
    mod.fp64 = lambda: (Block().double(), (torch.randn(2, 16, dtype=torch.float64),))
    mod.bad_forward = lambda: (Bad(), (torch.randn(2, 16),))
    mod.data_dependent = lambda: (DataDependent(), (torch.randn(2, 16),))
    mod.with_kwargs = lambda: (Block(), (torch.randn(2, 16),), {"scale": 2.0})
    return mod


def test_a_factory_that_fails_or_returns_something_else_is_one_clear_error(monkeypatch):
    """A fresh-user trial (session 50) got a 137-line traceback ending in "cannot unpack
    non-iterable Block object" from a factory returning the model alone."""
    import sys
    monkeypatch.setitem(sys.modules, "co_test_factories", _factories())
    with pytest.raises(ValueError, match=r"must return \(model, example_inputs\).*returned Block"):
        models.load_model("co_test_factories:bare", "fp16")
    # a third item (keyword arguments): the count and kinds, and that kwargs are not taken
    with pytest.raises(ValueError, match=r"keyword arguments are not taken.*a tuple of 3: "
                                         r"\(Block, tuple, dict\)"):
        models.load_model("co_test_factories:with_kwargs", "fp16")
    with pytest.raises(ValueError, match="raised RuntimeError: no weights here"):
        models.load_model("co_test_factories:boom", "fp16")
    with pytest.raises(ValueError, match="built-in models only"):
        models.load_model("co_test_factories:fp64", "fp16", batch=2)
    notes = []
    model, (x,) = models.load_model("co_test_factories:fp64", "fp16", notes=notes)
    assert model.a.weight.dtype == x.dtype == torch.float16
    assert notes == ["the model's float64 parameters and floating inputs were cast to fp16 (--dtype)"]
    notes = []
    models.load_model("mlp", "fp16", 2, 4, notes=notes)            # built-ins: cast as documented
    assert notes == []


def test_the_dtype_cast_leaves_complex_buffers_and_ties_as_they_are(monkeypatch):
    """--dtype casts floating parameters and buffers only: Module.to(float16) also cast a
    complex rotary table (torch.polar) to its real part, so RoPE went wrong without a
    word (fresh-user trial, session 54). Tied weights stay one tensor."""
    import sys
    import types
    import warnings

    class Rope(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 8)
            self.head = torch.nn.Linear(8, 10, bias=False)
            self.head.weight = self.emb.weight                 # tied
            angles = torch.outer(torch.arange(4.0), torch.rand(4))
            self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))
            self.register_buffer("scale", torch.ones(8, dtype=torch.float64))

    mod = types.ModuleType("co_test_complex")
    mod.rope = lambda: (Rope(), (torch.randn(2, 8),))
    monkeypatch.setitem(sys.modules, "co_test_complex", mod)
    torch.manual_seed(0)                                        # as load_model seeds the factory
    ref = Rope().freqs_cis
    with warnings.catch_warnings():
        warnings.simplefilter("error")                          # no complex-cast warning
        model, (x,) = models.load_model("co_test_complex:rope", "fp16")
    assert model.freqs_cis.dtype == torch.complex64 and torch.equal(model.freqs_cis, ref)
    assert model.emb.weight.dtype == model.scale.dtype == x.dtype == torch.float16
    assert model.head.weight is model.emb.weight


def test_a_forward_that_raises_is_a_capture_error(monkeypatch, capsys, tmp_path):
    """co.compile turns torch.export's failure into CaptureError (its cause kept), and the
    CLI prints it as one line with exit status 2."""
    import sys

    import cutlass_offload as co
    from cutlass_offload import cli
    from cutlass_offload.errors import CaptureError
    monkeypatch.setitem(sys.modules, "co_test_factories", _factories())
    model, x = models.load_model("co_test_factories:bad_forward", "fp16")
    with pytest.raises(CaptureError, match="TypeError: forward broke") as e:
        co.compile(model, x, arch="sm_90a")
    assert isinstance(e.value.__cause__, TypeError)
    with pytest.raises(CaptureError, match="TypeError: forward broke"):   # one tensor, not a tuple:
        co.compile(model, x[0], arch="sm_90a")                           # taken as (x,)
    capsys.readouterr()
    assert cli.main(["compile", "co_test_factories:bad_forward", "--arch", "sm_90a",
                     "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: torch.export could not capture") and "forward broke" in err[-1]
    # the model's own error: the line names the model's file and line, from its traceback
    assert "at test_zoo_models.py:" in err[-1], err[-1]
    assert not any("Traceback" in line for line in err)
    assert not (tmp_path / "out").exists()                         # nothing half-written


def test_torch_exports_own_output_stays_with_the_capture_error(monkeypatch, capsys, tmp_path):
    """A failed export prints the graph it traced (twice) and logs warnings: none of it
    reaches the console; the CaptureError keeps it (``torch_output``) and the CLI
    prints one line (a fresh-user trial, session 51: 45 lines before)."""
    import sys

    import cutlass_offload as co
    from cutlass_offload import cli
    from cutlass_offload.errors import CaptureError
    monkeypatch.setitem(sys.modules, "co_test_factories", _factories())
    model, x = models.load_model("co_test_factories:data_dependent", "fp16")
    capsys.readouterr()
    with pytest.raises(CaptureError, match="data-dependent") as e:
        co.compile(model, x, arch="sm_90a")
    assert "def forward" in e.value.torch_output
    assert capsys.readouterr().err == ""
    assert cli.main(["compile", "co_test_factories:data_dependent", "--arch", "sm_90a",
                     "--out", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [line for line in err if not line.startswith("note:")] == err[-1:], err    # the cast's note, then one line
    assert err[-1].startswith("error: torch.export could not capture"), err
    # what to do, and the user's line that did it (from torch's text)
    assert "torch.cond" in err[-1] and "test_zoo_models.py:" in err[-1] and " in forward: " in err[-1]
    # an export that succeeds passes on what was printed meanwhile, after it
    from cutlass_offload import api

    class Loud(torch.nn.Module):
        def forward(self, x):
            print("said while traced", file=sys.stderr)
            return x * 2

    def stop(*args, **kwargs):
        raise RuntimeError("stop after the capture")
    monkeypatch.setattr(api, "_compile_graph", stop)
    with pytest.raises(RuntimeError, match="stop after the capture"):
        co.compile(Loud(), (torch.randn(2, 16),), arch="sm_80")
    assert "said while traced" in capsys.readouterr().err


def test_zoo_defaults_and_layouts():
    for name in SMALL:
        assert name in models.BUILTIN and name in models.DEFAULT_SIZES
    assert {"convnext-tiny", "efficientnet-b0", "vae-decoder"} <= models.CHANNELS_LAST
    assert models.DEFAULT_SIZES["whisper-encoder"] == (4, 3000)


def test_batch_norm_calibration_normalizes_eval_activations():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3)
    net = torch.nn.Sequential(conv, torch.nn.BatchNorm2d(16))
    with torch.no_grad():
        conv.weight.mul_(10.0)
        conv.bias.add_(3.0)                            # far from the default statistics
    momentum = net[1].momentum
    models._calibrate_batch_norm(net, lambda: torch.randn(8, 3, 16, 16))
    assert not net.training and net[1].momentum == momentum
    with torch.no_grad():
        y = net(torch.randn(8, 3, 16, 16))
    per_channel = y.transpose(0, 1).flatten(1)
    assert per_channel.mean(1).abs().max() < 0.2
    assert (per_channel.std(1) - 1).abs().max() < 0.2


def test_a_mistyped_model_name_gets_a_suggestion():
    """A fresh-user trial (session 51) typed ``mpl``: the error names the nearest built-in."""
    with pytest.raises(ValueError, match=r"unknown model 'mpl': did you mean 'mlp'\?"):
        models.load_model("mpl", "fp16")
    with pytest.raises(ValueError, match=r"unknown model 'zzzz': use one of"):
        models.load_model("zzzz", "fp16")
    # a module named without its factory (session 52's trial: ``compile mine``)
    with pytest.raises(ValueError, match=r"'json' is a module: name its factory, json:FACTORY"):
        models.load_model("json", "fp16")


def test_compile_names_a_wrong_model_or_inputs_type():
    """A fresh-user trial (session 51): a lambda gave "'function' object has no attribute
    'eval'" and a dict of inputs "must be Tensor, not str", both as capture errors."""
    import cutlass_offload as co
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got function"):
        co.compile(lambda x: x * 2, (torch.randn(2, 16),), arch="sm_80")
    with pytest.raises(TypeError, match="example_inputs must be a tuple .* got dict"):
        co.compile(torch.nn.Linear(16, 16), {"x": torch.randn(2, 16)}, arch="sm_80")
