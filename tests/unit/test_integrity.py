"""Damaged files are never used (issue 20), without nvcc or a GPU: output folders
and build cache entries built with the fake nvcc (tests/fake_nvcc.py: real ELF
objects and a loadable library), then truncated, corrupted, emptied or deleted.
A damaged output folder gives one DamagedFileError naming the file and the fix;
a damaged cache entry is rebuilt with a warning naming it, never linked."""
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

import cutlass_offload as co
from cutlass_offload import cli, integrity, weights
from cutlass_offload.folder import load_exported
from cutlass_offload.build.cache import DamagedCacheEntryWarning
from cutlass_offload.errors import CutlassOffloadError, DamagedFileError
from fault_helpers import LIB, committed_entries, damage, damaged_entries, fake_env, nvcc_calls, small_model

HOW = ("truncate", "corrupt", "empty", "delete")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake nvcc and a fresh cache; returns the folder of both."""
    for k, v in fake_env(tmp_path / "tool").items():
        monkeypatch.setenv(k, v)
    return tmp_path / "tool"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An output folder compiled once with the fake nvcc (copied by each test)."""
    root = tmp_path_factory.mktemp("saved")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in fake_env(root / "tool").items():
            mp.setenv(k, v)
        model, x = small_model()
        co.compile(model, x, arch="sm_80", out_dir=root / "out")
    return root / "out"


def _copy(saved, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(saved, out)
    return out


def _file(out, kind):
    return next((out / "src").glob("shard_*.cu")) if kind == "src" else out / kind


def test_manifest_records_every_file_and_the_folder_loads(saved, tmp_path):
    out = _copy(saved, tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk and {LIB, "model.pt2", "inputs.pt", "report.json",
                                                  weights.BIN, weights.INDEX} <= on_disk
    assert manifest["weights"] == weights.INDEX
    for name, rec in manifest["files"].items():
        assert rec == integrity.record(out / name)
    loaded, _, _ = co.load(out)                 # opens the (fake) library: it is a real ELF file
    assert [r.name for r in loaded.plan.regions] == ["region0_linear_bias_relu", "region1_linear_bias"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("kind", [LIB, "model.pt2", "inputs.pt", "report.json", "src",
                                  weights.BIN, weights.INDEX])
def test_a_damaged_file_gives_one_error_naming_it(saved, tmp_path, capsys, kind, how):
    out = _copy(saved, tmp_path)
    path = _file(out, kind)
    damage(path, how)
    with pytest.raises(DamagedFileError) as e:
        co.load(out)
    assert e.value.path == str(path)
    assert "compile the model again" in str(e.value) and "\n" not in str(e.value)
    assert cli.main(["run", str(out)]) == 2      # checked before the GPU is looked for
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path} ")


@pytest.mark.parametrize("how", ["truncate", "corrupt", "empty", "digit"])
def test_a_damaged_manifest_is_named(saved, tmp_path, capsys, how):
    out = _copy(saved, tmp_path)
    path = out / "manifest.json"
    if how == "digit":           # still valid JSON: only the checksum tells
        text = path.read_text()
        i = text.index('"sha256": "') + len('"sha256": "')
        path.write_text(text[:i] + ("1" if text[i] != "1" else "2") + text[i + 1:])
    else:
        damage(path, how)
    with pytest.raises(DamagedFileError) as e:
        co.load(out)
    assert e.value.path == str(path) and "compile the model again" in str(e.value)
    assert cli.main(["run", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path} ")


def test_a_folder_without_manifest_says_what_to_do(saved, tmp_path):
    out = _copy(saved, tmp_path)
    (out / "manifest.json").unlink()
    with pytest.raises(CutlassOffloadError, match="no manifest.json.*cutlass-offload compile"):
        co.load(out)


def _legacy(out):
    """The folder as saved before files were recorded (manifest format 1): the
    weights inside model.pt2, no weights.bin."""
    manifest = json.loads((out / "manifest.json").read_text())
    if manifest.pop("weights", None):
        ep = load_exported(out / "model.pt2")
        weights.attach(ep, out)
        torch.export.save(ep, str(out / "model.pt2"))
        (out / weights.BIN).unlink()
        (out / weights.INDEX).unlink()
    for key in ("files", "checksum", "format"):
        del manifest[key]
    (out / "manifest.json").write_text(json.dumps(manifest))


def _flip_in_largest_member(path):
    """Corrupt one byte inside the data of the archive's largest record."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.compress_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + name_len + extra_len
    data[start + info.compress_size // 2] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind,how", [(LIB, "truncate"), (LIB, "empty"), ("model.pt2", "truncate"),
                                      ("model.pt2", "crc"), ("inputs.pt", "truncate"),
                                      ("report.json", "truncate")])
def test_folders_saved_before_records_still_load_and_refuse_damage(saved, tmp_path, kind, how):
    """No hashes to compare: the cheap checks still keep a truncated library from
    dlopen (SIGBUS) and a broken archive from torch (a bare zipfile traceback)."""
    intact = _copy(saved, tmp_path / "intact")
    _legacy(intact)
    co.load(intact)                              # an intact old folder loads
    # damage a copy: truncating the library this process has mapped would SIGBUS it
    out = _copy(intact, tmp_path)
    if how == "crc":
        _flip_in_largest_member(out / kind)
    else:
        damage(out / kind, how)
    with pytest.raises(DamagedFileError) as e:
        co.load(out)
    assert e.value.path == str(out / kind) and "compile the model again" in str(e.value)


def test_elf_check_sees_truncation_anywhere(saved, tmp_path):
    data = (saved / LIB).read_bytes()
    assert integrity.elf_problem(saved / LIB) is None
    p = tmp_path / "lib.so"
    for cut in (1, 63, len(data) // 3, len(data) - 1):
        p.write_bytes(data[:cut])
        assert integrity.elf_problem(p) is not None, cut


# -- output paths -------------------------------------------------------------------

def test_out_dir_naming_a_file_or_a_foreign_folder_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    from cutlass_offload import api, models
    monkeypatch.setattr(api, "capture", lambda *a, **k: pytest.fail("captured before the check"))
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("model built before the check"))
    model, x = small_model()
    afile = tmp_path / "notes.txt"
    afile.write_text("keep me")
    with pytest.raises(CutlassOffloadError, match="exists and is not a folder"):
        co.compile(model, x, arch="sm_80", out_dir=afile)
    assert afile.read_text() == "keep me"
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "a.jpg").write_text("x")
    with pytest.raises(CutlassOffloadError, match="not a cutlass-offload output folder"):
        co.compile(model, x, arch="sm_80", out_dir=foreign)
    assert [p.name for p in foreign.iterdir()] == ["a.jpg"]
    assert cli.main(["compile", "mlp", "--out", str(afile), "--arch", "sm_80"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {afile} exists and is not a folder")
    assert afile.read_text() == "keep me"
    # a path under a file, and an unknown --arch, are refused before the model is built too
    under = afile / "sub" / "out"
    with pytest.raises(CutlassOffloadError, match="is a file, not a folder"):
        co.compile(model, x, arch="sm_80", out_dir=under)
    assert cli.main(["compile", "mlp", "--out", str(under), "--arch", "sm_80"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot create {under}: a part of")
    for argv in (["--out", str(tmp_path / "new")], ["--dry-run"]):
        assert cli.main(["compile", "mlp", "--arch", "sm90x", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: unknown arch 'sm90x'")
    assert afile.read_text() == "keep me" and not (tmp_path / "new").exists()


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_an_out_dir_on_a_pseudo_file_system_is_not_called_a_full_disk(fake):
    """/proc reports no free space: the error says what it is (a fresh-user trial was told
    "out of disk space ... 0 MiB are free")."""
    model, x = small_model()
    with pytest.raises(CutlassOffloadError, match="not on a disk file system") as e:
        co.compile(model, x, arch="sm_80", out_dir="/proc/cutlass_offload_out")
    assert "disk space" not in str(e.value)


def test_a_cache_dir_that_cannot_be_a_folder_is_one_line_naming_the_variable(tmp_path, monkeypatch, capsys):
    afile = tmp_path / "cache_is_a_file"
    afile.write_text("x")
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(afile))
    assert cli.main(["compile", "mlp", "--out", str(tmp_path / "out"), "--arch", "sm_80", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()      # refused before any work
    assert err == [f"error: the build cache {afile} (CUTLASS_OFFLOAD_CACHE_DIR, or its default) "
                   "is a file, not a folder"]
    assert afile.read_text() == "x" and not (tmp_path / "out").exists()


def test_an_empty_folder_or_an_earlier_output_folder_is_written(fake, tmp_path):
    model, x = small_model()
    empty = tmp_path / "empty"
    empty.mkdir()
    co.compile(model, x, arch="sm_80", out_dir=empty)
    co.check_folder(empty)
    (empty / "report.json").write_text("damaged")            # a damaged earlier folder too
    co.compile(model, x, arch="sm_80", out_dir=empty)
    co.check_folder(empty)
    assert not list(tmp_path.glob(".empty.*"))


def test_leftovers_of_killed_writers_are_removed_once_stale(fake, tmp_path):
    """A save or a compile killed mid-write leaves its temporary folder; the next
    one removes those untouched for long (a live writer's are kept)."""
    import os
    import time
    old_save, new_save = tmp_path / ".out.tmp-old", tmp_path / ".out.tmp-live"
    old_stage = fake / "cache" / "obj" / ".staging-old"
    for d in (old_save, new_save, old_stage):
        d.mkdir(parents=True)
        (d / "half").write_text("x")
    for d in (old_save, old_stage):
        os.utime(d, (time.time() - 2 * 86400,) * 2)
    model, x = small_model()
    co.compile(model, x, arch="sm_80", out_dir=tmp_path / "out")
    assert not old_save.exists() and not old_stage.exists() and new_save.exists()


# -- the build cache -------------------------------------------------------------------

def _entry(tool, kind):
    prefix = "shard_" if kind == "object" else "lib_"
    return next(d for d, _, _ in committed_entries(tool / "cache") if d.name.startswith(prefix))


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("kind", ["object", "library"])
def test_a_damaged_cache_entry_is_rebuilt_never_linked(fake, tmp_path, kind, how):
    model, x = small_model()
    first = co.compile(model, x, arch="sm_80")
    good = first.library_path.read_bytes()
    entry = _entry(fake, kind)
    damage(entry / ("unit.o" if kind == "object" else LIB), how)
    if kind == "object":          # so that the library is linked again, from the objects
        shutil.rmtree(_entry(fake, "library"))
    calls = len(nvcc_calls(fake))
    with pytest.warns(DamagedCacheEntryWarning, match=entry.name):
        again = co.compile(model, x, arch="sm_80", out_dir=tmp_path / "out")
    redone = nvcc_calls(fake)[calls:]
    assert [c.split()[0] for c in redone] == (["compile", "link"] if kind == "object" else ["link"])
    assert again.library_path.read_bytes() == good            # the damaged file went into nothing
    assert damaged_entries(fake / "cache") == []
    co.load(tmp_path / "out")


def test_a_broken_cache_meta_is_a_quiet_miss(fake, recwarn):
    model, x = small_model()
    co.compile(model, x, arch="sm_80")
    entry = _entry(fake, "object")
    (entry / "meta.json").write_text("{")
    calls = len(nvcc_calls(fake))
    co.compile(model, x, arch="sm_80")
    assert [c.split()[0] for c in nvcc_calls(fake)[calls:]] == ["compile"]    # the library still hits
    assert not [w for w in recwarn if issubclass(w.category, DamagedCacheEntryWarning)]


def _strip_records(entry):
    meta = json.loads((entry / "meta.json").read_text())
    del meta["files"]
    (entry / "meta.json").write_text(json.dumps(meta))


def test_entries_from_before_records_still_hit_and_truncation_is_caught(fake):
    """Entries published before the meta recorded files: an intact one is reused
    (no rebuild after an upgrade); a truncated or non-ELF artifact is not."""
    model, x = small_model()
    co.compile(model, x, arch="sm_80")
    for d, _, _ in committed_entries(fake / "cache"):
        _strip_records(d)
    calls = len(nvcc_calls(fake))
    co.compile(model, x, arch="sm_80")
    assert nvcc_calls(fake)[calls:] == []
    obj = _entry(fake, "object") / "unit.o"
    data = obj.read_bytes()
    obj.write_bytes(b"garbage!" + data[8:])        # same size: only the ELF check tells
    with pytest.warns(DamagedCacheEntryWarning, match="not an ELF"):
        co.compile(model, x, arch="sm_80")
    assert [c.split()[0] for c in nvcc_calls(fake)[calls:]] == ["compile"]
    assert damaged_entries(fake / "cache") == []


def test_the_folder_gets_the_permissions_of_a_new_folder(fake, tmp_path):
    import os
    import stat
    model, x = small_model()
    co.compile(model, x, arch="sm_80", out_dir=tmp_path / "out")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o777 & ~umask


def test_a_shard_rebuilt_alone_keeps_its_key(fake, monkeypatch):
    """Each kernel shard rebuilt alone (its entry's meta broken) is the same unit as
    when the whole build compiled it: same key, so the library still hits. The shard's
    index among this build's shards once entered its header, so a shard compiled
    second the first time missed when compiled alone (found on the H200 host, whose
    16 cores order the shards otherwise than CI's 2)."""
    monkeypatch.setenv("CUTLASS_OFFLOAD_JOBS", "16")      # the H200 host's: a shard per kernel
    model, x = small_model()
    co.compile(model, x, arch="sm_80")
    shards = [d for d, _, _ in committed_entries(fake / "cache") if d.parent.name == "obj"
              and d.name.startswith("shard_")]
    assert len(shards) == 2
    for entry in shards:
        (entry / "meta.json").write_text("{")
        calls = len(nvcc_calls(fake))
        co.compile(model, x, arch="sm_80")
        assert [c.split()[0] for c in nvcc_calls(fake)[calls:]] == ["compile"], entry.name


def test_run_with_a_gpu_leaves_the_file_checks_to_load(saved, tmp_path, monkeypatch):
    # load checks every file (weights.bin beside the program's load): `run` reads only
    # the manifest first, so nothing is hashed twice; without a GPU see above
    from cutlass_offload import api
    from cutlass_offload.runtime import library
    out = _copy(saved, tmp_path)
    calls = []
    monkeypatch.setattr(library, "check_device", lambda arch, device=None: calls.append(arch))
    monkeypatch.setattr(api, "check_folder", lambda d: calls.append("check_folder"))

    def load(d, **kw):
        calls.append("load")
        raise CutlassOffloadError("stop here")
    monkeypatch.setattr(api, "load", load)
    assert cli.main(["run", str(out)]) == 2
    assert calls == [json.loads((out / "manifest.json").read_text())["options"]["arch"], "load"]


def test_an_interrupted_units_leftovers_go_once_it_compiles(fake, monkeypatch):
    """A unit that failed while the build was being interrupted keeps its source and log
    in the cache's failed/ folder (never an entry); the next build that compiles that
    unit removes them."""
    import cutlass_offload.build as build_stage
    model, x = small_model()
    failed = fake / "cache" / "failed"
    with monkeypatch.context() as mp:
        mp.setenv("FAKE_NVCC_FAIL", "1")
        mp.setattr(build_stage, "mark_interrupted", lambda res: not res.ok)   # as under Ctrl-C
        with pytest.raises(CutlassOffloadError):
            co.compile(model, x, arch="sm_80")
    shard = [d for d in failed.iterdir() if d.name.startswith("shard_")]
    assert len(shard) == 1 and (shard[0] / "unit.cu").is_file()
    assert "FAKE_NVCC_FAIL" in (shard[0] / "nvcc.log").read_text()
    # nothing of the failed attempt is an entry
    assert not [d for d, _, _ in committed_entries(fake / "cache") if d.name.startswith("shard_")]
    compiled = co.compile(model, x, arch="sm_80")
    assert not compiled.plan.fallbacks
    assert not shard[0].exists()


def test_a_broken_toolchain_is_not_cached_as_the_units_failure(fake, monkeypatch):
    """A compile that fails with no compiler diagnostic (a host compiler that cannot run,
    an nvcc wrapper that exits 1) is the toolchain's failure, not the source's: its unit
    is kept in failed/ with its log, never made a cache entry, so once the toolchain is
    fixed the next compile builds every kernel (a fresh-user trial, session 50, got
    every kernel "failed to compile" from the cache after fixing gcc). A front-end
    diagnostic on the source is cached as before."""
    model, x = small_model()
    with monkeypatch.context() as mp:
        mp.setenv("FAKE_NVCC_BROKEN", "1")
        with pytest.raises(CutlassOffloadError, match="failed on the launchers"):
            co.compile(model, x, arch="sm_80")
    failed = fake / "cache" / "failed"
    kept = sorted(d.name.split(".")[0] for d in failed.iterdir())
    assert any(k.startswith("shard_") for k in kept), kept
    log = next(d for d in failed.iterdir() if d.name.startswith("shard_")) / "nvcc.log"
    assert "broken toolchain" in log.read_text() and "not cached" in log.read_text()
    assert not [d for d, meta, _ in committed_entries(fake / "cache") if not meta.get("ok", True)]
    compiled = co.compile(model, x, arch="sm_80")             # the toolchain works again
    assert not compiled.plan.fallbacks and len(compiled.plan.regions) == 2
    assert not any(d.name.startswith("shard_") for d in failed.iterdir())

    other, y = small_model(36)                               # alignment 4: other kernels
    with monkeypatch.context() as mp:
        mp.setenv("FAKE_NVCC_FAIL", "1")                      # a diagnostic: cached
        try:
            co.compile(other, y, arch="sm_80")                # its kernels fall back
        except CutlassOffloadError:
            pass
    assert [d for d, meta, _ in committed_entries(fake / "cache") if not meta.get("ok", True)]
