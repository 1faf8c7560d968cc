"""The "Bad input" table of docs/BAD_INPUT.md, the rows that other tests do not cover already:
each bad input ends in one line ``tuner: error: ...``, exit code 2, no output and the database
unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tuner.cli import main
from tuner_doubles import LANDSCAPE, PROBLEM, run_cli

SHAPE = ["--shape", PROBLEM[0], "--dtype", PROBLEM[1]]
DATA = Path(__file__).resolve().parents[1] / "data"


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exit:  # argparse's errors exit from inside parse_args
        return int(exit.code)


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    assert lines[0].startswith("tuner: error: "), lines[0]
    return lines[0].removeprefix("tuner: error: ")


def _digest(path: Path) -> str:
    """The database file and its write-ahead log (not the -shm index readers map, nor an empty log)."""
    return "".join(hashlib.sha256(p.read_bytes()).hexdigest()
                   for p in (path, path.with_name(path.name + "-wal")) if p.exists() and p.stat().st_size)


@pytest.fixture
def stored(toy, db, pools, capsys) -> Path:
    """``db`` with one tuned study of the toy problem; its path."""
    assert _run(["tune", "toy", *SHAPE, "--trials", "4", "--seed", "0", "--db", db]) == 0
    capsys.readouterr()
    return Path(db.removeprefix("sqlite:///"))


@pytest.mark.parametrize("argv, message", [
    (["best", "gemm", "--shape", "64,64,64", "--dtype", "fp16", "--layout", "zz"],
     "argument --layout: invalid choice: 'zz' (choose from 'nn', 'nt', 'tn', 'tt')"),
    (["best", "gemm", "--shape", "64,64,64", "--dtype", "fp16", "--epilogue"],
     "argument --epilogue: expected one argument"),
    (["tune", "toy", *SHAPE, "--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["studies", "--db", "not a url"], "cannot open database 'not a url': not a database URL"),
    (["studies", "--db", "mysql://nobody@127.0.0.1:1/x"], "cannot open database mysql://nobody@127.0.0.1:1/x: "),
])
def test_bad_arguments(toy, argv, message, capsys):
    assert _run(argv) == 2
    assert _one_line(capsys).startswith(message)


def test_a_read_only_database_is_read_and_not_written(toy, stored, capsys):
    before = _digest(stored)
    read_only = f"sqlite:///file:{stored}?mode=ro&uri=true"
    assert _run(["best", "toy", *SHAPE, "--db", read_only]) == 0
    capsys.readouterr()
    assert _run(["tune", "toy", *SHAPE, "--trials", "8", "--db", read_only]) == 2
    assert "attempt to write a readonly database" in _one_line(capsys)
    assert _digest(stored) == before


def test_an_immutable_database_is_read_and_not_written(toy, stored, capsys):
    before = _digest(stored)
    immutable = f"sqlite:///file:{stored}?immutable=1&uri=true"
    assert _run(["studies", "--json", "--db", immutable]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1
    assert _run(["tune", "toy", *SHAPE, "--trials", "8", "--db", immutable]) == 2
    assert "readonly database" in _one_line(capsys)
    assert _digest(stored) == before


@pytest.mark.parametrize("content", [b"garbage text\n", bytes(range(256)) * 8])
@pytest.mark.parametrize("command", [["studies"], ["tune", "toy", *SHAPE, "--trials", "2"]])
def test_a_corrupt_database_is_left_as_it_is(toy, pools, tmp_path, content, command, capsys):
    path = tmp_path / "tuner.db"
    path.write_bytes(content)
    assert _run([*command, "--db", f"sqlite:///{path}"]) == 2
    assert _one_line(capsys) == f"cannot open database sqlite:///{path}: file is not a database"
    assert path.read_bytes() == content


def test_an_export_folder_that_cannot_be_written(toy, stored, tmp_path, capsys):
    taken = tmp_path / "a_file"
    taken.write_text("")
    assert _run(["export", "toy", *SHAPE, "-o", str(taken), "--db", f"sqlite:///{stored}"]) == 2
    assert _one_line(capsys) == f"cannot write to {taken}: File exists"
    assert _run(["export", "toy", *SHAPE, "-o", str(taken / "sub"), "--db", f"sqlite:///{stored}"]) == 2
    assert _one_line(capsys) == f"cannot write to {taken / 'sub'}: Not a directory"


@pytest.mark.parametrize("content, message", [
    (None, "cannot start the workers: cannot read landscape {path}: No such file or directory"),
    ("not json", "cannot start the workers: landscape {path} is not JSON: Expecting value"),
    ("[1, 2]", "cannot start the workers: landscape {path}: not an object"),
    ('{"format": 1}', "cannot start the workers: landscape {path} is malformed: KeyError: "),
])
def test_a_missing_or_corrupt_replay_file(tmp_path, content, message):
    """The real path (Ray starts, the pool reads the file): one line, and no database created."""
    path = tmp_path / "landscape.json"
    if content is not None:
        path.write_text(content)
    done = run_cli("tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal",
                   "--replay", str(path), "--db", f"sqlite:///{tmp_path / 'tuner.db'}", cwd=tmp_path)
    ours = [line for line in done.stderr.splitlines() if "Token authentication" not in line]
    assert done.returncode == 2 and done.stdout == "" and len(ours) == 1, done.stderr
    assert ours[0].startswith("tuner: error: " + message.format(path=path)), ours[0]
    assert not (tmp_path / "tuner.db").exists()


def test_the_bundled_replay_file_of_another_problem(tmp_path):
    landscape = LANDSCAPE
    done = run_cli("tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16",  # not causal
                   "--replay", str(landscape), "--db", f"sqlite:///{tmp_path / 'tuner.db'}", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert f"tuner: error: cannot start the workers: landscape {landscape} records attention " in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "tuner.db").exists()
