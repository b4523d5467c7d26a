import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One build cache for the whole build tier: builds are shared across tests."""
    return tmp_path_factory.mktemp("cutlass_offload_cache")


@pytest.fixture(autouse=True)
def _use_cache(cache_dir, monkeypatch):
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(cache_dir))
