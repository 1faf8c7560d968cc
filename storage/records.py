"""Plain values returned by :class:`storage.Repository`; never ORM objects.

They are frozen and free of database handles, so they can be logged, pickled and compared::

    from storage import open_repository, params_key

    repo = open_repository("sqlite:///tuner.db")
    done = repo.measured(study.id)           # {params_key(params): TrialRecord}
    if params_key(params) in done: ...
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from storage import ranking

STUDY_STATUSES = ("running", "finished", "interrupted")
TRIAL_STATUSES = ("ok", "failed")
# A running trial is its config's lease: its owner renews it every LEASE_RENEW_S while it
# measures; one not renewed for LEASE_TTL_S is stale (its coordinator was killed or hangs).
LEASE_RENEW_S = 10.0
LEASE_TTL_S = 60.0


def params_key(params: Mapping[str, Any]) -> str:
    """The canonical text of a parameter set: equal configs give equal keys, whatever the order
    (a value JSON has no type for is written as its ``str``). The one key of a config: the
    database finds it by it, a replay landscape looks it up by it, the pool drops repeats by it."""
    return json.dumps(dict(params), sort_keys=True, default=str)


def config_key(params: Mapping[str, Any]) -> str:
    """The key a config is leased and found by in the database: the SHA-256 of its
    :func:`params_key`."""
    return hashlib.sha256(params_key(params).encode()).hexdigest()


@dataclass(frozen=True)
class DeviceRecord:
    """A GPU model, driver and toolkit: measurements are only comparable on the same one."""

    id: int
    name: str
    sm_count: int
    compute_capability: str  # "9.0"
    driver_version: str
    cuda_version: str


@dataclass(frozen=True)
class StudySpec:
    """What a study is opened with (``Repository.open_study``): its family and template version
    (``template_hash``, the ``space``), its problem (``shape``, ``dtype``, ``flags``), its
    ``device`` (the keys name, sm_count, compute_capability, driver_version and cuda_version;
    others, a DeviceInfo's uuid or clocks, are ignored), its ``sampler``, whether it is a
    ``replay`` and the ``settings`` it was started with."""

    family: str
    template_hash: str
    space: Mapping[str, Any]
    shape: Sequence[int]
    dtype: str
    flags: Mapping[str, Any]
    device: Mapping[str, Any]
    sampler: str
    replay: bool
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class StudyRecord:
    """One tuning run (also the name of its Optuna study)."""

    id: int
    name: str
    family: str
    template_hash: str
    space: dict[str, Any]
    shape: tuple[int, ...]
    dtype: str
    flags: dict[str, Any]  # the family's problem flags
    device: DeviceRecord
    sampler: str
    status: str  # one of STUDY_STATUSES
    replay: bool
    settings: dict[str, Any]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class TrialOutcome:
    """What a trial came to, as ``Repository.record_trial`` stores it beside its number and
    params: ok with its timing, or failed with a failure kind and a one-line reason; what ptxas
    said of the kernel; the GPU's clocks and temperature as read for it."""

    status: str  # one of TRIAL_STATUSES
    failure: str | None = None
    reason: str | None = None
    detail: str = ""
    registers: int | None = None
    smem_static: int | None = None
    stack_bytes: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    cubin_hash: str | None = None
    toolkit: str | None = None
    compile_seconds: float | None = None
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    iqr_ms: float | None = None
    repetitions: int | None = None
    tflops: float | None = None
    error: float | None = None
    max_abs_error: float | None = None
    replayed: bool = False
    gpu_state: dict[str, Any] | None = None  # {"name", "before": clocks, "after": clocks}
    gpu_uuid: str | None = None  # the GPU that measured it
    gpu_index: int | None = None
    # with several GPUs: median_ms times the GPU's ratio to the reference GPU (gpu_ratio)
    normalized_ms: float | None = None
    gpu_ratio: float | None = None


@dataclass(frozen=True)
class TrialRecord:
    """One measured (or failed) configuration of a study."""

    id: int
    study_id: int
    number: int  # the Optuna trial number
    params: dict[str, Any]
    status: str  # "ok" | "failed"
    failure: str | None
    reason: str | None
    detail: str
    registers: int | None
    smem_static: int | None
    stack_bytes: int | None
    spill_stores: int | None
    spill_loads: int | None
    cubin_hash: str | None
    toolkit: str | None
    compile_seconds: float | None
    median_ms: float | None
    min_ms: float | None
    max_ms: float | None
    iqr_ms: float | None
    repetitions: int | None
    tflops: float | None
    error: float | None
    max_abs_error: float | None
    replayed: bool
    gpu_state: dict[str, Any] | None
    created_at: datetime
    gpu_uuid: str | None = None  # the GPU that measured it (None: not recorded)
    gpu_index: int | None = None
    normalized_ms: float | None = None  # its median on the reference GPU (several GPUs)
    gpu_ratio: float | None = None  # the ratio of its GPU to the reference used for that

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def key(self) -> str:
        return params_key(self.params)

    @property
    def ranked_ms(self) -> float | None:
        """What trials are compared by (:func:`storage.ranking.ranked_ms`)."""
        return ranking.ranked_ms(self.normalized_ms, self.median_ms)

    @property
    def interval_ms(self) -> float | None:
        """The half-width of :attr:`ranked_ms`'s interval (:func:`storage.ranking.interval_ms`):
        its repetitions' spread, scaled as it is, and the anchor's drift around it where several
        GPUs measured the study; timed beside the anchor (``workers.paired``), the spread of its
        ratios to the anchor's instead."""
        value = self.ranked_ms
        if value is None or not self.median_ms:
            return None
        drift = None if self.paired else (self.gpu_state or {}).get("anchor_spread")
        return ranking.interval_ms(value, self.ranked_iqr_ms, self.repetitions, drift=drift)

    @property
    def paired(self) -> bool:
        """Whether it was timed beside the anchor (``workers.paired``) and normalized by that."""
        state = self.gpu_state or {}
        return (self.normalized_ms is not None and bool(state.get("anchor_ratio"))
                and state.get("anchor_ratio_iqr") is not None)

    @property
    def ranked_iqr_ms(self) -> float | None:
        """The spread of :attr:`ranked_ms`, in its terms: timed beside the anchor, the IQR of its
        ratios to the anchor's (the noise of the ratio it is ranked by); else its repetitions'
        IQR, scaled as the median is."""
        value = self.ranked_ms
        if value is None or not self.median_ms:
            return None
        if self.paired:
            state = self.gpu_state or {}
            return state["anchor_ratio_iqr"] * value / state["anchor_ratio"]
        return self.iqr_ms * value / self.median_ms if self.iqr_ms is not None else None


@dataclass(frozen=True)
class RunningRecord:
    """A trial sent to a GPU and not measured yet (or left by a run that stopped before)."""

    id: int
    study_id: int
    number: int
    params: dict[str, Any]
    owner: str | None  # host:pid of the coordinator measuring it; None: to be measured again
    started_at: datetime
    heartbeat_at: datetime | None = None  # the owner's last renewal of the lease

    @property
    def key(self) -> str:
        return params_key(self.params)


@dataclass(frozen=True)
class RetimeEntry:
    """One trial's outcome in a re-timing, as :meth:`Repository.record_retiming` takes it: the
    timing of its interleaved rounds, or why it could not be re-timed."""

    number: int  # the trial's number in the study
    median_ms: float | None = None
    iqr_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    repetitions: int | None = None
    tflops: float | None = None
    failure: str | None = None  # a failure kind when it could not be re-timed
    reason: str | None = None


@dataclass(frozen=True)
class RetimeRecord:
    """One trial in a re-timing of its study's fastest trials (interleaved on one GPU)."""

    id: int
    study_id: int
    retiming: int  # 1 for the study's first re-timing, 2 for the next, ...
    trial_id: int
    trial_number: int
    rank: int | None  # by re-timed median: 1 is the winner; None when it failed
    median_ms: float | None
    iqr_ms: float | None
    min_ms: float | None
    max_ms: float | None
    repetitions: int | None
    tflops: float | None
    search_median_ms: float | None  # the trial's median when the search measured it
    failure: str | None
    reason: str | None
    replayed: bool
    gpu_state: dict[str, Any] | None  # {"before": clocks, "after": clocks, "rounds": n}
    created_at: datetime

    @property
    def interval_ms(self) -> float | None:
        """The half-width of the re-timed median's interval (:func:`storage.ranking.interval_ms`)."""
        return ranking.interval_ms(self.median_ms, self.iqr_ms, self.repetitions, floor=ranking.RETIMED_FLOOR)

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class BestRecord:
    """The fastest validated configuration stored for a problem (the winner ``best`` returns).

    When a re-timing chose it, ``median_ms`` and its spread (min, max, IQR, repetitions, TFLOPS)
    are the re-timed ones and ``retime`` tells the rest; ``search_median_ms`` is always the
    trial's median as the search measured it.
    """

    family: str
    shape: tuple[int, ...]
    dtype: str
    flags: dict[str, Any]  # the family's problem flags
    template_hash: str
    device: DeviceRecord
    study: str  # the study's name
    trial_number: int
    params: dict[str, Any]
    median_ms: float
    min_ms: float | None
    max_ms: float | None
    iqr_ms: float | None
    repetitions: int | None
    tflops: float | None
    error: float | None
    max_abs_error: float | None
    registers: int | None
    smem_static: int | None
    stack_bytes: int | None
    spill_stores: int | None
    spill_loads: int | None
    cubin_hash: str | None
    toolkit: str | None
    replayed: bool
    measured_at: datetime  # when the winning trial was recorded
    updated_at: datetime  # when it became the best
    search_median_ms: float
    retime: RetimeRecord | None = None  # the re-timing that made it the best, if one did

    @property
    def interval_ms(self) -> float | None:
        """The half-width of :attr:`median_ms`'s interval (:func:`storage.ranking.interval_ms`):
        re-timed interleaved, its rounds' spread; else the search's timing's."""
        floor = ranking.RETIMED_FLOOR if self.retime is not None else ranking.SEARCH_FLOOR
        return ranking.interval_ms(self.median_ms, self.iqr_ms, self.repetitions, floor=floor)


@dataclass(frozen=True)
class StudySummary:
    """One line of ``tuner studies``: a study and the counts of its trials."""

    id: int
    name: str
    family: str
    template_hash: str
    shape: tuple[int, ...]
    dtype: str
    flags: dict[str, Any]  # the family's problem flags
    device_name: str
    sampler: str
    status: str
    replay: bool
    n_trials: int
    n_ok: int
    n_failed: int
    best_median_ms: float | None
    best_tflops: float | None
    settings: dict[str, Any]
    created_at: datetime
    updated_at: datetime
