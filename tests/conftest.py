"""Suite-wide: tests marked ``gpu`` run only where the CUDA driver sees a GPU."""

from __future__ import annotations

import pytest


def _has_gpu() -> bool:
    from workers.gpu import gpu_count

    return gpu_count() > 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items) or _has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU visible to the CUDA driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
