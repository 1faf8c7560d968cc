"""ORM rows to records: the only place that knows both sides."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from storage.models import (
    BestRow,
    Device,
    Family,
    ProblemRow,
    Retime,
    RunningTrial,
    Study,
    TemplateVersion,
    TrialRow,
)
from storage.records import (
    BestRecord,
    DeviceRecord,
    RetimeRecord,
    RunningRecord,
    StudyRecord,
    StudySummary,
    TrialRecord,
)


def device_record(device: Device) -> DeviceRecord:
    return DeviceRecord(
        id=device.id,
        name=device.name,
        sm_count=device.sm_count,
        compute_capability=device.compute_capability,
        driver_version=device.driver_version,
        cuda_version=device.cuda_version,
    )


def study_record(
    study: Study, family: Family, version: TemplateVersion, problem: ProblemRow, device: Device
) -> StudyRecord:
    return StudyRecord(
        id=study.id,
        name=study.name,
        family=family.name,
        template_hash=version.template_hash,
        space=dict(version.space),
        shape=tuple(problem.shape),
        dtype=problem.dtype,
        flags=dict(problem.flags),
        device=device_record(device),
        sampler=study.sampler,
        status=study.status,
        replay=study.replay,
        settings=dict(study.settings),
        created_at=study.created_at,
        updated_at=study.updated_at,
    )


TRIAL_FIELDS = (
    "failure reason detail registers smem_static stack_bytes spill_stores spill_loads cubin_hash toolkit "
    "compile_seconds median_ms min_ms max_ms iqr_ms repetitions tflops error max_abs_error "
    "gpu_uuid gpu_index normalized_ms gpu_ratio"
).split()


def trial_record(trial: TrialRow) -> TrialRecord:
    values: dict[str, Any] = {name: getattr(trial, name) for name in TRIAL_FIELDS}
    return TrialRecord(
        id=trial.id,
        study_id=trial.study_id,
        number=trial.number,
        params=dict(trial.params),
        status=trial.status,
        replayed=trial.replayed,
        gpu_state=None if trial.gpu_state is None else dict(trial.gpu_state),
        created_at=trial.created_at,
        **values,
    )


def trial_record_of(trial_id: int, values: Mapping[str, Any]) -> TrialRecord:
    """The record of a trial inserted from ``values`` (``storage.batches.trial_values``) under
    ``trial_id``, without reading it back."""
    fields = {name: values[name] for name in TRIAL_FIELDS}
    return TrialRecord(id=trial_id, study_id=values["study_id"], number=values["number"],
                       params=dict(values["params"]), status=values["status"], replayed=values["replayed"],
                       gpu_state=None if values["gpu_state"] is None else dict(values["gpu_state"]),
                       created_at=values["created_at"], **fields)


def running_record(running: RunningTrial) -> RunningRecord:
    return RunningRecord(
        id=running.id,
        study_id=running.study_id,
        number=running.number,
        params=dict(running.params),
        owner=running.owner,
        started_at=running.started_at,
        heartbeat_at=running.heartbeat_at,
    )


RETIME_FIELDS = (
    "retiming rank median_ms iqr_ms min_ms max_ms repetitions tflops failure reason replayed "
    "created_at"
).split()


def retime_record(retime: Retime, trial: TrialRow) -> RetimeRecord:
    values: dict[str, Any] = {name: getattr(retime, name) for name in RETIME_FIELDS}
    return RetimeRecord(
        id=retime.id,
        study_id=retime.study_id,
        trial_id=trial.id,
        trial_number=trial.number,
        search_median_ms=trial.median_ms,
        gpu_state=None if retime.gpu_state is None else dict(retime.gpu_state),
        **values,
    )


def best_record(
    best: BestRow,
    trial: TrialRow,
    study: str,
    family: str,
    template_hash: str,
    problem: ProblemRow,
    device: Device,
    retime: Retime | None = None,
) -> BestRecord:
    """The winner; its timing is the re-timed one when a re-timing made it the best."""
    assert trial.median_ms is not None  # only ok trials become best
    timed: Any = retime if retime is not None else trial
    return BestRecord(
        family=family,
        shape=tuple(problem.shape),
        dtype=problem.dtype,
        flags=dict(problem.flags),
        template_hash=template_hash,
        device=device_record(device),
        study=study,
        trial_number=trial.number,
        params=dict(trial.params),
        median_ms=best.median_ms,
        min_ms=timed.min_ms,
        max_ms=timed.max_ms,
        iqr_ms=timed.iqr_ms,
        repetitions=timed.repetitions,
        tflops=best.tflops,
        error=trial.error,
        max_abs_error=trial.max_abs_error,
        registers=trial.registers,
        smem_static=trial.smem_static,
        stack_bytes=trial.stack_bytes,
        spill_stores=trial.spill_stores,
        spill_loads=trial.spill_loads,
        cubin_hash=trial.cubin_hash,
        toolkit=trial.toolkit,
        replayed=trial.replayed,
        measured_at=trial.created_at,
        updated_at=best.updated_at,
        search_median_ms=trial.median_ms,
        retime=None if retime is None else retime_record(retime, trial),
    )


def study_summary(
    study: Study,
    family: str,
    template_hash: str,
    problem: ProblemRow,
    device_name: str,
    counts: tuple[int | None, int | None, float | None, float | None],
) -> StudySummary:
    n_trials, n_ok, best_ms, best_tflops = counts
    return StudySummary(
        id=study.id,
        name=study.name,
        family=family,
        template_hash=template_hash,
        shape=tuple(problem.shape),
        dtype=problem.dtype,
        flags=dict(problem.flags),
        device_name=device_name,
        sampler=study.sampler,
        status=study.status,
        replay=study.replay,
        n_trials=int(n_trials or 0),
        n_ok=int(n_ok or 0),
        n_failed=int(n_trials or 0) - int(n_ok or 0),
        best_median_ms=best_ms,
        best_tflops=best_tflops,
        settings=dict(study.settings),
        created_at=study.created_at,
        updated_at=study.updated_at,
    )
