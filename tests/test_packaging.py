"""What a wheel carries and declares: the license, classifiers, why each upper pin, PostgreSQL's
driver as an extra (and the one line without it), and the landscape the README replays."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def readme_landscape() -> str:
    """The file the README's replay example names after --replay."""
    found = re.search(r"--replay (\S+\.json)", (ROOT / "README.md").read_text())
    assert found, "the README has a replay example"
    return found.group(1)


def test_license_and_classifiers():
    meta = project()
    assert meta["license"] == "MIT" and meta["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    assert "Programming Language :: Python :: 3.11" in meta["classifiers"]
    assert not any(c.startswith("License ::") for c in meta["classifiers"])  # the SPDX expression says it


def test_every_upper_pin_says_why():
    lines = PYPROJECT.read_text().splitlines()
    pinned = [i for i, line in enumerate(lines)
              if re.match(r'\s*"[^"]*(<|==)[^"]*",', line) and "python" not in line]
    assert pinned, "pyproject pins some dependencies from above"
    for i in pinned:
        said = "#" in lines[i] or lines[i - 1].strip().startswith("#")
        assert said, f"no comment says why: {lines[i].strip()}"


def test_postgresql_driver_is_an_extra_that_the_tests_keep():
    meta = project()
    assert not any(d.startswith("psycopg") for d in meta["dependencies"])
    assert any(d.startswith("psycopg") for d in meta["optional-dependencies"]["postgres"])
    assert any(d.startswith("psycopg") for d in meta["optional-dependencies"]["test"])


NO_DRIVER = """
import sys
sys.modules["psycopg"] = None  # as if the [postgres] extra were not installed
sys.modules["psycopg2"] = None
from tuner.cli.commands import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("url", ["postgresql://nobody@127.0.0.1:5432/x",
                                 "postgresql+psycopg://nobody@127.0.0.1:5432/x"])
def test_a_postgresql_url_without_the_driver_says_what_to_install(tmp_path, url):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", NO_DRIVER, "studies", "--db", url], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"tuner: error: cannot open database {url}: PostgreSQL's driver is not installed: "
        "pip install 'kernel-tuner-service[postgres]' (psycopg, for postgresql:// and "
        "postgresql+psycopg:// URLs) (import of psycopg halted; None in sys.modules)"]


def test_the_wheel_carries_the_landscape_the_readme_replays_and_the_license(tmp_path):
    name = readme_landscape()
    assert "/" not in name  # found by name in the family's landscapes/, wherever tuner runs
    assert (ROOT / "templates" / "attention" / "landscapes" / name).is_file()
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    if done.returncode and "setuptools" in done.stderr and "No matching distribution" in done.stderr:
        pytest.skip("no package index to build the wheel with: " + done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = next(tmp_path.glob("kernel_tuner_service-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert f"templates/attention/landscapes/{name}" in names
    shipped = {str(path.relative_to(ROOT)) for path in ROOT.glob("templates/*/landscapes/*.json*")}
    assert any(n.endswith(".json.gz") for n in shipped) and shipped <= names  # compressed ones too
    # tuner export-dispatch's C++ templates
    assert {"tuner/answers/dispatch.h.j2", "templates/attention/dispatch.h.j2", "templates/gemm/dispatch.h.j2"} <= names
    # tuner export-torch's package and the families' torch ops
    assert {"tuner/answers/torch_package.py.j2", "templates/attention/torch_op.py.j2",
            "templates/gemm/torch_op.py.j2"} <= names
    assert {"tuner/answers/page/index.html", "tuner/answers/page/page.js"} <= names  # the page `tuner serve` shows
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: MIT" in metadata and "Provides-Extra: postgres" in metadata
    assert "Provides-Extra: serve" in metadata
    assert not any(line.startswith(("Requires-Dist: fastapi", "Requires-Dist: uvicorn")) and "extra ==" not in line
                   for line in metadata.splitlines())
    assert not any(line.startswith("Requires-Dist: psycopg") and "extra ==" not in line
                   for line in metadata.splitlines())
