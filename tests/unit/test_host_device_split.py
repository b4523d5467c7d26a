"""benchmarks/host_device_split.py without nvcc: the emitted unit's launch rewritten
to go through a kernel handle, so its host-only compile instantiates no kernel."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import host_device_split as hds  # noqa: E402


def test_host_only_unit_launches_through_a_handle_and_instantiates_no_kernel():
    text, name = hds.emit_unit(256, 128, 64, "relu")
    assert name.startswith("cutlass3x_sm90_gemm_f16")
    assert "cutlass::device_kernel<GemmKernel>" in text
    host = hds.host_only(text)
    # the kernel adapter's run (templates/sm90_kernel_adapter.h) names device_kernel in a
    # template; nothing calls it once co_launch goes through the handle
    assert "device_kernel<GemmKernel>" not in host and "Gemm::run(" not in host
    assert "cudaLaunchKernelExC(&config, co_kernel_handle" in host
    # everything else is the emitted unit: the Params are still built by run()
    assert host.count("int run(const CoGemmArgs& args, cudaStream_t stream) {") == 1
    assert "to_underlying_arguments(arguments, args.workspace)" in host
    with pytest.raises(ValueError, match="co_launch"):
        hds.host_only("int run(void);")
