"""Compile and measure kernel configs: Ray CPU tasks compile, one Ray actor per GPU measures.

    from workers import WorkerPool
    with WorkerPool("attention", problem) as pool:
        pool.submit(0, params, source, launch, options)
        results = pool.poll(timeout=5.0)

``ray`` and ``cuda`` are imported only inside this package; workers never touch the database.
"""

from workers.compile import compile_cubin, toolkit_version
from workers.errors import CompileError, LaunchError, NoGPUError, WorkerError
from workers.pool import WorkerPool
from workers.replay import Landscape, ReplayBench, load_landscape, save_landscape
from workers.results import (
    FAILURE_KINDS,
    Binary,
    CompileRequest,
    DeviceInfo,
    Measurement,
    Resources,
    Retiming,
    Timing,
    measurement_from_json,
    measurement_to_json,
)

__all__ = [
    "FAILURE_KINDS",
    "Binary",
    "CompileError",
    "CompileRequest",
    "DeviceInfo",
    "Landscape",
    "LaunchError",
    "Measurement",
    "NoGPUError",
    "ReplayBench",
    "Resources",
    "Retiming",
    "Timing",
    "WorkerError",
    "WorkerPool",
    "compile_cubin",
    "load_landscape",
    "measurement_from_json",
    "measurement_to_json",
    "save_landscape",
    "toolkit_version",
]
