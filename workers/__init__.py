"""Compile and measure kernel configs: Ray CPU tasks compile, one Ray actor per GPU measures.

    from workers import WorkerPool
    with WorkerPool("attention", problem) as pool:
        pool.submit(0, params, source, launch, options)
        results = pool.poll(timeout=5.0)

``ray`` and ``cuda`` are imported only inside this package; workers never touch the database.
Each name below is imported from its module when first used (PEP 562), so importing the package
or its light modules (``workers.results``, ``workers.compile``) does not import Ray: only
``workers.pool`` and ``workers.ray_session`` do.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "workers.compile": ("compile_cubin", "toolkit_version"),
    "workers.errors": ("ClusterUnreachable", "CompileError", "LaunchError", "NoGPUError",
                       "WorkerError"),
    "workers.pool": ("WorkerPool",),
    "workers.pool_options": ("PoolOptions",),
    "workers.replay": ("Landscape", "ReplayBench", "load_landscape", "save_landscape"),
    "workers.timing_options": ("TimingOptions",),
    "workers.results": ("FAILURE_KINDS", "Binary", "CompileRequest", "DeviceInfo", "Measurement",
                        "Resources", "Retiming", "Timing", "measurement_from_json",
                        "measurement_to_json"),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
