"""The ``tuner`` command: user errors are one line and exit 2; output comes from the API."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tuner.cli.commands import main, parse_duration
from tuner_doubles import PROBLEM, FakePool, run_cli

SHAPE = ["--shape", PROBLEM[0], "--dtype", PROBLEM[1]]


def _error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("tuner: error: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["best", "toy", "--shape", "2,4,x,64", "--dtype", "fp16"], "malformed shape"),
    (["best", "toy", "--shape", "2,4,1024,96", "--dtype", "fp16"], "unsupported head dim"),
    (["best", "toy", "--shape", "2,4,1024,64", "--dtype", "fp64"], "unsupported dtype"),
    (["best", "nope", *SHAPE], "unknown kernel family 'nope'"),
    (["tune", "toy", *SHAPE, "--sampler", "cmaes"], "invalid choice: 'cmaes'"),
    (["tune", "toy", *SHAPE, "--time-budget", "soon"], "not a duration"),
    (["tune", "toy", *SHAPE, "--trials", "0"], "must be at least 1"),
    (["tune", "toy", *SHAPE, "--trials", "5", "--time-budget", "1m"], "not allowed with"),
    (["tune", "toy", *SHAPE, "--warm-start", "-1"], "--warm-start: must be 0 or more, not -1"),
    (["tune", "toy", *SHAPE, "--retime", "-2"], "--retime: must be 0 or more, not -2"),
    (["tune", "toy", *SHAPE, "--measure-timeout", "-1"], "--measure-timeout: must be a positive number of seconds, not -1"),
    (["tune", "toy", *SHAPE, "--measure-timeout", "nan"], "--measure-timeout: must be a positive number of seconds"),
    (["tune", "toy", *SHAPE, "--measure-timeout", "x"], "--measure-timeout: not a number of seconds: 'x'"),
    (["best", "toy", "--dtype", "fp16"], "the following arguments are required: --shape"),
    (["export", "toy", *SHAPE], "the following arguments are required: -o/--out"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["best", "toy", *SHAPE, "--masked"], "unrecognized arguments: --masked"),  # not a flag of toy's
    (["bench", "toy", "--causal"], "problem flags need --shape"),
])
def test_bad_inputs_exit_2_with_one_line(toy, db, argv, message, capsys):
    code = _run(argv + ["--db", db] if argv[0] != "frobnicate" else argv)
    assert code == 2
    assert message in _error_line(capsys)


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit:  # argparse's errors exit from inside parse_args
        return int(exit.code)


LONG = ",".join(["1"] * 5000)


ATTENTION_SHAPES = "expected four positive integers B,H,S,D (or five: B,H,S,D,HKV with HKV key/value heads)"


@pytest.mark.parametrize("family, shape, line", [
    ("attention", "-2,8,1024,64", f"malformed shape '-2,8,1024,64': {ATTENTION_SHAPES}"),
    ("gemm", "-64,64,64", "malformed shape '-64,64,64': expected three positive integers M,N,K"),
    ("attention", LONG, f"malformed shape '{LONG[:55]}...': {ATTENTION_SHAPES}"),
    ("gemm", "x" + LONG, f"malformed shape 'x{LONG[:54]}...': expected M,N,K such as 4096,4096,4096"),
])
@pytest.mark.parametrize("command", ["best", "tune", "bench"])
def test_a_bad_shape_is_named_by_the_family_and_cut_when_long(tmp_path, family, shape, line, command, capsys):
    """A shape after a dash (argparse took it for an option) reaches the family's check; a long one
    is cut to 60 characters in the line."""
    db = tmp_path / "tuner.db"
    assert _run([command, family, "--shape", shape, "--dtype", "fp16", "--db", f"sqlite:///{db}"]) == 2
    assert _error_line(capsys) == f"tuner: error: {line}"
    assert not db.exists()


def test_unreachable_database_is_one_line(toy, capsys):
    code = _run(["best", "toy", *SHAPE, "--db", "postgresql://nobody@127.0.0.1:1/x"])
    assert code == 2
    assert "cannot open database postgresql://nobody@127.0.0.1:1/x" in _error_line(capsys)


def test_best_with_nothing_stored_is_one_line(toy, empty_db, capsys):
    assert _run(["best", "toy", *SHAPE, "--db", empty_db]) == 2
    assert "no validated result stored for toy 2x4x1024x64-fp16" in _error_line(capsys)


def test_show_unknown_study_is_one_line(empty_db, capsys):
    assert _run(["show", "nope", "--db", empty_db]) == 2
    assert "no study named 'nope'" in _error_line(capsys)


def test_no_gpu_is_one_line_and_non_zero(toy, db, monkeypatch, capsys):
    from tuner import api
    from tuner.errors import NoGPU

    def no_gpu(*args, **kwargs):
        raise NoGPU("no GPU is visible (to tune without one, replay a recorded landscape with --replay FILE)")

    monkeypatch.setattr(api, "_open_pool", no_gpu)
    assert _run(["tune", "toy", *SHAPE, "--db", db]) == 2
    line = _error_line(capsys)
    assert "no GPU is visible" in line and "--replay" in line
    assert not Path(db.removeprefix("sqlite:///")).exists()  # no database created


@pytest.mark.parametrize("argv", [["studies"], ["studies", "--json"], ["show", "1"], ["best", "toy", *SHAPE],
                                  ["export", "toy", *SHAPE, "-o", "out"], ["landscape", "1", "-o", "l.json"]])
def test_reading_a_database_that_does_not_exist_says_so_and_creates_none(toy, tmp_path, argv, capsys):
    missing = tmp_path / "tunr.db"  # a mistyped path
    assert _run([*argv, "--db", f"sqlite:///{missing}"]) == 2
    assert _error_line(capsys) == (f"tuner: error: no database at {missing}: nothing is stored there "
                                   "(check --db or $TUNER_DB, or tune first)")
    assert not missing.exists() and capsys.readouterr().out == ""


def test_tune_best_export_studies_show(toy, db, pools, tmp_path, capsys):
    assert _run(["tune", "toy", *SHAPE, "--trials", "12", "--seed", "1", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "status    finished: 12 trials measured" in out and "best      " in out

    assert _run(["best", "toy", *SHAPE, "--db", db]) == 0
    out = capsys.readouterr().out
    for label in ("config", "median", "TFLOPS", "GPU", "toolkit", "when"):
        assert any(line.startswith(label) for line in out.splitlines()), (label, out)

    assert _run(["best", "toy", *SHAPE, "--json", "--db", db]) == 0
    winner = json.loads(capsys.readouterr().out)
    assert winner["device"]["name"] == "NVIDIA H100 80GB HBM3" and winner["median_ms"] > 0

    assert _run(["export", "toy", *SHAPE, "-o", str(tmp_path / "out"), "--db", db]) == 0
    assert (tmp_path / "out" / "toy_2x4x1024x64-fp16.launch.json").exists()
    assert (tmp_path / "out" / "toy_2x4x1024x64-fp16.cu").exists()
    capsys.readouterr()

    assert _run(["studies", "--json", "--db", db]) == 0
    (study,) = json.loads(capsys.readouterr().out)
    assert study["status"] == "finished" and study["n_trials"] == 12
    assert _run(["show", study["name"], "--db", db]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 13
    assert _run(["show", study["name"], "--json", "--db", db]) == 0
    assert len(json.loads(capsys.readouterr().out)["trials"]) == 12
    assert _run(["show", str(study["id"]), "--json", "--db", db]) == 0  # the id `studies --json` prints
    assert json.loads(capsys.readouterr().out)["study"]["name"] == study["name"]
    assert _run(["show", str(study["id"] + 1), "--db", db]) == 2
    assert f"no study named '{study['id'] + 1}'" in _error_line(capsys)


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("2h", 7200),
                                           ("1h30m", 5400), ("45", 45), ("1.5h", 5400)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_process_prints_no_traceback(tmp_path):
    done = run_cli("best", "nope", "--shape", "4,16,4096,128", "--dtype", "fp16", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "tuner: error: unknown kernel family 'nope' (known: attention, gemm); give a family of your own "
        "by path (a folder or .py file defining FAMILY) or as module:ATTR")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU may be visible here")
def test_tune_without_a_gpu_says_so_in_one_line(tmp_path):
    """The real path: workers.WorkerPool starts Ray, finds no GPU, raises NoGPUError."""
    done = run_cli("tune", "attention", "--shape", "4,16,4096,128", "--dtype", "fp16",
                       "--db", f"sqlite:///{tmp_path / 'tuner.db'}", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert not (tmp_path / "tuner.db").exists()
    ours = [line for line in done.stderr.splitlines() if line.startswith("tuner:")]
    assert done.stderr.splitlines() == ours == [
        "tuner: error: no GPU is visible (to tune without one, replay a recorded landscape with "
        "--replay FILE)"
    ]


def test_a_family_flag_on_the_command_line_is_the_problem_flag(toy, db, pools, capsys):
    """``--causal`` is toy's own switch (declared like attention's): it selects another problem."""
    assert _run(["tune", "toy", *SHAPE, "--causal", "--trials", "3", "--db", db, "--seed", "0"]) == 0
    assert "2x4x1024x64-fp16-causal" in capsys.readouterr().out
    # the unmasked problem was not tuned: answered from the causal one, not measured
    assert _run(["best", "toy", *SHAPE, "--db", db, "--json"]) == 0
    derived = json.loads(capsys.readouterr().out)
    assert (derived["measured"], derived["source"], derived["flags"]) == (False, "2x4x1024x64-fp16-causal", {"causal": False})
    assert _run(["best", "toy", *SHAPE, "--causal", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["flags"] == {"causal": True}


@pytest.mark.parametrize("command", [["show", "1"], ["show", "1", "--json"], ["studies"]])
def test_a_reader_that_stops_early_leaves_no_traceback(toy, db, pools, tmp_path, command):
    """``tuner show ... | head``: the pipe closes before the output is written."""
    import os
    import subprocess
    import sys

    from tuner_doubles import ROOT

    assert _run(["tune", "toy", *SHAPE, "--trials", "12", "--seed", "1", "--db", db]) == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    reader = subprocess.Popen([sys.executable, "-m", "tuner", *command, "--db", db], cwd=tmp_path,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader.stdout.close()  # as `head` does, before a line was read
    stderr = reader.stderr.read()
    assert reader.wait(timeout=60) == 0 and stderr == ""


class _TerminatedPool(FakePool):
    """A pool during whose fifth poll the process gets SIGTERM (as `kill PID` sends it)."""

    def poll(self, timeout):
        if self.polls == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().poll(timeout)


def test_sigterm_ends_a_study_as_ctrl_c_does_and_the_next_run_goes_on(toy, db, pools, capsys):
    before = signal.getsignal(signal.SIGTERM)
    pools.queued.append(_TerminatedPool(per_poll=1))
    assert _run(["tune", "toy", *SHAPE, "--trials", "25", "--db", db, "--seed", "0"]) == 130
    out = capsys.readouterr().out
    assert "status    interrupted: interrupted by the user" in out
    assert signal.getsignal(signal.SIGTERM) is before  # the handler was the command's alone
    assert _run(["tune", "toy", *SHAPE, "--trials", "25", "--db", db, "--seed", "0"]) == 0
    again = capsys.readouterr().out
    assert "25 measured" not in again and "from earlier runs" in again
    earlier = int(again.split(" from earlier runs")[0].rsplit(" ", 1)[1])
    assert 0 < earlier < 25
