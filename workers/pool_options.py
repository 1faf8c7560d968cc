"""How a :class:`workers.WorkerPool` runs, as one frozen value built once and passed whole::

    options = PoolOptions(replay="landscape.json", measure_timeout_s=30.0)
    with WorkerPool("attention", problem, options) as pool:
        ...

Plain Python: the tuner builds one without importing Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from workers.calibrate import CALIBRATE_EVERY
from workers.compile_task import SCREEN_SPILL_BYTES
from workers.timing_options import DEFAULT_TIMING, TimingOptions


@dataclass(frozen=True)
class PoolOptions:
    """Where a pool's workers run, how long they may take, and how they time a trial.

    ``ship_folder``: a family given as a folder goes to the actors through Ray's ``runtime_env``
    ``py_modules`` (None: when joining the cluster at ``ray_address``); Ray must be started with
    it (the pool does, when it starts Ray).

    ``calibrate_every`` / ``calibrate_seconds``: with several GPUs, every GPU times the incumbent
    again after that many trials of its own, or that many seconds, whichever comes first
    (``workers.calibrate``). ``replay_gpus`` (tests and simulations only, with ``replay``): one
    replay actor per factor, each standing for a GPU whose times are the recorded ones times its
    factor (``ReplayBench.simulate``). ``simulate_gpus``: with ``replay``, that many simulated
    GPUs that each take a trial's GPU time (:mod:`workers.simulate`), on Ray's custom resource
    ``sim_gpu`` (the pool's own Ray gets it; a Ray started elsewhere must have it); they are one
    GPU model, the landscape's (no calibration, no ratios between them). ``gpus``: the pool
    measures on at most that many of them (None: every GPU of the cluster, or every simulated
    one); Ray holds each for the pool's actors alone, so pools given shares that add up to no
    more than the cluster's GPUs never time on one GPU at once. A bench class
    (``worker_cls``) takes packed requests: it derives from :class:`workers.request.TakesRequests`.
    """

    ray_address: str | None = None
    replay: str | Path | None = None  # a landscape to answer from instead of GPUs
    compile_workers: int | None = None  # None: one a CPU of the cluster
    measure_timeout_s: float = 60.0
    compile_timeout_s: float = 300.0
    cache_dir: str | Path | None = None  # the cubin cache (None: workers.compile's default)
    worker_cls: type | None = None  # the GPU actor's class (None: GpuBench, or ReplayBench)
    backend: str = "auto"  # the compiler: nvrtc, nvcc or auto
    seed: int = 0  # the inputs' seed
    timing: TimingOptions = DEFAULT_TIMING
    screen_spill_bytes: int | None = SCREEN_SPILL_BYTES
    ship_folder: bool | None = None
    calibrate_every: int = CALIBRATE_EVERY
    calibrate_seconds: float | None = None
    replay_gpus: Sequence[float] | None = None
    simulate_gpus: int | None = None
    gpus: int | None = None  # the most GPUs this pool measures on (None: all)

    @classmethod
    def of(cls, options: PoolOptions | None, keywords: dict[str, Any]) -> PoolOptions:
        """``options`` (None: the defaults) with ``keywords`` replacing its fields; a keyword
        that names no field: one TypeError."""
        unknown = sorted(set(keywords) - set(cls.__dataclass_fields__) - {"measure_options"})
        if unknown:
            raise TypeError(f"WorkerPool() got unknown option(s): {', '.join(unknown)}")
        fields = dict(keywords)
        if "measure_options" in fields:  # the timing as a dict of its fields
            fields["timing"] = TimingOptions.of(fields.pop("measure_options"))
        base = options or cls()
        return cls(**{**base.__dict__, **fields})
