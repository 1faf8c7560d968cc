"""Databases of other versions through the ``tuner`` command: one written by a newer version is
refused with one line and left as it was; one written by an older version is upgraded."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

from alembic import command
from sqlalchemy import create_engine

from storage import TrialOutcome, open_repository
from storage.migrate import VERSION_TABLE, alembic_config, head_revision
from tuner.cli.commands import main
from tuner_doubles import LANDSCAPE

STUDY = {
    "family": "attention", "template_hash": "0123456789abcdef", "space": {"block_m": [64, 128]},
    "shape": [2, 8, 1024, 64], "dtype": "fp16", "flags": {"causal": True},
    "device": {"name": "NVIDIA H200", "sm_count": 132, "compute_capability": "9.0",
               "driver_version": "570", "cuda_version": "12.8"},
    "sampler": "tpe", "replay": False, "settings": {},
}


def _database(path: Path) -> str:
    url = f"sqlite:///{path}"
    with open_repository(url) as repo:
        study = repo.open_study("kept", **STUDY)
        repo.record_trial(study.id, 0, {"block_m": 64}, TrialOutcome(status="ok", median_ms=1.5))
    return url


def _version(path: Path) -> str:
    with sqlite3.connect(path) as connection:
        return connection.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()[0]


def _digest(path: Path) -> str:
    return "".join(hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.parent.glob(path.name + "*")))


def test_a_database_of_a_newer_version_is_refused_with_one_line_and_left_alone(tmp_path, capsys):
    """By `tune` too, before its Ray starts (in well under the seconds Ray takes)."""
    path = tmp_path / "newer.db"
    _database(path)
    with sqlite3.connect(path) as connection:
        connection.execute(f"UPDATE {VERSION_TABLE} SET version_num = 'f00dfeed'")
    connection.close()
    before = _digest(path)
    capsys.readouterr()
    tune = ["tune", "attention", "--shape", "2,8,1024,64", "--dtype", "fp16", "--causal",
            "--replay", str(LANDSCAPE), "--trials", "3"]
    for argv in (["studies"], ["show", "kept"], tune):
        started = time.monotonic()
        assert main([*argv, "--db", f"sqlite:///{path}"]) == 2
        assert time.monotonic() - started < 3
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and captured.out == "", captured.err
        assert lines[0].startswith("tuner: error: cannot open database sqlite:///")
        assert "revision f00dfeed, newer than this version of the tuner knows" in lines[0]
    assert _digest(path) == before and _version(path) == "f00dfeed"


def test_a_database_of_an_older_version_is_upgraded_keeping_its_studies(tmp_path, capsys):
    path = tmp_path / "older.db"
    url = _database(path)
    engine = create_engine(url)
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0003")
    engine.dispose()
    assert _version(path) == "0003"
    capsys.readouterr()
    assert main(["show", "kept", "--db", url]) == 0
    assert "1.5" in capsys.readouterr().out
    assert _version(path) == head_revision()
