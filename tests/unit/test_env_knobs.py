"""config.knobs(): every environment variable is read strictly. A value that is none of
the documented ones raises ValueError naming the variable and the value (what the CLI
prints as its one error line), instead of a bare int() error or a silent default;
CUTLASS_OFFLOAD_NVCC set to a path that is not an executable is an error, not a
fall-through to another nvcc."""
import os
import stat

import pytest

from cutlass_offload import config
from cutlass_offload.build import toolchain

FLAGS = {  # variable: Knobs field, default
    "CUTLASS_OFFLOAD_VERBOSE": ("verbose", False),
    "CUTLASS_OFFLOAD_FAST_CALL": ("fast_call", True),
    "CUTLASS_OFFLOAD_HOST_LAUNCHERS": ("host_launchers", True),
    "CUTLASS_OFFLOAD_NVCC_STEPS": ("nvcc_steps", True),
    "CUTLASS_OFFLOAD_LINEINFO": ("lineinfo", False),
    "CUTLASS_OFFLOAD_GROUPED_CONV": ("grouped_conv", True),
    "CUTLASS_OFFLOAD_PER_SAMPLE_ADD": ("per_sample_add", False),
}


@pytest.mark.parametrize("var", sorted(FLAGS))
def test_on_off_variables_take_the_documented_spellings_and_refuse_others(monkeypatch, var):
    field, default = FLAGS[var]
    monkeypatch.delenv(var, raising=False)
    assert getattr(config.knobs(), field) is default
    for value, want in [("1", True), ("ON", True), ("yes", True), ("true", True),
                        ("0", False), ("off", False), ("No", False), ("false", False), ("", False)]:
        monkeypatch.setenv(var, value)
        assert getattr(config.knobs(), field) is want, (var, value)
    for bad in ("2", "enable", "tru"):
        monkeypatch.setenv(var, bad)
        with pytest.raises(ValueError, match=f"{var}='{bad}'"):
            config.knobs()


@pytest.mark.parametrize("var, field", [("CUTLASS_OFFLOAD_JOBS", "jobs"),
                                        ("CUTLASS_OFFLOAD_NVCC_THREADS", "nvcc_threads")])
def test_counts_are_whole_numbers(monkeypatch, var, field):
    monkeypatch.delenv(var, raising=False)
    assert getattr(config.knobs(), field) == 0
    monkeypatch.setenv(var, " 12 ")
    assert getattr(config.knobs(), field) == 12
    for bad in ("abc", "-1", "2.5"):
        monkeypatch.setenv(var, bad)
        with pytest.raises(ValueError, match=f"{var}='{bad}': use a whole number"):
            config.knobs()


def test_progress_and_the_cpp_wrapper_refuse_unknown_values(monkeypatch):
    for value, want in [("auto", "auto"), ("bar", "bar"), ("LINES", "lines"), ("quiet", "off"), ("0", "off")]:
        monkeypatch.setenv("CUTLASS_OFFLOAD_PROGRESS", value)
        assert config.knobs().progress == want
    monkeypatch.setenv("CUTLASS_OFFLOAD_PROGRESS", "fancy")
    with pytest.raises(ValueError, match="CUTLASS_OFFLOAD_PROGRESS='fancy'"):
        config.knobs()
    monkeypatch.delenv("CUTLASS_OFFLOAD_PROGRESS")
    for value, want in [("", None), ("1", True), ("off", False)]:
        monkeypatch.setenv("CUTLASS_OFFLOAD_CPP_WRAPPER", value)
        assert config.knobs().cpp_wrapper is want
    monkeypatch.setenv("CUTLASS_OFFLOAD_CPP_WRAPPER", "maybe")
    with pytest.raises(ValueError, match="CUTLASS_OFFLOAD_CPP_WRAPPER='maybe'"):
        config.knobs()
    monkeypatch.delenv("CUTLASS_OFFLOAD_CPP_WRAPPER")
    for value, want in [("", None), ("yes", True), ("0", False)]:
        monkeypatch.setenv("CUTLASS_OFFLOAD_C_SHIMS", value)
        assert config.knobs().c_shims is want
    monkeypatch.setenv("CUTLASS_OFFLOAD_C_SHIMS", "2")
    with pytest.raises(ValueError, match="CUTLASS_OFFLOAD_C_SHIMS='2'"):
        config.knobs()


def test_an_nvcc_path_set_on_purpose_must_be_an_executable(monkeypatch, tmp_path):
    missing = tmp_path / "no" / "nvcc"
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC", str(missing))
    with pytest.raises(toolchain.ToolchainError, match="CUTLASS_OFFLOAD_NVCC=.*not an executable"):
        toolchain.find_nvcc()
    plain = tmp_path / "nvcc"
    plain.write_text("#!/bin/sh\n")
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC", str(plain))
    with pytest.raises(toolchain.ToolchainError, match="not an executable"):
        toolchain.find_nvcc()
    plain.chmod(plain.stat().st_mode | stat.S_IXUSR)
    assert toolchain.find_nvcc() == str(plain)
    assert os.access(toolchain.find_nvcc(), os.X_OK)


def test_an_nvcc_path_that_is_not_nvcc_is_one_error_naming_the_variable(monkeypatch, tmp_path, capsys):
    """Another program (or a broken nvcc) would fail every unit with logs that do not
    say why: its --version is checked first."""
    from cutlass_offload import cli
    other, broken = tmp_path / "ls", tmp_path / "nvcc"
    other.write_text("#!/bin/sh\necho 'ls (GNU coreutils) 9.1'\n")
    broken.write_text("#!/bin/sh\nexit 1\n")
    for f in (other, broken):
        f.chmod(0o755)
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC", str(other))
    with pytest.raises(toolchain.ToolchainError, match=r"ls \(CUTLASS_OFFLOAD_NVCC\) is not nvcc: .*coreutils"):
        toolchain.nvcc_version(str(other))
    monkeypatch.setenv("CUTLASS_OFFLOAD_NVCC", str(broken))
    with pytest.raises(toolchain.ToolchainError, match=r"\(CUTLASS_OFFLOAD_NVCC\) is not a working nvcc"):
        toolchain.nvcc_version(str(broken))
    monkeypatch.setenv("CUTLASS_OFFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    assert cli.main(["compile", "mlp", "--arch", "sm_80", "-q", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUTLASS_OFFLOAD_NVCC" in err[0] and "not a working nvcc" in err[0]
    assert not (tmp_path / "out").exists()                # no half-written folder
    from fault_helpers import install_fake_nvcc    # the tests' stand-in says it is nvcc
    assert toolchain.nvcc_version(str(install_fake_nvcc(tmp_path / "tool"))) == "Build cuda_fake.0"


def test_the_cli_checks_the_environment_before_any_command(monkeypatch, tmp_path, capsys):
    # -q sets CUTLASS_OFFLOAD_PROGRESS itself: the user's bad value is refused before that
    from cutlass_offload import cli
    monkeypatch.setenv("CUTLASS_OFFLOAD_PROGRESS", "fancy")
    assert cli.main(["compile", "mlp", "--arch", "sm_80", "-q", "--out", str(tmp_path / "out")]) == 2
    assert "CUTLASS_OFFLOAD_PROGRESS='fancy'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    monkeypatch.delenv("CUTLASS_OFFLOAD_PROGRESS")
    monkeypatch.setenv("CUTLASS_OFFLOAD_VERBOSE", "maybe")
    assert cli.main(["prebuild", "--arch", "sm_80", "--list"]) == 2
    assert "CUTLASS_OFFLOAD_VERBOSE='maybe'" in capsys.readouterr().err
