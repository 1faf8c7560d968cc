"""A family of one's own given by path to the API and the CLI: tuned, stored, read back and
exported under its name; sent to the workers as its absolute path; bad paths one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tuner.api
import workers
from tuner.cli.commands import main
from tuner_doubles import KERNEL_SOURCE, PROBLEM
from workers.pool_options import PoolOptions

SHAPE = ["--shape", PROBLEM[0], "--dtype", PROBLEM[1]]


@pytest.fixture
def toy_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A family folder in the working directory (``./toy_family``): its own template file, its
    FAMILY the tests' toy family."""
    folder = tmp_path / "toy_family"
    folder.mkdir()
    (folder / "kernel.cu.j2").write_text(KERNEL_SOURCE)
    (folder / "__init__.py").write_text(
        "from pathlib import Path\nfrom tuner_doubles import ToyFamily\n"
        "FAMILY = ToyFamily(Path(__file__).parent)\n")
    monkeypatch.chdir(tmp_path)
    return folder


def _error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), captured.err
    return lines[0]


def test_tune_best_export_a_family_given_by_path(toy_folder, db, pools, tmp_path, capsys):
    assert main(["tune", "./toy_family", *SHAPE, "--trials", "6", "--seed", "1", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "study     toy/" in out and "status    finished: 6 trials measured" in out
    assert main(["best", str(toy_folder), *SHAPE, "--json", "--db", db]) == 0  # absolute, too
    assert json.loads(capsys.readouterr().out)["median_ms"] > 0
    assert main(["export", "./toy_family", *SHAPE, "-o", "out", "--db", db]) == 0
    assert (tmp_path / "out" / "toy_2x4x1024x64-fp16.cu").exists()


def test_the_workers_get_the_absolute_path(toy_folder, monkeypatch):
    sent = []

    class Recorder:
        def __init__(self, family, problem, options=None):
            sent.append(family)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(workers, "WorkerPool", Recorder, raising=False)
    fam = tuner.api.lookup.family("./toy_family")
    with tuner.api._open_pool(fam, fam.parse_problem(*PROBLEM), PoolOptions()):
        pass
    assert sent == [str(toy_folder)]


@pytest.mark.parametrize("command", ["tune", "best", "export", "bench"])
def test_a_bad_path_is_one_line_and_exit_2(command, tmp_path, db, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    extra = ["-o", "out"] if command == "export" else []
    assert main([command, "./nowhere", *SHAPE, *extra, "--db", db]) == 2
    assert _error_line(capsys) == f"tuner: error: no kernel family at {tmp_path / 'nowhere'}: no such file or folder"


def test_a_folder_without_family_is_one_line_and_exit_2(tmp_path, db, monkeypatch, capsys):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "__init__.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "./half", *SHAPE, "--db", db]) == 2
    assert _error_line(capsys) == f"tuner: error: {tmp_path / 'half'} is not a kernel family: it defines no FAMILY"
