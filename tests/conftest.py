import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))   # helpers.py, gemm_cases.py


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _tests_keep_out_of_the_user_cache(tmp_path_factory):
    """Without CUTLASS_OFFLOAD_CACHE_DIR set, the tests' kernel cache entries, tuning
    results and recent-folder lists (recent_folders.py) go to a cache of this session,
    not the user's: a test run must not change what a user's next compile reads. The
    C++ call-path extension (runtime/fast_call.py, about a minute to build) is still
    built once into the user's cache and shared, through a link. A run that sets the
    variable (the GPU machine's scripts share their kernels that way) keeps it."""
    if os.environ.get("CUTLASS_OFFLOAD_CACHE_DIR"):
        yield
        return
    from cutlass_offload.config import knobs
    real = knobs().cache_dir / "fast_call"
    tmp = tmp_path_factory.mktemp("cutlass_offload_cache")
    try:
        real.mkdir(parents=True, exist_ok=True)
        (tmp / "fast_call").symlink_to(real, target_is_directory=True)
    except OSError:
        pass                    # an unwritable home: the extension builds in the session's cache
    os.environ["CUTLASS_OFFLOAD_CACHE_DIR"] = str(tmp)
    try:
        yield
    finally:
        os.environ.pop("CUTLASS_OFFLOAD_CACHE_DIR", None)


# Knobs that change which kernel source the emitters write: the unit tier checks the
# defaults' sources and pins any other form itself (staged.ENABLED, monkeypatch.setenv),
# so a developer's shell (CUTLASS_OFFLOAD_STAGED_EPILOGUE=1 for a benchmark) must not
# turn its checks of CUTLASS's TMA epilogue into failures. The GPU and build tiers keep
# the environment: their scripts choose forms through it.
_SOURCE_KNOBS = ("CUTLASS_OFFLOAD_STAGED_EPILOGUE",)


@pytest.fixture(autouse=True)
def _unit_tier_sees_the_default_sources(request, monkeypatch):
    if os.path.join("tests", "unit") in str(request.node.path):
        for name in _SOURCE_KNOBS:
            monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture
def cutlass_tma_epilogue(monkeypatch):
    """Pins CUTLASS's own TMA epilogue (collective builder, fusion callbacks) for the
    sm90 GEMMs, convs and GLUs and the example's epilogue for the Hopper FMHA,
    whatever the default form is: for the tests that check those sources."""
    from cutlass_offload.emit import attention_sm90, staged
    monkeypatch.setattr(staged, "ENABLED", False)
    monkeypatch.setattr(attention_sm90, "STAGED_EPILOGUE", False)
