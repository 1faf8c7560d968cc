"""The "Bad input" table of docs/BAD_INPUT.md, the rows that other tests do not cover already:
each bad input ends in one line ``tuner: error: ...``, exit code 2, no output and the database
unchanged."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tuner.cli.commands import main
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


@pytest.fixture(scope="class")
def class_ray():
    """A local Ray for a class's tests, as ``workers.ray_session.shared_ray`` keeps one across
    studies: their commands find it up and neither start nor stop one."""
    from workers.ray_session import shared_ray

    with shared_ray():
        yield


@pytest.mark.usefixtures("class_ray")
class TestAMissingOrCorruptReplayFile:
    """Refused after Ray started, once the pool reads the file: one line, and no database
    created. In this process, on the class's Ray (the same refusal from ``python -m tuner``, its
    own Ray started, is test_a_landscape_of_negative_times_stores_no_winner's)."""

    @pytest.mark.parametrize("content, message", [
        (None, "cannot start the workers: cannot read landscape {path}: No such file or directory"),
        ("not json", "cannot start the workers: landscape {path} is not JSON: Expecting value"),
        ("[1, 2]", "cannot start the workers: landscape {path}: not an object"),
        ('{"format": 1}', "cannot start the workers: landscape {path} is malformed: KeyError: "),
    ])
    def test_a_missing_or_corrupt_replay_file(self, tmp_path, content, message, capsys):
        path = tmp_path / "landscape.json"
        if content is not None:
            path.write_text(content)
        assert _run(["tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal",
                     "--replay", str(path), "--db", f"sqlite:///{tmp_path / 'tuner.db'}"]) == 2
        assert _one_line(capsys).startswith(message.format(path=path))
        assert not (tmp_path / "tuner.db").exists()

    def test_the_bundled_replay_file_of_another_problem(self, tmp_path, capsys):
        landscape = LANDSCAPE
        assert _run(["tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16",  # not causal
                     "--replay", str(landscape), "--db", f"sqlite:///{tmp_path / 'tuner.db'}"]) == 2
        assert _one_line(capsys).startswith(f"cannot start the workers: landscape {landscape} records attention ")
        assert not (tmp_path / "tuner.db").exists()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _foreign(path: Path) -> bytes:
    """A SQLite file of another program at ``path``; its bytes."""
    import sqlite3

    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        connection.execute("INSERT INTO customers VALUES (1, 'ada')")
    connection.close()
    return path.read_bytes()


@pytest.mark.parametrize("argv", [
    ["tune", "toy", *SHAPE, "--trials", "2"],
    ["tune-many", "toy", "--shapes", "{shapes}", "--trials", "2"],
    ["studies"], ["show", "1"], ["best", "toy", *SHAPE], ["export", "toy", *SHAPE, "-o", "{out}"],
    ["landscape", "1", "-o", "{out}/l.json"], ["coverage", "toy"], ["report", "1", "-o", "{out}/r.png"],
    ["serve"], ["export-dispatch", "toy", "-o", "{out}"], ["export-torch", "gemm", "-o", "{out}"],
], ids=lambda argv: argv[0])
def test_another_programs_database_is_refused_and_left_byte_for_byte(toy, pools, tmp_path, argv, capsys):
    """A SQLite file with tables and none of ours: every command that opens a database refuses it
    before anything writes (no table added, no switch to WAL, no -wal file)."""
    path = tmp_path / "theirs.db"
    before = _foreign(path)
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(f"- {{shape: '{PROBLEM[0]}', dtype: {PROBLEM[1]}}}\n")
    argv = [a.format(shapes=shapes, out=tmp_path / "out") for a in argv]
    assert _run([*argv, "--db", f"sqlite:///{path}"]) == 2
    assert _one_line(capsys) == (f"cannot open database sqlite:///{path}: not a tuner database: it holds 1 table "
                                 "of another program (customers) and none of ours")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes.yaml", "theirs.db", "toy_family"]


@pytest.mark.parametrize("command", ["tune", "tune-many"])
@pytest.mark.parametrize("db, message", [
    ("sqlite:///{tmp}/corrupt.db", "cannot open database sqlite:///{tmp}/corrupt.db: file is not a database"),
    ("sqlite:///{tmp}/no/folder/tuner.db",
     "cannot open database sqlite:///{tmp}/no/folder/tuner.db: unable to open database file (no folder {tmp}/no/folder)"),
    ("postgresql://nobody@127.0.0.1:{port}/x", "cannot open database postgresql://nobody@127.0.0.1:{port}/x: "),
])
def test_a_database_that_cannot_be_opened_is_refused_before_ray_starts(tmp_path, monkeypatch, command, db, message,
                                                                      capsys):
    """The real path, but for a Ray that must not start: the database is read before Ray starts,
    in a second or two, where Ray's start took ten or more."""
    import time

    from workers import ray_session

    started_ray = []
    monkeypatch.setattr(ray_session, "start_ray", lambda *args, **kwargs: started_ray.append(args) or False)
    (tmp_path / "corrupt.db").write_bytes(b"garbage text\n")
    (tmp_path / "shapes.yaml").write_text("- {shape: '2,8,1024,64', dtype: fp16, flags: {causal: true}}\n")
    port = _free_port()
    db, message = (text.format(tmp=tmp_path, port=port) for text in (db, message))
    problem = (["--shape", "2,8,1024,64", "--dtype", "fp16", "--causal"] if command == "tune"
               else ["--shapes", str(tmp_path / "shapes.yaml")])
    started = time.monotonic()
    assert _run([command, "attention", *problem, "--replay", str(LANDSCAPE), "--trials", "2", "--db", db]) == 2
    assert time.monotonic() - started < 3
    assert _one_line(capsys).startswith(message)
    assert started_ray == []
    assert (tmp_path / "corrupt.db").read_bytes() == b"garbage text\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.db", "shapes.yaml"]


def _minus_one(tmp_path: Path) -> Path:
    """The shipped attention landscape with every ok time at -1 ms."""
    data = json.loads(LANDSCAPE.read_text())
    for entry in data["entries"]:
        if entry["measurement"]["ok"]:
            entry["measurement"]["timing"]["median_ms"] = -1
    path = tmp_path / "minus.json"
    path.write_text(json.dumps(data))
    return path


def test_a_landscape_of_negative_times_is_refused_by_bench_search(tmp_path, capsys):
    path = _minus_one(tmp_path)
    assert _run(["bench-search", str(path), "--seeds", "1"]) == 2
    assert _one_line(capsys) == (f"landscape {path}: entry 1 is ok with median_ms -1.0, "
                                 "not a positive number of milliseconds")


def test_a_landscape_of_negative_times_stores_no_winner(tmp_path):
    """The real path (Ray starts, the pool reads the file): refused, no database created."""
    path = _minus_one(tmp_path)
    done = run_cli("tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal",
                   "--replay", str(path), "--trials", "3", "--db", f"sqlite:///{tmp_path / 'tuner.db'}", cwd=tmp_path)
    ours = [line for line in done.stderr.splitlines() if "Token authentication" not in line]
    assert done.returncode == 2 and done.stdout == "" and len(ours) == 1, done.stderr
    assert ours[0] == (f"tuner: error: cannot start the workers: landscape {path}: entry 1 is ok with "
                       "median_ms -1.0, not a positive number of milliseconds")
    assert not (tmp_path / "tuner.db").exists()


GEMM_LANDSCAPE = "gemm_2048x2048x2048-fp16-nn_h100.json"


@pytest.mark.parametrize("replay", [GEMM_LANDSCAPE, GEMM_LANDSCAPE.removesuffix(".json"),
                                    str(LANDSCAPE.parents[2] / "gemm" / "landscapes" / GEMM_LANDSCAPE)])
@pytest.mark.parametrize("command", ["tune", "tune-many"])
def test_a_landscape_of_another_family(tmp_path, replay, command, capsys):
    """Its name (a landscape gemm ships) or a file that records gemm: said so before Ray starts."""
    (tmp_path / "shapes.yaml").write_text("- {shape: '2,8,1024,64', dtype: fp16, flags: {causal: true}}\n")
    problem = (["--shape", "2,8,1024,64", "--dtype", "fp16", "--causal"] if command == "tune"
               else ["--shapes", str(tmp_path / "shapes.yaml")])
    assert _run([command, "attention", *problem, "--replay", replay, "--db", f"sqlite:///{tmp_path / 'tuner.db'}"]) == 2
    assert _one_line(capsys) == f"{replay} is a landscape of family 'gemm', not 'attention'"
    assert not (tmp_path / "tuner.db").exists()


@pytest.mark.parametrize("png, why", [("no/folder/s.png", "No such file or directory"), (".", "Is a directory"),
                                      ("shapes.txt/s.png", "Not a directory")])
def test_bench_search_refuses_a_plot_it_cannot_write_before_it_runs(tmp_path, monkeypatch, png, why, capsys):
    import time

    monkeypatch.chdir(tmp_path)
    (tmp_path / "shapes.txt").write_text("")
    started = time.monotonic()
    assert _run(["bench-search", str(LANDSCAPE), "--seeds", "20", "--png", png]) == 2
    assert time.monotonic() - started < 5  # the 20 seeds of 5 samplers take a minute
    assert _one_line(capsys) == f"cannot write {png}: {why}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes.txt"]


def test_a_time_budget_over_a_year_is_refused(toy, db, pools, capsys):
    import tuner

    assert _run(["tune", "toy", *SHAPE, "--time-budget", "999999999999999h", "--db", db]) == 2
    assert _one_line(capsys) == "argument --time-budget: must be at most a year (8760h), not '999999999999999h'"
    with pytest.raises(tuner.UsageError, match=r"^the time budget must be at most a year \(3.1536e\+07s\), not 1e\+30s$"):
        tuner.tune("toy", *PROBLEM, time_budget=1e30, db=db)
    assert not Path(db.removeprefix("sqlite:///")).exists()
