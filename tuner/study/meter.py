"""Where one coordinator's time goes: sampler asks, database calls, and the GPUs it keeps busy.

    meter = Meter()
    repo = meter.repository(repo)             # every Repository call counted and timed
    coordinator = Coordinator(..., repository=repo, meter=meter)   # asks timed
    meter.start(); outcome = coordinator.run(); meter.stop()
    report = meter.report(measured=outcome.measured, intervals=pool.busy_intervals(), gpus=64)
    report.busy_min, report.trials_per_s, report.asks_per_s, report.ask_ms, report.db_writes_per_s

A simulated GPU's busy share is its time measuring (:mod:`workers.simulate`) within the study's
wall time (from the coordinator's start to its end), so the study's ramp-up and its last trials
(GPUs idle while the last ones finish) count against it, as on real GPUs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

# Repository methods that write (each one transaction); the rest read.
WRITES = frozenset({"claim_trial", "claim_trials", "record_trial", "record_trials", "renew_leases",
                    "leave_trial", "drop_trial", "set_study_status", "open_study", "record_retiming"})


@dataclass(frozen=True)
class ThroughputReport:
    """What one study's coordinator did, per second of its wall time."""

    wall_s: float
    gpus: int
    measured: int
    trials_per_s: float
    asks: int
    asks_per_s: float
    ask_ms: float  # mean sampler time of one ask (Optuna's ask, the sampler's proposal)
    tells: int
    tell_ms: float
    db_calls: dict[str, tuple[int, float]]  # Repository method -> (calls, seconds)
    db_writes: int
    db_writes_per_s: float
    db_ms_per_trial: float  # every Repository call's time, per measured trial
    busy: tuple[float, ...] = ()  # each simulated GPU's busy share of the wall
    busy_steady: tuple[float, ...] = ()  # each one's share of the steady state (workers.simulate.steady_window)
    steady_s: float = 0.0  # that window's length
    simulator_cpu_s: float = 0.0
    simulator_late_ms: float = 0.0  # mean overrun of a simulated GPU's sleep (machine too busy)
    cpu_s: float = 0.0  # the coordinator process's CPU time (its threads: Ray's driver, the database's client)
    gpu_s_per_trial: float = 0.0  # mean simulated GPU time of a measured trial

    @property
    def cpu_ms_per_trial(self) -> float:
        return 1e3 * self.cpu_s / max(self.measured, 1)

    @property
    def gpus_one_core_feeds(self) -> float:
        """GPUs this coordinator would keep busy with a core of its own: its trials a second
        on one core (1 / CPU time a trial) times a trial's GPU time. An estimate that a busy
        machine does not skew; the database server's own CPU is not counted."""
        return self.gpu_s_per_trial / (self.cpu_s / self.measured) if self.measured and self.cpu_s else 0.0

    @property
    def busy_min(self) -> float:
        return min(self.busy) if self.busy else 0.0

    @property
    def busy_mean(self) -> float:
        return statistics.fmean(self.busy) if self.busy else 0.0

    @property
    def busy_steady_mean(self) -> float:
        return statistics.fmean(self.busy_steady) if self.busy_steady else 0.0

    @property
    def busy_median(self) -> float:
        return statistics.median(self.busy) if self.busy else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 4), "gpus": self.gpus, "measured": self.measured,
            "trials_per_s": round(self.trials_per_s, 2), "asks": self.asks,
            "asks_per_s": round(self.asks_per_s, 2), "ask_ms": round(self.ask_ms, 3),
            "tells": self.tells, "tell_ms": round(self.tell_ms, 3),
            "db_writes": self.db_writes, "db_writes_per_s": round(self.db_writes_per_s, 2),
            "db_ms_per_trial": round(self.db_ms_per_trial, 3),
            "db_calls": {k: [n, round(s, 4)] for k, (n, s) in sorted(self.db_calls.items())},
            "busy_min": round(self.busy_min, 4), "busy_mean": round(self.busy_mean, 4),
            "busy_median": round(self.busy_median, 4),
            "busy_steady_mean": round(self.busy_steady_mean, 4), "steady_s": round(self.steady_s, 4),
            "simulator_cpu_s": round(self.simulator_cpu_s, 2),
            "simulator_late_ms": round(self.simulator_late_ms, 3),
            "cpu_s": round(self.cpu_s, 3), "cpu_ms_per_trial": round(self.cpu_ms_per_trial, 3),
            "gpu_ms_per_trial": round(1e3 * self.gpu_s_per_trial, 3),
            "gpus_one_core_feeds": round(self.gpus_one_core_feeds, 1),
        }


@dataclass
class Meter:
    """Counters a coordinator and its repository feed; cheap enough to keep on always."""

    clock: Callable[[], float] = time.monotonic
    asks: int = 0
    ask_s: float = 0.0
    tells: int = 0
    tell_s: float = 0.0
    db: dict[str, list[float]] = field(default_factory=dict)  # method -> [calls, seconds]
    started: float | None = None
    stopped: float | None = None
    cpu_started: float = 0.0
    cpu_stopped: float | None = None

    def start(self) -> None:
        self.started = self.clock()
        self.cpu_started = time.process_time()

    def stop(self) -> None:
        self.stopped = self.clock()
        self.cpu_stopped = time.process_time()

    def asked(self, seconds: float, count: int = 1) -> None:
        self.asks += count
        self.ask_s += seconds

    def told(self, seconds: float, count: int = 1) -> None:
        self.tells += count
        self.tell_s += seconds

    def repository(self, repository: Any) -> "MeteredRepository":
        return MeteredRepository(repository, self)

    def report(self, *, measured: int, gpus: int = 0,
               intervals: Sequence[tuple[int, float, float]] = (), simulator_cpu_s: float = 0.0,
               lateness: Sequence[float] = ()) -> ThroughputReport:
        from workers.simulate import busy_shares, steady_window  # plain Python: no Ray, no CUDA

        start = self.started if self.started is not None else 0.0
        end = self.stopped if self.stopped is not None else self.clock()
        wall = max(end - start, 1e-9)
        writes = int(sum(n for name, (n, _) in self.db.items() if name in WRITES))
        db_s = sum(s for _, s in self.db.values())
        busy = tuple(busy_shares(list(intervals), gpus, start, end)) if gpus and intervals else ()
        steady = steady_window(list(intervals), gpus) if gpus and intervals else None
        busy_steady = tuple(busy_shares(list(intervals), gpus, *steady)) if steady else ()
        return ThroughputReport(
            wall_s=wall, gpus=gpus, measured=measured, trials_per_s=measured / wall,
            asks=self.asks, asks_per_s=self.asks / wall, ask_ms=1e3 * self.ask_s / max(self.asks, 1),
            tells=self.tells, tell_ms=1e3 * self.tell_s / max(self.tells, 1),
            db_calls={k: (int(n), s) for k, (n, s) in self.db.items()}, db_writes=writes,
            db_writes_per_s=writes / wall, db_ms_per_trial=1e3 * db_s / max(measured, 1),
            busy=busy, busy_steady=busy_steady, steady_s=steady[1] - steady[0] if steady else 0.0,
            simulator_cpu_s=simulator_cpu_s,
            simulator_late_ms=1e3 * statistics.fmean(lateness) if lateness else 0.0,
            cpu_s=(self.cpu_stopped if self.cpu_stopped is not None else time.process_time()) - self.cpu_started,
            gpu_s_per_trial=sum(b - a for _, a, b in intervals) / max(len(intervals), 1),
        )


class MeteredRepository:
    """A ``storage.Repository`` whose every method call is counted and timed by a :class:`Meter`."""

    def __init__(self, repository: Any, meter: Meter) -> None:
        self._repository, self._meter = repository, meter

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._repository, name)
        if not callable(value) or name.startswith("_"):
            return value
        counts = self._meter.db.setdefault(name, [0, 0.0])

        def metered(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                counts[0] += 1
                counts[1] += time.perf_counter() - began

        return metered
