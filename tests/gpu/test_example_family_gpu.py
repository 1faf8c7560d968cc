"""The example family of docs/FAMILIES.md tuned for real by its path, and exported.

Run on the GPU machine: ``pytest -m gpu``. Skipped where no GPU is visible.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "examples" / "row_softmax"


def test_the_row_softmax_tunes_by_path_and_exports(tmp_path):
    import tuner
    from tuner.answers.exporter import launch_path

    db = f"sqlite:///{tmp_path / 'ex.db'}"
    result = tuner.tune(str(FOLDER), "4096,1000", "fp16", trials=20, db=db, seed=0)
    assert result.best is not None and result.measured == 20, result
    assert result.failed == 0, result  # every valid config computes the right softmax
    path = tuner.export(str(FOLDER), "4096,1000", "fp16", out_dir=tmp_path, db=db)
    launch = json.loads(launch_path(path).read_text())
    assert launch["problem"] == {"shape": [4096, 1000], "dtype": "fp16", "flags": {}}
    assert "row_softmax" in path.read_text()
