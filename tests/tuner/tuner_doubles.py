"""Test doubles for the tuner: a small kernel family and a pool with the WorkerPool interface.

The family ``toy`` has 4 * 3 * 3 * 2 = 72 configs; some are invalid (``check``), and among the
valid ones the configs with WARPS=4 and STAGES=2 fail on the "GPU" with every failure kind. They
are given the lowest latencies on purpose: if a failure ever became best, tests would see it.

The pool answers deterministically from the params (no Ray, no GPU) and counts submits; its
``retime`` answers from ``retime_ms`` (the search's latencies unless a test says otherwise).
Optuna and storage are the real ones, on a SQLite file per test (fixtures in ``conftest.py``).
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import templates
from templates.family import (
    BufferSpec,
    DeviceLimits,
    Flag,
    KernelArg,
    KernelFamily,
    Launch,
    Param,
    Problem,
    TemplateError,
    Validation,
)
from storage import params_key
from workers.depth import MIN_DEPTH
from workers.calibrate import CalibrationSchedule
from workers.results import FAILURE_KINDS, Calibration, DeviceInfo, Measurement, Paired, Resources, Retiming, Timing

KERNEL_SOURCE = "__global__ void toy_kernel() {}\n"


@contextlib.contextmanager
def registered(family_cls: type, folder: Path):
    """A test family made over ``folder`` (the toy kernel template written into it) and
    registered under its name until the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.cu.j2").write_text(KERNEL_SOURCE)
    family = templates.register(family_cls(folder))
    try:
        yield family
    finally:
        templates.unregister(family.name)
PROBLEM = ("2,4,1024,64", "fp16")
GPU_FAILURES = [k for k in FAILURE_KINDS if k != "invalid"]  # what a GPU run can end in
DEVICE = DeviceInfo(
    name="NVIDIA H100 80GB HBM3", sm_count=132, compute_capability=(9, 0),
    max_smem_per_block_optin=232448, driver_version="580.65", cuda_version="13.0",
    clocks={"sm_mhz": 1980},
)


class ToyFamily(KernelFamily):
    name = "toy"
    dtypes = ("fp16", "bf16")
    params = (
        Param("BLOCK_M", (16, 32, 64, 128)),
        Param("BLOCK_N", (16, 32, 64)),
        Param("WARPS", (1, 2, 4)),
        Param("STAGES", (1, 2)),
    )

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    flags = (Flag("causal", (False, True), "causal masking"),)

    def parse_problem(self, shape: str | Sequence[int], dtype: str,
                      flags: Mapping[str, Any] | None = None) -> Problem:
        try:
            dims = tuple(int(d) for d in (shape.split(",") if isinstance(shape, str) else shape))
        except ValueError:
            raise TemplateError(f"malformed shape {shape!r}: expected B,H,N,D") from None
        if len(dims) != 4 or min(dims) < 1:
            raise TemplateError(f"malformed shape {shape!r}: expected four positive B,H,N,D")
        if dims[3] not in (64, 128):
            raise TemplateError(f"unsupported head dim D={dims[3]} (64 or 128)")
        if dtype not in self.dtypes:
            raise TemplateError(f"unsupported dtype {dtype!r} (fp16 or bf16)")
        return Problem(dims, dtype, self.problem_flags(flags))

    def flops(self, problem: Problem) -> float:
        b, h, n, d = problem.shape
        return 4.0 * b * h * n * n * d / (2 if problem.flag("causal") else 1)

    def min_bytes(self, problem: Problem) -> int:
        return 4 * math.prod(problem.shape) * 2

    def check(self, params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
        if params["BLOCK_M"] * params["BLOCK_N"] * params["STAGES"] > 8192:
            return "smem: tiles do not fit"
        if params["BLOCK_M"] >= 64 and params["WARPS"] == 1:
            return "warps: too few warps for the tile"
        return None

    def render(self, params: Mapping[str, Any], problem: Problem) -> str:
        defines = "".join(f"#define {k} {v}\n" for k, v in params.items())
        return defines + (self.folder / "kernel.cu.j2").read_text()

    def launch(self, params: Mapping[str, Any], problem: Problem) -> Launch:
        b, h, n, _ = problem.shape
        return Launch(
            kernel="toy_kernel",
            grid=(n // params["BLOCK_M"], h, b),
            block=(32 * params["WARPS"], 1, 1),
            smem_bytes=params["BLOCK_M"] * params["BLOCK_N"] * params["STAGES"] * 2,
            args=(KernelArg("buffer", "q"), KernelArg("buffer", "out"), KernelArg("i32", n)),
        )

    def compile_options(self, params: Mapping[str, Any], problem: Problem) -> tuple[str, ...]:
        return ("-O3", "-std=c++17")

    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        return {}

    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        return ()

    def validate(self, problem, inputs, outputs, reference=None) -> Validation:
        return Validation(True, 0.0, 0.0)


def latency_ms(params: Mapping[str, Any]) -> float:
    """A smooth landscape; WARPS=4, STAGES=2 (which fail) would be the fastest."""
    return round(
        1.0
        + 0.3 * abs(math.log2(params["BLOCK_M"]) - 6)
        + 0.2 * abs(math.log2(params["BLOCK_N"]) - 5)
        + {1: 0.5, 2: 0.2, 4: 0.0}[params["WARPS"]]
        + {1: 0.1, 2: 0.0}[params["STAGES"]],
        6,
    )


def failure_of(params: Mapping[str, Any]) -> str | None:
    if params["WARPS"] == 4 and params["STAGES"] == 2:
        index = [16, 32, 64, 128].index(params["BLOCK_M"]) * 3 + [16, 32, 64].index(params["BLOCK_N"])
        return GPU_FAILURES[index % len(GPU_FAILURES)]
    return None


def clocks_of(params: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """The clocks, temperature and power a GPU worker reads right before and right after timing
    ``params`` (each config its own, none of them the device's start-up clocks)."""
    before = {"sm_mhz": 1700 + params["BLOCK_M"], "mem_mhz": 2619,
              "temperature_c": 40 + params["BLOCK_N"] // 16, "power_w": 300}
    return {"before": before, "after": {**before, "temperature_c": before["temperature_c"] + 2,
                                        "power_w": 400 + params["WARPS"]}}


def measure(params: Mapping[str, Any]) -> Measurement:
    resources = Resources(registers=96, smem_static=0, stack_bytes=0, spill_stores=0, spill_loads=0)
    ms = latency_ms(params)
    timing = Timing(median_ms=ms, min_ms=ms * 0.99, max_ms=ms * 1.02, iqr_ms=ms * 0.01, repetitions=50)
    failure = failure_of(params)
    if failure is None:
        return Measurement(ok=True, timing=timing, error=1e-3, max_abs_error=2e-3,
                           resources=resources, cubin_hash=f"cubin-{sorted(params.items())}",
                           compile_seconds=0.5, gpu_seconds=0.01, toolkit="nvcc 13.0.88",
                           clocks=clocks_of(params))
    extra = {"timing": timing, "error": 0.5} if failure == "wrong" else {}
    return Measurement.failed(failure, f"{failure} in the toy kernel", detail="log tail",
                              resources=resources, compile_seconds=0.5, **extra)


RETIME_BEFORE = {"sm_mhz": 1980, "mem_mhz": 2619, "temperature_c": 41}
RETIME_AFTER = {"sm_mhz": 1755, "mem_mhz": 2619, "temperature_c": 58}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakePool:
    """The WorkerPool interface, answering from :func:`measure`. Results come back
    ``per_poll`` at a time, in submission order; each answered result advances ``clock``."""

    def __init__(self, *, per_poll: int = 2, seconds_per_result: float = 1.0,
                 interrupt_after_polls: int | None = None, clock: FakeClock | None = None) -> None:
        self.device = DEVICE
        self.limits = DEVICE.limits
        self.num_gpus = 1
        self.compile_workers = 2
        self.per_poll = per_poll
        self.seconds_per_result = seconds_per_result
        self.interrupt_after_polls = interrupt_after_polls
        self.clock = clock or FakeClock()
        self.submitted: list[dict[str, Any]] = []
        self.in_flight_at_submit: list[int] = []  # trials submitted and not yet answered, at each submit
        self.sources: list[str] = []
        self.queue: list[tuple[int, dict[str, Any]]] = []
        self.polls = 0
        self.calls: list[str] = []  # "poll" and "serve", in the order the coordinator made them
        self.gpus: list[dict[str, Any]] = []  # one GPU: nothing to normalize
        self.max_actor_depth = MIN_DEPTH
        self.recorded = None
        self.gpu_busy_seconds = 0.0
        self.kernel_busy_seconds = 0.0
        self.flush_busy_seconds = 0.0
        self.closed = False
        self.retimed: list[list[dict[str, Any]]] = []  # the configs of each retime call

    def submit(self, ticket, params, source, launch, options) -> None:
        assert isinstance(launch, Launch) and source is None and "-O3" in options  # the pool renders
        self.submitted.append(dict(params))
        self.in_flight_at_submit.append(len(self.queue))
        self.queue.append((ticket, dict(params)))

    def pending(self) -> int:
        return len(self.queue)

    def serve(self) -> None:
        self.calls.append("serve")

    def set_abort_above(self, ms: float | None) -> None:
        pass

    def set_incumbent(self, params, source, launch, options) -> None:
        pass

    def calibrations(self) -> list[Calibration]:
        return []

    def calibrating(self) -> bool:
        return False

    def replacements(self) -> list[Any]:
        return []

    def busy_intervals(self) -> list[tuple[int, float, float]]:
        return []

    def simulator_cpu_seconds(self) -> float:
        return 0.0

    def simulator_lateness(self) -> list[float]:
        return []

    def poll(self, timeout: float) -> list[tuple[int, Measurement]]:
        self.polls += 1
        self.calls.append("poll")
        if self.polls == self.interrupt_after_polls:
            raise KeyboardInterrupt  # Ctrl-C, once
        out, self.queue = self.queue[: self.per_poll], self.queue[self.per_poll:]
        self.clock.now += self.seconds_per_result * len(out)
        self.gpu_busy_seconds += 0.01 * len(out)
        return [(ticket, measure(params)) for ticket, params in out]

    def retime(self, kernels, *, rounds, max_seconds) -> Retiming:
        """Each config's ``retime_ms`` (a Measurement to fail it), as if timed ``rounds`` times."""
        assert not self.queue, "re-timed with trials in flight"
        self.retimed.append([dict(params) for params, *_ in kernels])
        out = []
        for params, source, launch, options in kernels:
            assert isinstance(launch, Launch) and isinstance(source, str) and "-O3" in options
            ms = self.retime_ms(params)
            if isinstance(ms, Measurement):
                out.append(ms)
                continue
            timing = Timing(median_ms=ms, min_ms=ms * 0.995, max_ms=ms * 1.01, iqr_ms=ms * 0.002,
                            repetitions=rounds)
            out.append(Measurement(ok=True, timing=timing, error=1e-3, max_abs_error=2e-3))
        return Retiming(tuple(out), rounds, clocks_before=dict(RETIME_BEFORE),
                        clocks_after=dict(RETIME_AFTER), gpu_seconds=0.5)

    @staticmethod
    def retime_ms(params: Mapping[str, Any]) -> float | Measurement:
        return latency_ms(params)

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> "FakePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class PoolFactory:
    """Stands in for ``tuner.api._open_pool``: hands out ``queued`` pools first, then fresh
    FakePools, and keeps every pool it handed out in ``used``."""

    def __init__(self) -> None:
        self.queued: list[FakePool] = []
        self.used: list[FakePool] = []

    def __call__(self, fam: KernelFamily, problem: Problem, where: Any = None) -> FakePool:
        pool = self.queued.pop(0) if self.queued else FakePool()
        self.used.append(pool)
        return pool


def no_ray(address: str | None, replay: Any, **_: Any) -> contextlib.AbstractContextManager[None]:
    """Stands in for ``tuner.api._ray`` beside a PoolFactory: FakePools need no Ray (and a
    study without Ray writes its database in-process)."""
    return contextlib.nullcontext()


def valid_configs(family: ToyFamily) -> list[dict[str, Any]]:
    problem = family.parse_problem(*PROBLEM)
    return family.valid_configs(problem, FakePool().limits)


ROOT = Path(__file__).resolve().parents[2]
# Every valid config of attention 2x8x1024x64 fp16 causal, measured on an H200 (docs/BENCHMARKS.md).
LANDSCAPE = ROOT / "templates" / "attention" / "landscapes" / "attention_2x8x1024x64-fp16-causal_h200.json"


def run_cli(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m tuner ARGV`` in a fresh process (the checkout importable, no $TUNER_DB)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TUNER_DB", None)
    return subprocess.run([sys.executable, "-m", "tuner", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# -- two GPUs of one model, the second a few percent slower ----------------------------------------
GPUS = ({"uuid": "GPU-fake-0", "index": 0, "name": DEVICE.name},
        {"uuid": "GPU-fake-1", "index": 1, "name": DEVICE.name})


def noise(key: str, gpu: int) -> float:
    """A deterministic +-0.2% wobble of one timing (the same config, GPU: the same wobble)."""
    return 1.0 + 0.002 * ((zlib.crc32(f"{key}@{gpu}".encode()) % 1001) / 500.0 - 1.0)


class TwoGpuPool(FakePool):
    """FakePool as two GPUs (``gpus=1``: one), the second ``slowdown`` slower than the first,
    drifting by +-0.2% over the study, every timing with its own +-0.2% noise. A ticket lands on
    ``gpu_of(params, ticket)`` (default: alternately). The incumbent is timed on every GPU in
    rounds, by the pool's own schedule (``workers.calibrate``); ``retime`` runs on GPU 0.
    ``latency`` is the landscape (the first GPU's times). ``drift``: the second GPU slows by that
    share more over the first ``drift_trials`` results (a GPU heating at its power cap).
    ``throttle``: every timing of GPU 1 runs up to that share slower, each its own draw (a GPU at
    its power cap, whose clocks change from one timing to the next); ``paired``: once the anchor
    is chosen, each trial is timed beside it (``workers.paired``) under the same throttle."""

    def __init__(self, *, gpus: int = 2, slowdown: float = 1.04, latency: Any = latency_ms,
                 gpu_of: Any = None, calibrate_every: int = 3, drift: float = 0.0,
                 drift_trials: int = 100, throttle: float = 0.0, paired: bool = False,
                 **options: Any) -> None:
        super().__init__(**options)
        self.drift, self.drift_trials, self.results = drift, drift_trials, 0
        self.throttle, self.paired, self._timings = throttle, paired, 0
        self.gpus = [dict(g) for g in GPUS[:gpus]]
        self.num_gpus = gpus
        self.slowdown, self.latency = slowdown, latency
        self.gpu_of = gpu_of or (lambda params, ticket: ticket % gpus)
        self.schedule = CalibrationSchedule(gpus, every=calibrate_every) if gpus > 1 else None
        self.incumbents: list[dict[str, Any]] = []  # every config set_incumbent was given
        self.calibrated = [0] * gpus  # the latest round each GPU timed
        self.timed: list[tuple[int, dict[str, Any], float]] = []  # (GPU, params, raw ms), trials
        self.calibration_log: list[tuple[int, int, dict[str, Any], float]] = []  # (round, GPU, params, ms)
        self._calibrations: list[Calibration] = []
        self._landed: dict[int, tuple[int, dict[str, Any]]] = {}
        self.retimed_on: list[int] = []

    def factor(self, gpu: int) -> float:
        """GPU ``gpu``'s time over GPU 0's now: 1, or the slowdown drifting slowly with the clock."""
        if gpu == 0:
            return 1.0
        heat = 1.0 + self.drift * min(1.0, self.results / self.drift_trials)
        return self.slowdown * heat * (1.0 + 0.002 * math.sin(self.clock.now / 40.0))

    def ms_on(self, gpu: int, params: Mapping[str, Any]) -> float:
        return self.latency(params) * self.factor(gpu) * noise(params_key(params), gpu)

    def submit(self, ticket, params, source, launch, options) -> None:
        super().submit(ticket, params, source, launch, options)
        self._landed[ticket] = (self.gpu_of(dict(params), ticket), dict(params))

    def poll(self, timeout: float) -> list[tuple[int, Measurement]]:
        results = []
        for ticket, m in super().poll(timeout):
            gpu, params = self._landed.pop(ticket)
            results.append((ticket, self._on(gpu, params, m)))
            self.results += 1
            if self.schedule is not None:
                self.schedule.counted()
        self._calibrate()
        return results

    def throttled(self, gpu: int) -> float:
        """The next timing's throttle on GPU ``gpu``: 1 on GPU 0, else 1 to 1 + ``throttle``."""
        self._timings += 1
        if gpu == 0 or not self.throttle:
            return 1.0
        return 1.0 + self.throttle * ((zlib.crc32(f"throttle {self._timings}".encode()) % 1001) / 1000.0)

    def _on(self, gpu: int, params: dict[str, Any], m: Measurement) -> Measurement:
        """``m`` as GPU ``gpu`` measured it."""
        out = replace(m, gpu=dict(self.gpus[gpu]))
        if m.ok and m.timing is not None:
            throttle = self.throttled(gpu)
            ms = self.ms_on(gpu, params) * throttle
            out = replace(out, timing=Timing(ms, ms * 0.99, ms * 1.02, ms * 0.01, 50))
            anchor = self.schedule.anchor if self.paired and self.schedule is not None else None
            if anchor is not None:
                anchor_ms = self.ms_on(gpu, anchor) * throttle
                out = replace(out, paired=Paired(anchor_ms, ms / anchor_ms, 0.004 * ms / anchor_ms, 25))
            self.timed.append((gpu, params, ms))
        return out

    def _calibrate(self) -> None:
        """Each GPU whose round is due times the round's incumbent (between two polls)."""
        for gpu in range(len(self.gpus)):
            due = self.schedule.due(self.calibrated[gpu]) if self.schedule is not None else None
            if due is None:
                continue
            number, params = due
            self.calibrated[gpu] = number
            ms = self.ms_on(gpu, params) * self.throttled(gpu)
            self.calibration_log.append((number, gpu, dict(params), ms))
            m = Measurement(ok=True, timing=Timing(ms, ms, ms, 0.0, 50), gpu=dict(self.gpus[gpu]))
            self._calibrations.append(Calibration(number, dict(params), m))

    def set_incumbent(self, params, source, launch, options) -> None:
        assert isinstance(launch, Launch) and isinstance(source, str)
        self.incumbents.append(dict(params))
        if self.schedule is not None:
            self.schedule.offer(params_key(params), dict(params))
            self.schedule.ready(params_key(params))

    def calibrations(self) -> list[Calibration]:
        out, self._calibrations = self._calibrations, []
        return out

    def retime(self, kernels, *, rounds, max_seconds) -> Retiming:
        """Every config timed on GPU 0 (the reference), at its true time."""
        retiming = super().retime(kernels, rounds=rounds, max_seconds=max_seconds)
        self.retimed_on.append(0)
        return replace(retiming, gpu=dict(self.gpus[0]))
