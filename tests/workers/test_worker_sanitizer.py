"""compute-sanitizer's reports read back (from reports written in NVIDIA's documented format,
tests/data/sanitizer), the tool found where the toolkit puts it, and a tool's run driven end to
end through a stand-in ``compute-sanitizer`` (a script that writes a report and the runner's
answer): all without a GPU."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import pytest

from workers.sanitizer import RunSpec, find_sanitizer, parse, run_tool, sanitizer_command

DATA = Path(__file__).resolve().parents[1] / "data" / "sanitizer"


def _read(name: str) -> str:
    return (DATA / name).read_text()


def test_an_out_of_bounds_write_is_one_error_of_its_kind_with_its_first_lines():
    report = parse(_read("memcheck_oob.log"), "memcheck")
    assert report.complete and not report.clean
    assert report.errors == 1 and report.kinds == {"Invalid __global__ write": 1}
    assert report.first[:4] == ("Invalid __global__ write of size 4 bytes", "    at faults+0x1b0",
                                "    by thread (0,0,0) in block (0,0,0)",
                                "    Address 0x7f3a40000000 is out of bounds")
    assert report.notes == ()


@pytest.mark.parametrize("name, tool", [("memcheck_clean.log", "memcheck"), ("racecheck_clean.log", "racecheck")])
def test_clean_reports(name, tool):
    report = parse(_read(name), tool)
    assert report.clean and report.errors == 0 and report.kinds == {} and report.first == ()


def test_racecheck_counts_its_errors_and_warnings_and_names_the_accesses():
    report = parse(_read("racecheck_hazards.log"), "racecheck")
    assert (report.errors, report.warnings) == (1, 1) and not report.clean
    assert report.kinds == {"race (Write/Read)": 1, "race (Read/Write)": 1}
    assert report.first[0].startswith("Error: Race reported between Write access")
    only_warnings = _read("racecheck_hazards.log").replace("(1 error, 1 warning)", "(0 errors, 2 warnings)")
    assert parse(only_warnings, "racecheck").clean  # warnings are not errors


def test_synccheck_barrier_errors():
    report = parse(_read("synccheck_divergent.log"), "synccheck")
    assert report.errors == 2
    assert report.kinds == {"barrier: Divergent thread(s) in warp": 1, "barrier: Divergent thread(s) in block": 1}
    assert report.first[1] == "    at reduce+0x130 in reduce.cu:61"


def test_a_report_without_a_summary_is_incomplete_and_its_lines_are_notes():
    report = parse(_read("memcheck_unfinished.log"), "memcheck")
    assert not report.complete and not report.clean
    assert report.kinds == {} and report.errors == 0
    assert report.notes == ("Error: Target application terminated before first instrumented API call",)


def test_a_finding_of_no_documented_kind_still_counts_when_the_summary_says_so():
    report = parse(_read("memcheck_other.log"), "memcheck")
    assert report.errors == 1 and report.kinds == {"Stack overflow ADDR in block N": 1}
    assert report.first == ("Stack overflow 0x3 in block 7", "    at faults+0x90")


def test_interleaved_program_output_is_left_out():
    text = _read("memcheck_oob.log").replace("=========\n", "sanitize_run: crash: CUDA_ERROR_LAUNCH_FAILED\n=========\n", 1)
    assert parse(text, "memcheck") == parse(_read("memcheck_oob.log"), "memcheck")


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_the_sanitizer_is_found_on_path_beside_nvcc_or_under_cuda_home(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    if Path("/usr/local/cuda/bin/compute-sanitizer").exists():
        pytest.skip("this machine has one in /usr/local/cuda/bin")
    assert find_sanitizer() is None
    home = tmp_path / "cuda" / "bin"
    home.mkdir(parents=True)
    tool = _executable(home / "compute-sanitizer", "#!/bin/sh\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert find_sanitizer() == str(tool)
    monkeypatch.delenv("CUDA_HOME")
    _executable(home / "nvcc", "#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(home))
    assert find_sanitizer() == str(tool)  # on PATH now


# A stand-in for compute-sanitizer: reads the options it is given, writes the report named by
# $FAKE_REPORT to --log-file and the runner's answer ($FAKE_OUT) where the runner would, or sleeps.
FAKE = """#!{python}
import os, shutil, sys, time
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
assert args[args.index("--tool") + 1] == os.environ["FAKE_TOOL"], args
assert args[-4:-2] == ["-m", "workers.sanitize_run"], args
if os.environ.get("FAKE_SLEEP"):
    time.sleep(float(os.environ["FAKE_SLEEP"]))
shutil.copy(os.environ["FAKE_REPORT"], log)
if os.environ.get("FAKE_OUT"):
    open(args[-1], "w").write(os.environ["FAKE_OUT"])
print("sanitize_run: what the runner printed")
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    tool = _executable(tmp_path / "compute-sanitizer", FAKE.format(python=sys.executable))

    def use(tool_name: str, report: str, out: dict | None, sleep: float | None = None) -> str:
        monkeypatch.setenv("FAKE_TOOL", tool_name)
        monkeypatch.setenv("FAKE_REPORT", str(DATA / report))
        if out is None:
            monkeypatch.delenv("FAKE_OUT", raising=False)
        else:
            monkeypatch.setenv("FAKE_OUT", json.dumps(out))
        if sleep is None:
            monkeypatch.delenv("FAKE_SLEEP", raising=False)
        else:
            monkeypatch.setenv("FAKE_SLEEP", str(sleep))
        return str(tool)

    return use


SPEC = RunSpec("docs/examples/faults", {"shape": [1024], "dtype": "fp32", "flags": {}},
               {"FAULT": "oob_write", "BLOCK": 256, "ITEMS": 1})


def test_a_tool_run_reads_the_report_and_the_runners_answer(fake):
    sanitizer = fake("memcheck", "memcheck_oob.log",
                     {"ok": False, "failure": "crash", "reason": "CUDA_ERROR_LAUNCH_FAILED during the run"})
    report = run_tool("memcheck", SPEC, sanitizer=sanitizer, timeout_s=60)
    assert report.errors == 1 and report.kinds == {"Invalid __global__ write": 1} and report.complete
    assert report.outcome == "crash: CUDA_ERROR_LAUNCH_FAILED during the run" and report.seconds > 0


def test_a_runner_that_says_nothing_and_a_tool_that_hangs(fake):
    sanitizer = fake("synccheck", "memcheck_unfinished.log", None)
    report = run_tool("synccheck", SPEC, sanitizer=sanitizer, timeout_s=60)
    assert not report.complete and report.outcome.startswith("the runner ended with code 0 and no result")
    sanitizer = fake("racecheck", "racecheck_clean.log", {"ok": True}, sleep=30)
    start = time.monotonic()
    report = run_tool("racecheck", SPEC, sanitizer=sanitizer, timeout_s=1)
    assert time.monotonic() - start < 15
    assert not report.complete and not report.clean and report.outcome.startswith("killed after 1 s")
    with pytest.raises(ValueError, match="unknown sanitizer tool"):
        run_tool("initcheck", SPEC, sanitizer=sanitizer)


def test_the_command_runs_the_runner_under_the_tool():
    command = sanitizer_command("/opt/cs", "racecheck", Path("/t/log"), Path("/t/spec.json"), Path("/t/out.json"))
    assert command[:3] == ["/opt/cs", "--tool", "racecheck"] and "--log-file" in command
    assert command[-5:] == [sys.executable, "-m", "workers.sanitize_run", "/t/spec.json", "/t/out.json"]


def _runner(tmp_path, params) -> dict:
    import subprocess

    root = Path(__file__).resolve().parents[2]
    spec = RunSpec(str(root / "docs" / "examples" / "faults"), {"shape": [4096], "dtype": "fp32", "flags": {}},
                   params, cache_dir=str(tmp_path / "cache"))
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_json()))
    done = subprocess.run([sys.executable, "-m", "workers.sanitize_run", str(tmp_path / "spec.json"),
                           str(tmp_path / "out.json")], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads((tmp_path / "out.json").read_text())


def test_the_runner_says_a_config_does_not_compile(tmp_path):
    said = _runner(tmp_path, {"FAULT": "compile_error", "BLOCK": 256, "ITEMS": 1})
    assert said["ok"] is False and said["failure"] == "compile" and "#error" in said["reason"]


@pytest.mark.skipif(__import__("workers.driver", fromlist=["gpu_count"]).gpu_count() > 0, reason="a GPU is visible")
def test_the_runner_without_a_gpu_says_so(tmp_path):
    said = _runner(tmp_path, {"FAULT": "none", "BLOCK": 256, "ITEMS": 1})
    assert said == {"ok": False, "failure": "worker", "reason": said["reason"]} and "GPU" in said["reason"]
