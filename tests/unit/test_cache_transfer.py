"""build/cache_transfer.py (no nvcc): a cache's compiled units and kernel index go
to a tar file and into another cache whole; what is not a successful, intact entry
stays behind; an archive holding anything but cache files is refused before anything
is imported; a tampered entry is skipped, counted, never published."""
import io
import json
import tarfile

import pytest

from cutlass_offload.build import cache_transfer
from cutlass_offload.build.cache import BuildCache, DamagedCacheEntryWarning, cache_key
from cutlass_offload.cli import main


def _entry(cache, prefix, text, ok=True):
    key = cache_key(prefix, text)
    staging = cache.staging("obj")
    (staging / "unit.cu").write_text(text)
    (staging / "nvcc.log").write_text("")
    if ok:
        (staging / "unit.o").write_bytes(b"\x7fELF" + text.encode() * 50)
    with cache.lock("obj", prefix, key):
        cache.publish("obj", prefix, key, staging, "unit.o" if ok else None,
                      {"ok": ok, "kernels": [f"k_{text}"]})
    if ok:
        idx = cache.root / "index" / f"{cache_key('kernel', text)[:32]}.json"
        idx.parent.mkdir(parents=True, exist_ok=True)
        idx.write_text(json.dumps({"kernel": f"k_{text}", "prefix": prefix, "key": key}))
    return key


@pytest.fixture
def source(tmp_path):
    cache = BuildCache(tmp_path / "a")
    keys = {t: _entry(cache, "shard_sm90_gemm_f16_1k", t) for t in ("one", "two")}
    keys["failed"] = _entry(cache, "shard_sm80_conv_f16_1k", "failed", ok=False)
    return cache, keys


def test_export_then_import_carries_units_and_index_whole(source, tmp_path):
    cache, keys = source
    out = cache_transfer.export(tmp_path / "k.tar.gz", cache)
    assert (out.entries, out.indexes, out.damaged) == (2, 2, 0)
    dest = BuildCache(tmp_path / "b")
    got = cache_transfer.import_(tmp_path / "k.tar.gz", dest)
    assert (got.entries, got.indexes, got.present, got.damaged) == (2, 2, 0, 0)
    for t in ("one", "two"):
        hit = dest.lookup("obj", "shard_sm90_gemm_f16_1k", keys[t], "unit.o")
        assert hit is not None and (hit[0] / "unit.o").read_bytes().startswith(b"\x7fELF")
        assert hit[1]["imported"] and hit[1]["kernels"] == [f"k_{t}"]
    # the failed build stays behind: another machine may well compile it
    assert dest.lookup("obj", "shard_sm80_conv_f16_1k", keys["failed"], "unit.o") is None
    assert sorted(p.name for p in (dest.root / "index").iterdir()) == \
        sorted(p.name for p in (cache.root / "index").iterdir())
    again = cache_transfer.import_(tmp_path / "k.tar.gz", dest)
    assert (again.entries, again.present, again.indexes) == (0, 2, 0)


def test_a_damaged_entry_is_not_exported(source, tmp_path):
    cache, keys = source
    d, _ = cache.lookup("obj", "shard_sm90_gemm_f16_1k", keys["one"], "unit.o")
    (d / "unit.o").write_bytes(b"\x7fELF truncated")
    with pytest.warns(DamagedCacheEntryWarning):
        out = cache_transfer.export(tmp_path / "k.tar", cache)
    assert (out.entries, out.damaged, out.indexes) == (1, 1, 1)


def test_an_export_is_shareable_and_makes_no_folders(source, tmp_path):
    """A fresh-user trial (session 51): exports were 0600 (mkstemp's mode), and a
    mistyped folder was created."""
    cache, _ = source
    cache_transfer.export(tmp_path / "k.tar", cache)
    assert (tmp_path / "k.tar").stat().st_mode & 0o777 == 0o666 & ~cache_transfer._umask()
    with pytest.raises(FileNotFoundError, match="no such folder"):
        cache_transfer.export(tmp_path / "missing" / "k.tar", cache)
    assert not (tmp_path / "missing").exists()


def _rewrite(src, dst, change):
    """Copy the tar ``src`` to ``dst``, each member's bytes through change(name, data)."""
    with tarfile.open(src) as a, tarfile.open(dst, "w") as b:
        for m in a.getmembers():
            data = change(m.name, a.extractfile(m).read())
            info = tarfile.TarInfo(m.name)
            info.size = len(data)
            b.addfile(info, io.BytesIO(data))


def test_a_tampered_unit_is_skipped_and_counted(source, tmp_path):
    cache, keys = source
    cache_transfer.export(tmp_path / "k.tar", cache)

    def flip(name, data):
        if name.endswith("unit.o") and keys["two"][:16] in name:
            return data[:-1] + bytes([data[-1] ^ 1])
        return data
    _rewrite(tmp_path / "k.tar", tmp_path / "bad.tar", flip)
    dest = BuildCache(tmp_path / "b")
    got = cache_transfer.import_(tmp_path / "bad.tar", dest)
    assert (got.entries, got.damaged, got.indexes) == (1, 1, 1)
    assert dest.lookup("obj", "shard_sm90_gemm_f16_1k", keys["two"], "unit.o") is None
    assert not list((dest.root / "obj").glob("*two*"))
    assert not list((dest.root / "obj").glob(".staging-*"))


@pytest.mark.parametrize("evil", ["../escape.txt", "/etc/cron.d/x", "obj/x.0123456789abcdef/../../y",
                                  "obj/x.0123456789abcdef/..", "obj/..0123456789abcdef/unit.o",
                                  "lib/lib_sm90a.0123456789abcdef/libcutlass_offload.so"])
def test_anything_but_cache_files_refuses_the_whole_archive(source, tmp_path, evil):
    cache, _ = source
    cache_transfer.export(tmp_path / "k.tar", cache)
    with tarfile.open(tmp_path / "k.tar", "a") as tar:
        info = tarfile.TarInfo(evil)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    dest = BuildCache(tmp_path / "b")
    with pytest.raises(ValueError, match="not a cache file"):
        cache_transfer.import_(tmp_path / "k.tar", dest)
    assert not (dest.root / "obj").exists() and not (tmp_path / "escape.txt").exists()


def test_a_link_member_is_refused(source, tmp_path):
    cache, _ = source
    cache_transfer.export(tmp_path / "k.tar", cache)
    with tarfile.open(tmp_path / "k.tar", "a") as tar:
        info = tarfile.TarInfo("index/0123456789abcdef0123456789abcdef.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(ValueError, match="not a cache file"):
        cache_transfer.import_(tmp_path / "k.tar", BuildCache(tmp_path / "b"))


def test_not_an_export_and_bad_names_are_clear_errors(tmp_path):
    with tarfile.open(tmp_path / "other.tar", "w") as tar:
        info = tarfile.TarInfo("obj/x.0123456789abcdef/unit.o")
        info.size = 0
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="not a cutlass_offload cache export"):
        cache_transfer.import_(tmp_path / "other.tar", BuildCache(tmp_path / "b"))
    (tmp_path / "notes.txt").write_text("not a tar file")
    with pytest.raises(ValueError, match="not a readable tar file"):
        cache_transfer.import_(tmp_path / "notes.txt", BuildCache(tmp_path / "b"))
    with pytest.raises(ValueError, match="does not exist"):
        cache_transfer.import_(tmp_path / "missing.tar", BuildCache(tmp_path / "b"))
    with pytest.raises(ValueError, match=r"\.tar\.gz"):
        cache_transfer.export(tmp_path / "k.zip", BuildCache(tmp_path / "a"))
    assert not list(tmp_path.glob("*k.zip*"))          # no temporary file left behind


def test_cli_exports_and_imports(source, tmp_path, monkeypatch, capsys):
    cache, _ = source
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(cache.root))
    assert main(["cache", "export", str(tmp_path / "k.tar.xz")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("exported 2 compiled units (") and "and 2 kernel index records" in out
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "b"))
    assert main(["cache", "import", str(tmp_path / "k.tar.xz")]) == 0
    assert "imported 2 compiled units" in capsys.readouterr().out
    assert main(["cache", "import"]) == 2
    assert "needs a FILE" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("not a tar file")
    assert main(["cache", "import", str(tmp_path / "notes.txt")]) == 2     # one line, no traceback
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    for action in ("info", "clear"):                    # a FILE there is a mistake, not ignored
        assert main(["cache", action, str(tmp_path / "x")]) == 2
        assert f"cache {action} takes no FILE" in capsys.readouterr().err
    assert (tmp_path / "b").is_dir()                     # clear with a FILE removed nothing
    assert main(["cache", "info"]) == 0                  # the imported cache, in words
    out = capsys.readouterr().out
    assert "2 compiled units" in out and "2 kernel index records" in out and "MiB on disk" in out
    assert "interrupted" not in out
    # an interrupted build's kept source is counted (a fresh-user trial, session 53, read
    # "0 failed units" with one kept)
    (tmp_path / "b" / "failed" / "shard_sm80_gemm_f16_3k.0123").mkdir(parents=True)
    assert main(["cache", "info"]) == 0
    assert "1 interrupted or toolchain-failed builds kept in" in capsys.readouterr().out


def test_an_export_into_a_folder_it_cannot_write_names_that_file(source, tmp_path, monkeypatch, capsys):
    """A read-only folder (a fresh-user trial, session 50, was told about the temporary
    file beside the export instead): the error names the file asked for."""
    import tempfile
    cache, _ = source
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(cache.root))

    def read_only(prefix="", dir=None, **kw):
        raise PermissionError(13, "Read-only file system", f"{dir}/{prefix}x7r1w2jib")
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    target = tmp_path / "k.tar.xz"
    assert main(["cache", "export", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"cannot use {target}: Read-only file system" in err and "x7r1w2jib" not in err
