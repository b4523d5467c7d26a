"""The CLI's number flags: the count flags (compile --batch / --seq / --jobs, prebuild --jobs) take
positive integers: 0, a negative number or a non-number is one argparse error line
naming the flag and exit 2, before any model is built; run --tolerance a finite number > 0."""
import pytest

from cutlass_offload import cli


def _compile(tmp_path, *flags):
    return ["compile", "mlp", "--out", str(tmp_path / "m"), "--arch", "sm_80", *flags]


@pytest.mark.parametrize("flag, value", [("--batch", "-3"), ("--batch", "0"), ("--seq", "0"),
                                         ("--seq", "-1"), ("--jobs", "0"), ("--jobs", "-2"),
                                         ("--batch", "two"), ("--jobs", "1.5")])
def test_compile_refuses_a_count_below_one(tmp_path, capsys, monkeypatch, flag, value):
    def must_not_run(a):
        raise AssertionError("the command ran")
    monkeypatch.setattr(cli, "_cmd_compile", must_not_run)
    with pytest.raises(SystemExit) as e:
        cli.main(_compile(tmp_path, flag, value))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1            # the error alone, no usage block
    last = err.strip().splitlines()[-1]
    assert last.startswith("cutlass-offload compile: error: argument " + flag)
    assert last.endswith("(usage: cutlass-offload compile --help)")
    assert repr(value) in last or value in last
    assert "Traceback" not in err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("value", ["0", "-1"])
def test_prebuild_refuses_jobs_below_one(capsys, value):
    with pytest.raises(SystemExit) as e:
        cli.main(["prebuild", "--arch", "sm_80", "--list", "--jobs", value])
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("cutlass-offload prebuild: error: argument --jobs")


def test_positive_counts_pass_through(tmp_path, monkeypatch):
    seen = {}

    def record(a):
        seen.update(batch=a.batch, seq=a.seq, jobs=a.jobs)
        return 0
    monkeypatch.setattr(cli, "_cmd_compile", record)
    assert cli.main(_compile(tmp_path, "--batch", "1", "--seq", "16", "--jobs", "3")) == 0
    assert seen == {"batch": 1, "seq": 16, "jobs": 3}
    seen.clear()
    assert cli.main(_compile(tmp_path)) == 0        # unset: the defaults (None, None, 0 = auto)
    assert seen == {"batch": None, "seq": None, "jobs": 0}


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "x"])
def test_run_refuses_a_tolerance_that_is_no_bound(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setattr(cli, "_cmd_run", lambda a: pytest.fail("the command ran"))
    with pytest.raises(SystemExit) as e:
        cli.main(["run", str(tmp_path), "--tolerance", value])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "cutlass-offload run: error: argument --tolerance")


def test_jobs_reach_the_build_without_the_environment(tmp_path, monkeypatch):
    """compile --jobs N is compile(jobs=N): the build gets N, and the process
    environment (CUTLASS_OFFLOAD_JOBS) is left as it was."""
    import os

    import cutlass_offload as co
    from cutlass_offload import api
    from cutlass_offload.build.result import BuildResult
    builds = []

    def fake_build(plan, strategy="sharded", cache=None, jobs=None, executor=None):
        builds.append(jobs)
        return BuildResult(library=None, plan=plan, strategy=strategy, seconds=0.0, jobs=jobs or 1)
    monkeypatch.setattr(api.build_stage, "build", fake_build)
    monkeypatch.setattr(api, "save", lambda *a, **k: None)
    monkeypatch.delenv("CUTLASS_OFFLOAD_JOBS", raising=False)
    assert cli.main(_compile(tmp_path, "--jobs", "3", "-q")) == 0
    assert builds == [3] and "CUTLASS_OFFLOAD_JOBS" not in os.environ
    assert cli.main(_compile(tmp_path, "-q")) == 0
    assert builds == [3, None]                       # unset: the build's own count
    model, inputs = co.models.load_model("mlp", "fp16")
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="jobs must be a positive int"):
            co.compile(model, inputs, arch="sm_80", jobs=bad)


@pytest.mark.parametrize("out", ["", "  "])
def test_compile_refuses_an_empty_out(capsys, monkeypatch, out):
    """--out "" would name the current folder ('.'): one argparse error line instead."""
    monkeypatch.setattr(cli, "_cmd_compile", lambda a: (_ for _ in ()).throw(AssertionError("ran")))
    with pytest.raises(SystemExit) as e:
        cli.main(["compile", "mlp", "--out", out, "--arch", "sm_80"])
    assert e.value.code == 2
    assert "argument --out: an empty path" in capsys.readouterr().err


def test_version(capsys):
    """``cutlass-offload --version`` prints the package's version (a fresh-user trial,
    session 51: it asked for a subcommand)."""
    import cutlass_offload
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"cutlass-offload {cutlass_offload.__version__}"


def test_no_command_names_the_commands(capsys):
    """A bare ``cutlass-offload`` lists the commands it takes, not argparse's internal
    name for them (a fresh-user trial, session 52: "required: cmd")."""
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "{compile,run,prebuild,cache}" in err and "cmd" not in err.replace("command", "")
