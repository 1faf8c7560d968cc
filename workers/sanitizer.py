"""compute-sanitizer on one config: its tools run a small runner (``python -m
workers.sanitize_run``: compile, load, launch on the family's inputs and check, as a GPU worker's
trial does, through cuda-python) and their reports are read back::

    sanitizer = find_sanitizer()                       # None: not on PATH nor in /usr/local/cuda/bin
    report = run_tool("memcheck", spec, sanitizer=sanitizer)
    report.errors, report.kinds, report.first          # 1, {"Invalid __global__ write": 1}, (lines...)
    parse(text, "racecheck")                           # the same from a log already written

``spec`` is a :class:`RunSpec`: the family's reference (a name, a path, module:ATTR), the problem
and the config. The report's counts are the tool's own summary lines (``ERROR SUMMARY: N errors``,
``RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)``); ``kinds`` and ``first`` come
from its findings, the records NVIDIA documents (``Invalid __global__ write of size 4 bytes``,
``Error: Race reported between Write access at ...``, ``Barrier error detected. ...``, ``Program
hit CUDA_ERROR_... on CUDA API call to ...``), each a header line and its indented lines.
A report without a summary line (the tool did not finish: a hang, a crash of the runner or the
tool) is ``complete=False``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

TOOLS = ("memcheck", "racecheck", "synccheck")
DEFAULT_TIMEOUT_S = 300.0
FIRST_LINES = 6  # lines of the first finding kept
_SEARCHED = ("/usr/local/cuda/bin", "/usr/local/cuda/compute-sanitizer")

_PREFIX = re.compile(r"^=+ ?")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_FINDINGS = (  # (pattern of a finding's header line, its kind from the match)
    (re.compile(r"^Invalid (__\w+__) (read|write|atomic\w*)"), lambda m: f"Invalid {m[1]} {m[2]}"),
    (re.compile(r"^(?:Error|Warning|ERROR|WARNING): Race reported between (\w+) access"),
     lambda m: f"race ({m[1]}"),
    (re.compile(r"^(?:Error|Warning|ERROR|WARNING): Potential (\w+) hazard"), lambda m: f"{m[1]} hazard"),
    (re.compile(r"^Barrier error detected\.\s*(.*?)\.?$"), lambda m: f"barrier: {m[1]}"),
    (re.compile(r"^Program hit (\w+) \(error \d+\).* on CUDA API call to (\w+)"),
     lambda m: f"{m[1]} on {m[2]}"),
    (re.compile(r"^(Warp|Device|Lane) (.*?)( at .*)?$"), lambda m: _normalized(f"{m[1]} {m[2]}")),  # hardware
    (re.compile(r"^(Malloc/Free error|Leaked \d+ bytes|Out-of-range \w+ \w+ \w+ \w+|Misaligned \w+ \w+ \w+ \w+)"),
     lambda m: re.sub(r"\d+", "N", m[1])),
)


@dataclass(frozen=True)
class RunSpec:
    """What the runner runs: the family (a reference ``templates.get_family`` resolves in another
    process), the problem (``Problem.spec``), the config, the inputs' seed, the compile cache."""

    family: str
    problem: Mapping[str, Any]
    params: Mapping[str, Any]
    seed: int = 0
    cache_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "problem": dict(self.problem), "params": dict(self.params)}


@dataclass(frozen=True)
class SanitizerReport:
    """What one tool found in one run."""

    tool: str
    errors: int  # the summary's errors (racecheck: its hazards' errors)
    warnings: int = 0  # racecheck's warnings
    kinds: dict[str, int] = field(default_factory=dict)  # kind of finding -> findings shown
    first: tuple[str, ...] = ()  # the first finding's lines
    complete: bool = True  # a summary line was read: the tool ran to its end
    outcome: str = ""  # what the runner said of the trial: "ok", "crash: ...", or why it said nothing
    notes: tuple[str, ...] = ()  # the tool's other lines (its own errors)
    seconds: float = 0.0

    @property
    def clean(self) -> bool:
        """The tool ran to its end and counted no error (racecheck's warnings are not errors)."""
        return self.complete and self.errors == 0


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else beside nvcc, else in /usr/local/cuda; None when none."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    places = list(_SEARCHED)
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = Path(nvcc).resolve().parent
        places[:0] = [str(home), str(home.parent / "compute-sanitizer")]
    if os.environ.get("CUDA_HOME"):
        places.insert(0, str(Path(os.environ["CUDA_HOME"]) / "bin"))
    for place in places:
        candidate = Path(place) / "compute-sanitizer"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def parse(text: str, tool: str) -> SanitizerReport:
    """A tool's report: the lines of its log that start with its ``=========`` prefix (the
    runner's own lines, when they are interleaved, are left out)."""
    records: list[list[str]] = []
    notes: list[str] = []
    errors = warnings = None
    for raw in text.splitlines():
        if not raw.startswith("="):
            continue  # the runner's own output, interleaved
        line = _PREFIX.sub("", raw.rstrip())
        if race := _RACE_SUMMARY.search(line):
            errors, warnings = int(race[2]), int(race[3])
            continue
        if summary := _ERROR_SUMMARY.search(line):
            if errors is None or tool != "racecheck":
                errors = int(summary[1])
            continue
        if not line.strip():
            records.append([])  # a blank line ends a record
            continue
        if line[:1].isspace():  # an indented line: part of the record above
            if records and records[-1]:
                records[-1].append(line.rstrip())
            continue
        records.append([line.strip()])
    findings = [(record, _kind(record)) for record in records if record and not _banner(record[0])]
    counted = sum(1 for _, kind in findings if kind is not None)
    if errors is None or errors <= counted:  # the rest are the tool's own lines
        notes = [record[0] for record, kind in findings if kind is None]
        findings = [(record, kind) for record, kind in findings if kind is not None]
    kinds: dict[str, int] = {}
    first: tuple[str, ...] = ()
    for record, kind in findings:
        kind = kind or _normalized(record[0])
        kinds[kind] = kinds.get(kind, 0) + 1
        if not first:
            first = tuple(record[:FIRST_LINES])
    complete = errors is not None
    return SanitizerReport(tool, errors if errors is not None else sum(kinds.values()), warnings or 0,
                           kinds, first, complete, notes=tuple(notes))


def _normalized(header: str) -> str:
    """A finding's header not of a documented kind, as a kind: addresses and numbers left out."""
    text = re.sub(r"0x[0-9a-fA-F]+", "ADDR", header)
    return re.sub(r"\d+", "N", text)[:60]


def _kind(record: list[str]) -> str | None:
    header = record[0]
    for pattern, name in _FINDINGS:
        match = pattern.search(header)
        if match:
            kind = name(match)
            if kind.startswith("race ("):  # the other accesses of the race, on the lines below
                others = [m[1] for line in record[1:] if (m := re.search(r"and (\w+) access", line))]
                kind += "".join(f"/{o}" for o in dict.fromkeys(others)) + ")"
            return kind
    return None


def _banner(header: str) -> bool:
    return header.startswith(("COMPUTE-SANITIZER", "LEAK SUMMARY", "Process ID", "Target application returned"))


def sanitizer_command(sanitizer: str, tool: str, log: Path, spec: Path, out: Path) -> list[str]:
    """The command line: the tool on the runner, its log in ``log``; API errors the runner gets
    (and handles) are not findings, the kernel's are."""
    return [sanitizer, "--tool", tool, "--log-file", str(log), "--report-api-errors", "no",
            "--target-processes", "application-only",
            sys.executable, "-m", "workers.sanitize_run", str(spec), str(out)]


def run_tool(tool: str, spec: RunSpec, *, sanitizer: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> SanitizerReport:
    """Run ``tool`` on ``spec`` once and read its report. A run past ``timeout_s`` is killed (with
    the processes it started) and reported incomplete."""
    if tool not in TOOLS:
        raise ValueError(f"unknown sanitizer tool {tool!r} (one of {', '.join(TOOLS)})")
    with tempfile.TemporaryDirectory(prefix="tuner-check-") as folder:
        paths = {name: Path(folder) / name for name in ("spec.json", "out.json", "sanitizer.log")}
        paths["spec.json"].write_text(json.dumps(spec.to_json()))
        command = sanitizer_command(sanitizer, tool, paths["sanitizer.log"], paths["spec.json"], paths["out.json"])
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True, env=_runner_env())
        try:
            output, _ = process.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            timed_out = True
        seconds = time.perf_counter() - start
        log = paths["sanitizer.log"].read_text(errors="replace") if paths["sanitizer.log"].exists() else output
        report = parse(log, tool)
        outcome = _outcome(paths["out.json"], output, process.returncode, timed_out, timeout_s)
    notes = report.notes if report.complete else (*report.notes, *_tail(output))
    return SanitizerReport(report.tool, report.errors, report.warnings, report.kinds, report.first,
                           report.complete and not timed_out, outcome, notes, seconds)


def _runner_env() -> dict[str, str]:
    """This environment, with the folder that holds ``workers`` first on PYTHONPATH: the runner
    imports the same code as this process, however this process found it."""
    env = dict(os.environ)
    home = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([home, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    return env


def _outcome(out: Path, output: str, code: int | None, timed_out: bool, timeout_s: float) -> str:
    """What the runner said of its trial, or why it said nothing."""
    if timed_out:
        return f"killed after {timeout_s:g} s (a hang, or too slow under the tool)"
    try:
        said = json.loads(out.read_text())
    except (OSError, ValueError):
        tail = _tail(output)
        return f"the runner ended with code {code} and no result" + (f": {tail[-1]}" if tail else "")
    return "ok" if said.get("ok") else f"{said.get('failure')}: {said.get('reason')}"


def _tail(output: str, lines: int = 3) -> tuple[str, ...]:
    kept = [line.strip() for line in output.splitlines() if line.strip() and not line.startswith("=")]
    return tuple(kept[-lines:])


__all__ = ["TOOLS", "RunSpec", "SanitizerReport", "find_sanitizer", "parse", "run_tool", "sanitizer_command"]
