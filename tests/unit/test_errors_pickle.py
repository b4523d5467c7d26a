"""Every error the package raises on purpose survives pickling with its message and
attributes: a Ray worker's or a process pool's exception reaches the caller as itself
(pickle rebuilds an exception from ``args``, which the constructors below do not take
as they are)."""
import inspect
import pickle

import pytest

from cutlass_offload import errors
from cutlass_offload.build.executor import ToolchainMismatch

CASES = [
    errors.CompileError("nvcc failed on shard_sm90_gemm_f16_1k", command=["nvcc", "-c", "unit.cu"],
                        log_path="/c/failed/unit.log", source_path="/c/failed/unit.cu",
                        kernels=("k1", "k2"), regions=("linear_3",)),
    errors.DamagedFileError("/out/weights.bin", "is truncated (12 of 40 bytes)", "compile again"),
    errors.DiskFullError("/out/model.pt2", "free space there"),
    errors.ToolchainError("nvcc not found"),
    errors.DeviceError("no CUDA device"),
    errors.CaptureError("torch.export could not capture the model"),
    errors.KernelLaunchError("launch failed"),
    errors.CutlassOffloadError("strict mode: ops left in PyTorch"),
    ToolchainMismatch("worker w1 has nvcc 12.8"),
    errors.UnsupportedRegion("dynamic head dim"),
    errors.LeftByChoice("left to the glue by choice"),
    errors.InputsError("3 example inputs for M.forward"),
]


@pytest.mark.parametrize("error", CASES, ids=lambda e: type(e).__name__)
def test_an_error_pickles_as_itself(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error) and again.args == error.args
    assert again.__dict__ == error.__dict__


def test_every_error_class_with_its_own_constructor_is_covered():
    """A new error class whose constructor takes other arguments than its message
    needs a case above (and a __reduce__)."""
    covered = {type(e) for e in CASES}
    for name, cls in vars(errors).items():
        if inspect.isclass(cls) and issubclass(cls, Exception) and cls.__module__ == errors.__name__:
            assert cls in covered, name
