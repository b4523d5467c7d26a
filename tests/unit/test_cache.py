"""Build cache (no nvcc): keys, atomic publish, corrupt entries are misses."""
import json

import pytest

from cutlass_offload.build.cache import META, BuildCache, cache_key


def _publish(cache, key, payload=b"library bytes"):
    staging = cache.staging("lib")
    (staging / "lib.so").write_bytes(payload)
    return cache.publish("lib", "lib_test", key, staging, "lib.so", {"ok": True})


def test_key_changes_with_every_part():
    base = cache_key("src", "-O3", "nvcc 13.0", "cutlass 4.2", "sm90a")
    for i in range(5):
        parts = ["src", "-O3", "nvcc 13.0", "cutlass 4.2", "sm90a"]
        parts[i] += "x"
        assert cache_key(*parts) != base
    assert cache_key("src", "-O3", "nvcc 13.0", "cutlass 4.2", "sm90a") == base
    assert cache_key("ab", "c") != cache_key("a", "bc")


def test_publish_then_lookup(tmp_path):
    cache = BuildCache(tmp_path)
    key = cache_key("x")
    assert cache.lookup("lib", "lib_test", key, "lib.so") is None
    d = _publish(cache, key)
    hit = cache.lookup("lib", "lib_test", key, "lib.so")
    assert hit is not None and hit[0] == d and (d / "lib.so").read_bytes() == b"library bytes"
    assert d.name.startswith("lib_test.") and len(d.name.split(".")[-1]) == 16
    assert not list((tmp_path / "lib").glob(".staging-*"))


def test_truncated_artifact_is_a_miss(tmp_path):
    cache = BuildCache(tmp_path)
    key = cache_key("y")
    d = _publish(cache, key)
    (d / "lib.so").write_bytes(b"lib")
    assert cache.lookup("lib", "lib_test", key, "lib.so") is None


@pytest.mark.parametrize("damage", ["delete", "garbage", "other_key"])
def test_entry_without_valid_meta_is_a_miss(tmp_path, damage):
    cache = BuildCache(tmp_path)
    key = cache_key("z")
    d = _publish(cache, key)
    if damage == "delete":
        (d / META).unlink()
    elif damage == "garbage":
        (d / META).write_text("{not json")
    else:
        meta = json.loads((d / META).read_text())
        meta["key"] = "0" * 64
        (d / META).write_text(json.dumps(meta))
    assert cache.lookup("lib", "lib_test", key, "lib.so") is None
    _publish(cache, key)                 # a rebuild replaces the half entry
    assert cache.lookup("lib", "lib_test", key, "lib.so") is not None


def test_info_and_clear(tmp_path):
    cache = BuildCache(tmp_path / "c")
    _publish(cache, cache_key("a"))
    _publish(cache, cache_key("b"))
    info = cache.info()
    assert info["entries"] == 2 and info["bytes"] > 0
    cache.clear()
    assert cache.info()["entries"] == 0


def test_nvcc_thread_count_is_not_part_of_the_key_but_flags_are():
    from cutlass_offload.build import toolchain
    one = toolchain.compile_command("nvcc", "sm90a", "a.cu", "a.o", cutlass=False)
    four = toolchain.compile_command("nvcc", "sm90a", "b.cu", "b.o", cutlass=False, threads=4)
    assert "-t4" in four and not any(a.startswith("-t") for a in one)
    assert toolchain.flags_signature(one) == toolchain.flags_signature(four)
    assert toolchain.flags_signature(one + ["-O2"]) != toolchain.flags_signature(one)
