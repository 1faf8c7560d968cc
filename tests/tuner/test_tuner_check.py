"""``tuner check`` without a GPU: its refusals (no compute-sanitizer, no GPU, bad input) are one
line and exit code 2; with a stand-in compute-sanitizer and the GPU count faked, the stored winner
of a fault-family study (measured on a fake pool) and one of its trials go through the whole
command: compiled here, the tool run, its report read, the table printed, exit 0 when clean and
1 when it found errors."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

import tuner
import tuner.cli.commands as cli
from tuner_doubles import FakePool
from workers.results import Measurement, Timing

ROOT = Path(__file__).resolve().parents[2]
FAULTS = str(ROOT / "docs" / "examples" / "faults")
DATA = ROOT / "tests" / "data" / "sanitizer"


class FaultsPool(FakePool):
    """Answers the fault family: FAULT=none measures (faster with more ITEMS), a fault fails."""

    def poll(self, timeout: float):
        out, self.queue = self.queue[: self.per_poll], self.queue[self.per_poll:]
        answers = []
        for ticket, params in out:
            if params["FAULT"] == "none":
                ms = 1.0 / params["ITEMS"] + params["BLOCK"] / 1e4
                answers.append((ticket, Measurement(ok=True, timing=Timing(ms, ms, ms, 0.0, 20), error=0.0)))
            else:
                answers.append((ticket, Measurement.failed("crash", f"{params['FAULT']} on the fake GPU")))
        return answers

    def submit(self, ticket, params, source, launch, options) -> None:
        self.submitted.append(dict(params))
        self.queue.append((ticket, dict(params)))


@pytest.fixture
def study(db, pools):
    pools.queued.append(FaultsPool())
    result = tuner.tune(FAULTS, "1024", "fp32", trials=17, db=db, retime=0, seed=0)
    assert result.best is not None and result.best.params["FAULT"] == "none"
    return result


FAKE = """#!{python}
import os, shutil, sys
args = sys.argv[1:]
tool = args[args.index("--tool") + 1]
shutil.copy(os.path.join(os.environ["FAKE_DATA"], os.environ.get("FAKE_" + tool.upper(), tool + "_clean.log")),
            args[args.index("--log-file") + 1])
open(args[-1], "w").write(os.environ.get("FAKE_OUT", '{{"ok": true}}'))
"""


@pytest.fixture
def sanitizer(tmp_path, monkeypatch):
    """A stand-in compute-sanitizer on PATH, and one GPU as the driver would count it."""
    import workers.driver

    folder = tmp_path / "bin"
    folder.mkdir()
    tool = folder / "compute-sanitizer"
    tool.write_text(FAKE.format(python=sys.executable))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_DATA", str(DATA))
    monkeypatch.setattr(workers.driver, "gpu_count", lambda: 1)
    return monkeypatch


def _check(*argv: str, db: str) -> int:
    try:
        return cli.main(["check", *argv, "--db", db])
    except SystemExit as exit:  # argparse's refusals end the process, as on the command line
        return int(exit.code)


def test_without_compute_sanitizer_one_line_and_exit_2(study, db, tmp_path, monkeypatch, capsys):
    from workers import sanitizer

    monkeypatch.setattr(sanitizer, "find_sanitizer", lambda: None)
    assert _check(study.study, db=db) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "tuner: error: compute-sanitizer not found (on PATH, beside nvcc, or in /usr/local/cuda/bin): "
        "it comes with the CUDA toolkit\n")


def test_without_a_gpu_one_line_and_exit_2(study, db, sanitizer, capsys):
    import workers.driver

    sanitizer.setattr(workers.driver, "gpu_count", lambda: 0)
    assert _check(study.study, "--family", FAULTS, db=db) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "tuner: error: no GPU is visible: compute-sanitizer runs the kernels on one\n"


@pytest.mark.parametrize("argv, line", [
    (("nope",), "no study named 'nope' (see `tuner studies`)"),
    ((), "give a STUDY or --all-winners"),
    (("--tools", "memcheck,initcheck", "x"), "argument --tools: unknown tool 'initcheck'"),
    (("--trial", "3", "--all-winners"), "--trial goes with a STUDY"),
])
def test_bad_input_is_one_line_and_exit_2(study, db, sanitizer, capsys, argv, line):
    assert _check(*argv, db=db) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"tuner: error: {line}") and captured.err.count("\n") == 1


def test_a_family_that_does_not_load_here_is_named(study, db, sanitizer, capsys):
    assert _check(study.study, db=db) == 2  # stored as "faults": not an installed name
    assert "cannot load the family 'faults'" in capsys.readouterr().err
    assert _check(study.study, "--trial", "99", "--family", FAULTS, db=db) == 2
    assert "has no trial 99" in capsys.readouterr().err


def test_a_clean_winner_exits_0_with_a_row_per_tool(study, db, sanitizer, capsys):
    assert _check(study.study, "--family", FAULTS, db=db) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| faults 1024-fp32")]
    assert [row.split("|")[2].strip() for row in rows] == ["memcheck", "racecheck", "synccheck"]
    assert all(row.split("|")[3].strip() == "0" and row.split("|")[5].strip() == "ok" for row in rows)
    assert f"#{study.best.trial_number} of {study.study}" in out and "1 config(s) checked: clean" in out


def test_an_oob_write_found_by_memcheck_exits_1_with_its_first_lines(study, db, sanitizer, capsys):
    detail = tuner.show(study.study, db=db)
    oob = next(t.number for t in detail.trials if t.params["FAULT"] == "oob_write")
    sanitizer.setenv("FAKE_MEMCHECK", "memcheck_oob.log")
    sanitizer.setenv("FAKE_OUT", json.dumps({"ok": False, "failure": "crash", "reason": "CUDA_ERROR_LAUNCH_FAILED"}))
    assert _check(study.study, "--trial", str(oob), "--tools", "memcheck", "--family", FAULTS, db=db) == 1
    out = capsys.readouterr().out
    assert f"| faults 1024-fp32 #{oob} | memcheck | 1 | Invalid __global__ write (1) | crash: CUDA_ERROR_LAUNCH_FAILED |" in out
    assert "    Invalid __global__ write of size 4 bytes" in out and "        at faults+0x1b0" in out
    assert "1 with findings" in out
    assert _check(study.study, "--trial", str(oob), "--tools", "memcheck", "--family", FAULTS, "--json", db=db) == 1
    (result,) = json.loads(capsys.readouterr().out)
    assert result["clean"] is False and result["params"]["FAULT"] == "oob_write"
    assert result["reports"][0]["kinds"] == {"Invalid __global__ write": 1} and result["reports"][0]["clean"] is False


def test_a_config_that_does_not_compile_is_said_and_not_run(study, db, sanitizer, capsys):
    detail = tuner.show(study.study, db=db)
    broken = next(t.number for t in detail.trials if t.params["FAULT"] == "compile_error")
    assert _check(study.study, "--trial", str(broken), "--family", FAULTS, db=db) == 1
    assert "does not compile: " in capsys.readouterr().out


def test_the_api_call_returns_each_tools_report(study, db, sanitizer):
    (result,) = tuner.check(study.study, tools="memcheck,synccheck", family=FAULTS, db=db)
    assert result.clean and result.trial_number == study.best.trial_number
    assert [r.tool for r in result.reports] == ["memcheck", "synccheck"]
    assert all(r.complete and r.errors == 0 and r.outcome == "ok" for r in result.reports)
    with pytest.raises(tuner.UsageError, match="unknown sanitizer tool 'asan'"):
        tuner.check(study.study, tools=["asan"], db=db)


def test_all_winners_checks_every_stored_best_and_says_which_it_could_not_load(study, db, sanitizer, capsys):
    assert _check("--all-winners", "--tools", "memcheck", db=db) == 1  # "faults" is no installed name
    out = capsys.readouterr().out
    assert "| faults 1024-fp32 #" in out and "cannot load the family 'faults'" in out
    assert _check("--all-winners", "--tools", "memcheck", "--family", FAULTS, db=db) == 0
    assert "1 config(s) checked: clean" in capsys.readouterr().out
