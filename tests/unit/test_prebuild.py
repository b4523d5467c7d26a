"""cutlass-offload prebuild (issue 17): the kernels a target's heuristic can choose,
compiled into the cache ahead of a model, so the model's compile builds only its
launchers. The fake nvcc (tests/fake_nvcc.py) logs every compile; no CUDA."""
import pytest

import cutlass_offload as co
from cutlass_offload import cli
from cutlass_offload.emit import gemm_sm90
from cutlass_offload.prebuild import epilogues, known_epilogues, prebuild, prebuild_kernels
from fault_helpers import fake_env, nvcc_calls, small_model


def test_kernel_list():
    ks = prebuild_kernels("sm80", ["f16"], ["bias", "bias_relu"])
    assert len(ks) == 8 and len({k.name for k in ks}) == 8          # 4 configs x 2 epilogues
    assert {k.epilogue.tag for k in ks} == {"bias", "bias_relu"}
    sm90 = prebuild_kernels("sm90a", ["f16", "bf16"], ["plain"], ["col", "row"])
    assert all(k.config.family == "cutlass3x_sm90" for k in sm90)
    assert {k.dtype for k in sm90} == {"f16", "bf16"} and {k.layout_b for k in sm90} == {"col", "row"}
    # every tag names its own epilogue
    assert all(ep.tag == tag for tag, ep in known_epilogues().items())
    with pytest.raises(ValueError, match="unknown epilogue 'bias_tanh' \\(did you mean bias_gelutanh"):
        epilogues(["bias_tanh"])
    with pytest.raises(ValueError, match=r"\[bias_\]glu_ACT, ACT one of gelu, .*silu \(108 in all\)$"):
        epilogues(["bogus"])          # how tags are spelled, not all 108 of them


def test_a_model_whose_kernels_are_prebuilt_compiles_only_its_launchers(tmp_path, monkeypatch):
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    res = prebuild("sm80", prebuild_kernels("sm80", ["f16"], ["bias", "bias_relu"]))
    assert all(u["ok"] for u in res.to_dict()["units"])
    before = nvcc_calls(tmp_path)
    model, inputs = small_model()
    compiled = co.compile(model, inputs, arch="sm_80", glue="eager")
    new = nvcc_calls(tmp_path)[len(before):]
    assert len(compiled.plan.kernels) == 2
    # the launchers' object and the library's link: no kernel was compiled again
    assert [c.split()[0] for c in new] == ["compile", "link"], new
    units = compiled.report.build["units"]
    assert [u["name"] for u in units if not u["cache_hit"]] == ["launchers"], units


def test_cli_lists_without_building(capsys):
    assert cli.main(["prebuild", "--arch", "sm_80", "--dtype", "fp16", "--epilogues", "bias", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "4 kernels" and all(l.startswith("cutlass2x_sm80_gemm_f16") for l in out[:-1])
    assert cli.main(["prebuild", "--arch", "sm_80", "--epilogues", "nope", "--list"]) == 2


def test_cli_lists_the_hopper_attention_kernels_select_can_choose(capsys):
    from cutlass_offload.families import attention_sm90
    assert cli.main(["prebuild", "--arch", "sm_90a", "--dtype", "fp16", "--epilogues", "bias",
                     "--attention", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    names = [n for n in out if n.startswith("cutlass3x_sm90_fmha_fwd_f16_")]
    expected = set()
    for causal in (False, True):
        orders = {"persistent", attention_sm90.CAUSAL_DEFAULT_ORDER if causal else "persistent"}
        configs = {attention_sm90.config_for(h, order=o)
                   for h in attention_sm90.DEFAULT_HEAD_TILES for o in orders}
        configs |= set(attention_sm90.learned_configs())
        expected |= {(c, causal) for c in configs if attention_sm90.legal_for(c, causal)}
    assert len(names) == len(expected) and len(set(names)) == len(names)
    assert "cutlass3x_sm90_fmha_fwd_f16_128x128x64_s5_pingpong_lpt_causal" in names   # from the table
    assert "cutlass3x_sm90_fmha_fwd_f16_128x64x64_s5_coop_lpt_causal" in names        # causal default
    assert "cutlass3x_sm90_fmha_fwd_f16_128x64x64_s5_coop_causal" in names            # one query tile
    assert cli.main(["prebuild", "--arch", "sm_80", "--attention", "--list"]) == 2


def test_conv_kernels_prebuild_so_a_conv_model_compiles_only_its_launchers(tmp_path, monkeypatch):
    """A conv search prebuilds its candidates (benchmarks/_conv_search.py): conv kernels
    take a stand-in conv region, and the model's compile finds them cached."""
    import torch

    from cutlass_offload.capture import capture
    from cutlass_offload.config import CompileOptions
    from cutlass_offload.partition import partition
    from cutlass_offload.select import select
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU()).half()
    x = torch.randn(2, 16, 8, 8).half()
    opts = CompileOptions(arch="sm80")
    plan = select(partition(capture(model, (x,)).graph_module, opts), "sm80", opts)
    res = prebuild("sm80", list(plan.kernels))
    assert all(u["ok"] for u in res.to_dict()["units"]) and len(plan.kernels) == 1
    before = nvcc_calls(tmp_path)
    compiled = co.compile(model, (x,), arch="sm_80", glue="eager")
    assert [k.name for k in compiled.plan.kernels] == [plan.kernels[0].name]
    new = nvcc_calls(tmp_path)[len(before):]
    assert [c.split()[0] for c in new] == ["compile", "link"], new


def test_prebuilt_tma_convs_leave_a_conv_model_only_its_launchers(tmp_path, monkeypatch, capsys):
    """``prebuild --convs`` (sm_90a): the rule's tiles and the conv table's choices for
    the common conv epilogues; a conv model whose convs take them compiles none."""
    import torch

    from cutlass_offload.families import conv_sm90, conv_sm90_table
    from cutlass_offload.prebuild import DEFAULT_CONV_EPILOGUES, chosen_conv_kernels
    ks = chosen_conv_kernels(["f16"], ["bias_relu"])
    tiles = {k.config.tile for k in ks}
    assert {t for t, _, _, _ in conv_sm90.CANDIDATES} <= tiles
    assert {(c.iterator, c.config, c.launch) for c in conv_sm90_table.choices()} <= \
        {(k.iterator, k.config, k.launch) for k in ks}
    assert cli.main(["prebuild", "--arch", "sm_90a", "--dtype", "fp16", "--epilogues", "bias",
                     "--convs", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sum("_conv2d_fprop_f16_" in n for n in out) == len(ks) * len(DEFAULT_CONV_EPILOGUES)
    assert cli.main(["prebuild", "--arch", "sm_80", "--convs", "--list"]) == 2

    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    assert all(u["ok"] for u in prebuild("sm90a", ks).to_dict()["units"])
    before = nvcc_calls(tmp_path)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU()).half()
    x = torch.randn(2, 16, 8, 8).half().contiguous(memory_format=torch.channels_last)
    compiled = co.compile(model.to(memory_format=torch.channels_last), (x,), arch="sm_90a",
                          glue="eager")
    assert [k.name for k in compiled.plan.kernels][0] in {k.name for k in ks}
    new = nvcc_calls(tmp_path)[len(before):]
    assert [c.split()[0] for c in new] == ["compile", "link"], new


def test_prebuild_of_named_models_leaves_their_compile_no_kernel_to_build(tmp_path, monkeypatch, capsys):
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)
    assert cli.main(["prebuild", "--arch", "sm_80", "--models", "mlp", "--dtype", "fp16", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert nvcc_calls(tmp_path) == []                          # --list builds nothing
    assert cli.main(["prebuild", "--arch", "sm_80", "--models", "mlp", "--dtype", "fp16", "-q"]) == 0
    assert any(c.startswith("compile") for c in nvcc_calls(tmp_path))
    before = len(nvcc_calls(tmp_path))
    assert cli.main(["compile", "mlp", "--arch", "sm_80", "--out", str(tmp_path / "m"), "-q"]) == 0
    new = nvcc_calls(tmp_path)[before:]
    # the model's kernels were all there: its launchers and the link only
    assert [c.split()[0] for c in new] == ["compile", "link"], new
    kernels = {k for k in listed if k.startswith("cutlass")}
    import json
    report = json.loads((tmp_path / "m" / "report.json").read_text())
    assert {r["kernel"] for r in report["regions"]} <= kernels and kernels


def test_model_plan_renames_regions_apart():
    from cutlass_offload.prebuild import model_plan
    plan = model_plan(["mlp"], "sm80", ["f16", "bf16"])
    names = [r.name for r in plan.regions]
    assert len(names) == len(set(names)) and all(n.startswith(("mlp_f16_", "mlp_bf16_")) for n in names)
    assert {k.dtype for k in plan.kernels} == {"f16", "bf16"}


def test_model_plan_takes_the_built_ins_sizes(monkeypatch):
    """prebuild --models --batch / --seq capture the built-ins at those sizes, as
    compile does (a fresh-user trial, session 50: only the defaults could be prebuilt)."""
    from cutlass_offload import models
    from cutlass_offload.prebuild import model_plan
    seen = []
    real = models.BUILTIN["mlp"]

    def mlp(batch, seq, **kw):
        seen.append((batch, seq))
        return real(batch=batch, seq=seq, **kw)
    monkeypatch.setitem(models.BUILTIN, "mlp", mlp)
    model_plan(["mlp"], "sm80", batch=3, seq=40)
    model_plan(["mlp"], "sm80")
    assert seen == [(3, 40), (8, 128)]
    with pytest.raises(ValueError, match="size the models of --models"):
        cli._cmd_prebuild(cli_args(batch=2))


def cli_args(**kw):
    import argparse
    base = dict(arch="sm_80", dtype="fp16", models="", batch=None, seq=None, epilogues="plain",
                layouts="col", attention=False, convs=False, list=True, jobs=0, executor="local",
                ray_address=None, quiet=True)
    return argparse.Namespace(**{**base, **kw})


def test_a_model_whose_package_is_missing_is_named_and_the_others_build(tmp_path, monkeypatch, capsys):
    """prebuild --models with one model whose package this machine lacks (sd-unet
    without diffusers): that model is named with the import error, every other
    model's kernels are still listed and built, and the exit status is 1."""
    from cutlass_offload import models
    from cutlass_offload.prebuild import model_plan
    for k, v in fake_env(tmp_path).items():
        monkeypatch.setenv(k, v)

    def needs_diffusers(**_):
        raise ModuleNotFoundError("No module named 'diffusers'", name="diffusers")
    monkeypatch.setitem(models.BUILTIN, "needs-diffusers", needs_diffusers)
    with pytest.raises(ImportError):
        model_plan(["mlp", "needs-diffusers"], "sm80")         # no skipped dict: raises
    skipped = {}
    plan = model_plan(["mlp", "needs-diffusers"], "sm80", ["f16", "bf16"], skipped=skipped)
    assert list(skipped) == ["needs-diffusers"] and "diffusers" in skipped["needs-diffusers"]
    assert plan.kernels and all(r.name.startswith("mlp_") for r in plan.regions)
    assert cli.main(["prebuild", "--arch", "sm_80", "--models", "needs-diffusers,mlp", "--list"]) == 1
    out, err = capsys.readouterr()
    assert "skipped model needs-diffusers: ModuleNotFoundError: No module named 'diffusers'" in err
    assert "prebuild: capturing mlp (f16)" in err and "prebuild: capturing mlp (bf16)" in err
    assert any(w.startswith("cutlass") for w in out.split())
    assert cli.main(["prebuild", "--arch", "sm_80", "--models", "needs-diffusers,mlp", "-q"]) == 1
    assert "models skipped: needs-diffusers" in capsys.readouterr().out
    assert any(c.startswith("compile") for c in nvcc_calls(tmp_path))     # mlp's kernels built


def test_glu_epilogues_are_prebuilt_on_sm90a_only():
    # llama's SwiGLU runs as one GEMM with a GLU epilogue (partition/gated_gemm.py); no
    # 2.x kernel has that epilogue, so sm_80 prebuilds skip it instead of failing
    assert "glu_silu" in known_epilogues() and known_epilogues()["bias_glu_gelu"].glu
    sm90a = prebuild_kernels("sm90a", dtypes=("f16",), epilogue_tags=("glu_silu", "bias"))
    assert {k.epilogue.tag for k in sm90a} == {"glu_silu", "bias"}
    # the learned table's N-split (192-row) and swap_ab tiles take no GLU epilogue: bias only
    no_glu = [k for k in sm90a if k.config.n_split or k.config.swap_ab]
    assert any(k.config.n_split for k in no_glu) and any(k.config.swap_ab for k in no_glu)
    assert all(k.epilogue.tag == "bias" for k in no_glu)
    assert sum(k.epilogue.glu for k in sm90a) == (len(sm90a) - len(no_glu)) // 2
    for k in sm90a:                  # every listed kernel emits (no build refuses one)
        gemm_sm90.emit(k)
    sm80 = prebuild_kernels("sm80", dtypes=("f16",), epilogue_tags=("glu_silu", "bias"))
    assert sm80 and {k.epilogue.tag for k in sm80} == {"bias"}
