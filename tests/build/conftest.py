import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One build cache for the whole build tier: builds are shared across tests."""
    return tmp_path_factory.mktemp("cutlass_offload_cache")


@pytest.fixture(autouse=True)
def _use_cache(cache_dir, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(cache_dir))


@pytest.fixture(scope="session")
def staged_forms_built(cache_dir):
    """(plan, BuildResult) of staged_forms.py's one build of the off-by-default staged
    epilogue forms and the GLU's store forms (test_staged_epilogue_build.py,
    test_glu_staged_build.py)."""
    import staged_forms
    return staged_forms.build(cache_dir)


@pytest.fixture(scope="session")
def hopper_fmha_built(cache_dir):
    """(plan, BuildResult) of hopper_fmha.py's one build of the Hopper FMHA kernels
    (test_attention_staged_epilogue_build.py's, and those that test_attention_lpt_build.py
    and test_attention_sm90_build.py compile, which then find theirs in the cache)."""
    import hopper_fmha
    return hopper_fmha.build(cache_dir)
