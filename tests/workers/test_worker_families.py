"""A family of one's own, outside this project, through the real local Ray pool: its actor
processes resolve it (by path, shipped by value, or through Ray's runtime_env), or the pool
says in one line what the workers lack. FamilyBench stands in for the GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from templates import get_family, reference, register, unregister
from templates.family import Problem
from worker_doubles import FAKE_DEVICE, FamilyBench
from workers import Measurement, Timing, WorkerError, WorkerPool, save_landscape

OUTSIDE = Path(__file__).resolve().parents[1] / "data" / "outside_family"
PROBLEM = Problem((1000,), "fp32")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """The outside family copied off every import path (the workers' PYTHONPATH included)."""
    return Path(shutil.copytree(OUTSIDE, tmp_path / "elsewhere" / "outside_family"))


@pytest.fixture
def pools(ray_session, tmp_path):
    made = []

    def make(family, **kw):
        pool = WorkerPool(family, PROBLEM, worker_cls=FamilyBench, backend="nvrtc",
                          cache_dir=tmp_path / "cache", measure_timeout_s=30.0, **kw)
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.close()


def _measure(pool: WorkerPool, family) -> Measurement:
    params = {"block": 128, "unroll": 1}
    pool.submit(0, params, family.render(params, PROBLEM), family.launch(params, PROBLEM), ())
    end = time.monotonic() + 120
    results = {}
    while pool.pending() and time.monotonic() < end:
        results.update(pool.poll(timeout=1.0))
    return results[0]


def test_a_folder_given_by_path_is_resolved_in_the_worker_processes(pools, outside):
    family = get_family(str(outside))
    pool = pools(reference(family))
    measured = _measure(pool, family)
    assert measured.ok, measured
    assert measured.resources is not None and measured.cubin_hash  # compiled by a Ray task
    detail = dict(part.split("=", 1) for part in measured.detail.split())
    assert detail["family"] == detail["prepared"] == "outside_scale"
    assert detail["folder"] == str(outside)
    assert int(detail["pid"]) != os.getpid()  # an actor's process loaded it from the path


def test_a_family_only_registered_here_is_shipped_by_value(pools, outside):
    # Its class lives in a module that only this process has (loaded by path under a private name).
    family = type(get_family(str(outside)))()
    family.name = "outside_registered"
    register(family)
    try:
        assert reference(family) is family
        measured = _measure(pools(family), family)
    finally:
        unregister("outside_registered")
    assert measured.ok, measured
    assert "family=outside_registered" in measured.detail
    assert f"pid={os.getpid()} " not in measured.detail


def test_a_folder_travels_in_rays_runtime_env_to_a_cluster(outside, tmp_path):
    """What joining a cluster does (``ray_address``): Ray started with the folder as
    ``py_modules`` (a Ray of its own, in another process: this one's is up without it), the
    workers importing the package ``outside_family`` from Ray's copy of it."""
    script = f"""
import sys
from templates import get_family
from templates.family import Problem
from worker_doubles import FamilyBench
from workers import WorkerPool
from test_worker_families import _measure, PROBLEM

family = get_family({str(outside)!r})
with WorkerPool({str(outside)!r}, PROBLEM, worker_cls=FamilyBench, backend="nvrtc",
                cache_dir={str(tmp_path / "cache")!r}, ship_folder=True) as pool:
    measured = _measure(pool, family)
print("ok" if measured.ok else "failed", measured.detail or measured.reason)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ok, *parts = done.stdout.strip().splitlines()[-1].split()
    detail = dict(part.split("=", 1) for part in parts)
    assert ok == "ok" and detail["family"] == "outside_scale", done.stdout
    assert detail["folder"] != str(outside) and Path(detail["folder"]).name == "outside_family"


def test_a_worker_without_the_family_says_what_to_install(pools, tmp_path):
    gone = tmp_path / "not_on_this_node"
    with pytest.raises(WorkerError) as caught:
        pools(str(gone))
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"a worker cannot load kernel family {gone}: no kernel family at {gone}")
    assert f"copy {gone} to the same path on every node" in text
    with pytest.raises(WorkerError, match="install the module 'no_such_package' on every node"):
        pools("no_such_package:FAMILY")


def test_a_replay_of_a_family_given_by_path_completes_its_old_configs(ray_session, outside, tmp_path):
    """A landscape names the family (``outside_scale``); replayed for its path, the replay
    workers complete configs recorded before ``unroll`` existed through the family itself."""
    recorded = Measurement(ok=True, timing=Timing(0.5, 0.4, 0.7, 0.05, 50), error=1e-7)
    path = save_landscape(tmp_path / "land.json", device=FAKE_DEVICE, family="outside_scale",
                          problem=PROBLEM, template_hash="abc", entries=[({"block": 64}, recorded)])
    with WorkerPool(str(outside), PROBLEM, replay=path, cache_dir=tmp_path / "cache") as pool:
        assert pool.recorded == ({"block": 64, "unroll": 1},)
        pool.submit(0, {"block": 64, "unroll": 1}, "", get_family(str(outside)).launch(
            {"block": 64, "unroll": 1}, PROBLEM), ())
        end = time.monotonic() + 60
        results = {}
        while pool.pending() and time.monotonic() < end:
            results.update(pool.poll(timeout=1.0))
    assert results[0].ok and results[0].replayed and results[0].timing == recorded.timing
