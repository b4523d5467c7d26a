"""benchmarks/glue_profile.py without a GPU: kernel names sorted into classes (ours
against PyTorch's cuBLAS / cuDNN / SDPA, Triton, copies), and the no-GPU exit."""
import sys

import pytest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import glue_profile as gp  # noqa: E402


def test_kernel_classes():
    cases = {
        "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEE": "ours gemm",
        "_ZN7cutlass13device_kernelINS_4conv6kernel13ConvUniversalINS1_16ConvProblemShape": "ours conv",
        "void cutlass::device_kernel<cutlass::fmha::kernel::FmhaKernelTmaWarpSpecialized<x>>": "ours attention",
        "void co_rowwise_norm::rowwise_norm_kernel<cutlass::half_t, 8, false, true, true>(...)": "ours norm",
        "nvjet_sm90_hsh_176x128_64x5_1x2_h_bz_TNN": "pytorch gemm",
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align2>(x)":
            "pytorch gemm",
        "sm90_xmma_depthwise_convolution_fprop_tiling_f16f16_f32f32_f32_nhwckrsc_nhwc": "pytorch conv",
        "conv2d_c1_k1_nhwc_specialized": "pytorch conv",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7": "pytorch attention",
        "triton_poi_fused__to_copy_add_mul_3": "triton",
        "Memset (Device)": "copy",
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<x>>": "eager elementwise",
    }
    for name, cls in cases.items():
        assert gp.classify(name) == cls, name


def test_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(gp.torch.cuda, "is_available", lambda: False)
    assert gp.main(["mlp"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_idle_gaps_sum_the_waits_between_kernels_and_name_what_they_follow():
    # b starts 5 us after a ends; d runs inside c (no gap); e starts 10 us after c ends
    spans = [(40.0, 41.0, "e"), (0.0, 10.0, "a"), (15.0, 20.0, "b"), (20.0, 30.0, "c"), (25.0, 28.0, "d")]
    idle = gp.idle_gaps(spans, reps=5)
    assert idle["us_per_forward"] == pytest.approx(15.0 / 5)
    assert idle["after"] == [[pytest.approx(2.0), "c"], [pytest.approx(1.0), "a"]]
    assert gp.idle_gaps([], reps=1) == {"us_per_forward": 0.0, "after": []}


def _stub_run_variant(monkeypatch, capture, compile_captured):
    """run_variant without a GPU: ``capture`` and ``compile_captured`` stand in for
    glue_profile's, timing, errors and profiles are zeros. Returns its arguments."""
    monkeypatch.setattr(gp, "capture", capture)
    monkeypatch.setattr(gp, "compile_captured", compile_captured)
    monkeypatch.setattr(gp, "resolve_arch", lambda arch: "sm90a")
    monkeypatch.setattr(gp.torch.cuda, "synchronize", lambda: None)
    for name in ("rel_err", "events_ms"):
        monkeypatch.setattr(gp, name, lambda *a, **k: 0.0)
    monkeypatch.setattr(gp, "kernel_profile", lambda *a, **k: {})
    return gp.argparse.Namespace(rounds=1, mode="reduce-overhead", reps=1, profile_reps=1, host_profile=0,
                                 sequence=0, sequence_at=None)


def test_dynamic_glue_auto_variant_captures_dynamic_and_specializes_the_glue(monkeypatch):
    """``ours_dynamic_glue_auto``: runtime.py's dynamic-batch capture with the glue's
    first compile specialized (set_glue dynamic="auto"); ``ours_dynamic`` keeps the
    exported (symbolic) glue."""
    seen = []

    class Compiled:
        plan = type("Plan", (), {"regions": ()})()
        inductor = None

        def set_glue(self, glue, mode=None, dynamic="exported"):
            seen.append(("set_glue", glue, mode, dynamic))
            return self

        def __call__(self, *args):
            return args[0]

    args = _stub_run_variant(monkeypatch, lambda model, inputs, dynamic_batch=False:
                             seen.append(("capture", dynamic_batch)), lambda cap, options, **kw: Compiled())
    x = gp.torch.ones(2)
    gp.run_variant("ours_dynamic_glue_auto", None, (x,), ((x,), x), args)
    assert seen == [("capture", True), ("set_glue", "inductor", "reduce-overhead", "auto")]
    seen.clear()
    gp.run_variant("ours_dynamic", None, (x,), ((x,), x), args)
    assert seen == [("capture", True)]


def test_kernel_sequence_lists_the_kernels_before_the_first_match_in_order():
    spans = [(30.0, 38.0, "triton_poi_fused_clone_2"), (0.0, 20.0, "nvjet_sm90_gemm_q"),
             (21.0, 29.0, "triton_poi_fused_clone_1"), (40.0, 120.0, "cudnn_generated_fort_native_sdpa"),
             (121.0, 130.0, "triton_poi_fused_clone_3"), (131.0, 150.0, "nvjet_sm90_gemm_o"),
             (151.0, 160.0, "triton_per_layer_norm"), (200.0, 280.0, "cudnn_generated_fort_native_sdpa")]
    seq = gp.kernel_sequence(spans, "sdpa|fmha", 2)
    assert [k["name"] for k in seq] == ["triton_poi_fused_clone_1", "triton_poi_fused_clone_2",
                                        "cudnn_generated_fort_native_sdpa", "triton_poi_fused_clone_3",
                                        "nvjet_sm90_gemm_o"]
    assert [k["us"] for k in seq] == [8.0, 8.0, 80.0, 9.0, 19.0]
    assert [k["gap_us"] for k in seq] == [1.0, 1.0, 2.0, 1.0, 1.0]
    assert seq[2]["class"] == "pytorch attention"
    assert gp.kernel_sequence(spans, "no such kernel", 3) == []
    assert [k["name"] for k in gp.kernel_sequence(spans, None, 0)] == [
        "nvjet_sm90_gemm_q", "triton_poi_fused_clone_1", "triton_poi_fused_clone_2"]


def test_drift_flags_rounds_far_from_the_first_timing():
    assert gp.drift(4.877, [7.510, 7.740, 7.469]) == pytest.approx(7.510 / 4.877 - 1)
    assert gp.drift(4.244, [4.750, 4.730, 4.694, 4.775, 4.719]) is None      # +11%: within the limit
    assert gp.drift(5.0, [3.9, 4.0, 4.1]) == pytest.approx(-0.2)


def test_staged_epilogue_variant_switches_the_epilogue_during_the_compile_only(monkeypatch):
    from cutlass_offload.emit import staged
    seen = []

    class Compiled:
        plan = type("Plan", (), {"regions": ()})()
        inductor = None

        def __call__(self, *args):
            return args[0]

    def compile_captured(cap, options, **kw):
        seen.append(staged.ENABLED)
        return Compiled()

    args = _stub_run_variant(monkeypatch, lambda model, inputs, dynamic_batch=False: None, compile_captured)
    x = gp.torch.ones(2)
    before = staged.ENABLED
    for variant in ("ours_staged_epilogue", "ours"):
        gp.run_variant(variant, None, (x,), ((x,), x), args)
    assert seen == [True, before]
    assert staged.ENABLED == before
