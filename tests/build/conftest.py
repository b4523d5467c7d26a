import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One build cache for the whole build tier: builds are shared across tests."""
    return tmp_path_factory.mktemp("cutlass_offload_cache")


@pytest.fixture(autouse=True)
def _use_cache(cache_dir, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(cache_dir))


@pytest.fixture(scope="session", autouse=True)
def build_ahead(request, cache_dir, tmp_path_factory):
    """build_ahead.Ahead: the tier's heavy sm_90a builds that this session's tests use,
    compiled into ``cache_dir`` by two worker processes from the tier's first test on
    (see build_ahead.py); a test calls ``build_ahead.wait(item)`` before its build.
    CUTLASS_OFFLOAD_BUILD_AHEAD sets the number of workers; 0 runs none (each test
    compiles its own, to time one test's cold build)."""
    import os
    from pathlib import Path

    import build_ahead as ahead
    here = Path(__file__).resolve().parent
    tests = {f"{item.path.stem}::{getattr(item, 'originalname', item.name)}"
             for item in request.session.items if Path(item.path).resolve().parent == here}
    workers = int(os.environ.get("CUTLASS_OFFLOAD_BUILD_AHEAD", str(ahead.WORKERS)))
    pool = ahead.Ahead(cache_dir, tmp_path_factory.mktemp("build_ahead"), tests, workers)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def staged_forms_built(cache_dir, build_ahead):
    """(plan, BuildResult) of staged_forms.py's one build of the off-by-default staged
    epilogue forms and the GLU's store forms (test_staged_epilogue_build.py,
    test_glu_staged_build.py)."""
    import staged_forms
    build_ahead.wait("staged_forms")
    return staged_forms.build(cache_dir)


@pytest.fixture(scope="session")
def hopper_fmha_built(cache_dir, build_ahead):
    """(plan, BuildResult) of hopper_fmha.py's one build of the Hopper FMHA kernels
    (test_attention_staged_epilogue_build.py's, and those that test_attention_lpt_build.py
    and test_attention_sm90_build.py compile, which then find theirs in the cache)."""
    import hopper_fmha
    build_ahead.wait("hopper_fmha")
    return hopper_fmha.build(cache_dir)
