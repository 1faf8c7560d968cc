"""Shared fixtures for the workers' tests: one Ray for the session, GPU detection."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# The test family and the test-double benches are imported by name in Ray's worker processes.
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(HERE), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU")


def _has_gpu() -> bool:
    from workers.gpu import gpu_count

    return gpu_count() > 0


HAS_GPU = _has_gpu()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU visible to the CUDA driver")
    for item in items:
        if "gpu" in item.keywords and str(item.fspath).startswith(str(HERE)):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for every test that needs it (2 CPUs, no dashboard)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()
