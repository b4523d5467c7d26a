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
    assert info["failed"] == 0 and info["disk_bytes"] >= info["bytes"]
    cache.clear()
    assert cache.info()["entries"] == 0
    assert not cache.root.exists()                  # nothing else was there: the root goes too


def test_clear_removes_only_what_the_cache_wrote(tmp_path, monkeypatch, capsys):
    """CUTLASS_OFFLOAD_CACHE_DIR may name any folder: clear removes the cache's own
    folders and leaves the user's files (and a symlink's target) alone."""
    from cutlass_offload import cli
    from cutlass_offload.build.cache import PARTS
    root = tmp_path / "precious"
    cache = BuildCache(root)
    _publish(cache, cache_key("a"))
    for part in PARTS:
        (root / part).mkdir(exist_ok=True)
        (root / part / "x").write_text("x")
    (root / "thesis.txt").write_text("mine")
    (root / "notes").mkdir()
    (root / "notes" / "n.txt").write_text("mine too")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("k")
    (root / "failed").rename(tmp_path / "failed_real")
    (root / "failed").symlink_to(elsewhere)          # a link is not followed
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(root))
    assert cli.main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "other files there were left alone" in out and "obj" in out
    assert (root / "thesis.txt").read_text() == "mine" and (root / "notes" / "n.txt").exists()
    assert (elsewhere / "keep").exists()
    assert not any((root / p).is_dir() and not (root / p).is_symlink() for p in PARTS)


def test_nvcc_thread_count_is_not_part_of_the_key_but_flags_are():
    from cutlass_offload.build import toolchain
    one = toolchain.compile_command("nvcc", "sm90a", "a.cu", "a.o", cutlass=False)
    four = toolchain.compile_command("nvcc", "sm90a", "b.cu", "b.o", cutlass=False, threads=4)
    assert "-t4" in four and not any(a.startswith("-t") for a in one)
    assert toolchain.flags_signature(one) == toolchain.flags_signature(four)
    assert toolchain.flags_signature(one + ["-O2"]) != toolchain.flags_signature(one)
