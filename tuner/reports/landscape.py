"""A study's stored trials as a replay landscape (``workers.replay`` format).

    tuner.record_landscape("attention/2x8x1024x64-fp16-causal/NVIDIA-H200/69f0...", "land.json")
    tuner.tune("attention", "2,8,1024,64", "fp16", {"causal": True}, replay="land.json", trials=50)

Record an exhaustive (grid) study on a GPU once; replay it anywhere to test or compare searches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from templates.family import Problem
from tuner.errors import UsageError


def trial_measurement(trial: Any) -> Any:
    """A stored trial (``storage.TrialRecord``) as the ``workers.Measurement`` it came from;
    where several GPUs measured the study, its times in the standard's terms (scaled to its
    normalized median; a trial timed beside the anchor keeps its ratios' spread as its IQR), so
    that a landscape is one GPU's set, its values and intervals as stored."""
    from workers.results import Measurement, Resources, Timing

    resources = None
    if trial.registers is not None:
        resources = Resources(trial.registers, trial.smem_static or 0, trial.stack_bytes or 0,
                              trial.spill_stores or 0, trial.spill_loads or 0)
    common = dict(detail=trial.detail or "", resources=resources, cubin_hash=trial.cubin_hash,
                  toolkit=trial.toolkit, compile_seconds=trial.compile_seconds,
                  error=trial.error, max_abs_error=trial.max_abs_error,
                  clocks=dict(trial.gpu_state or {}))
    if not trial.ok:
        return Measurement.failed(trial.failure or "worker", trial.reason or "failed", **common)
    value = trial.ranked_ms
    f = value / trial.median_ms
    timing = Timing(value, (trial.min_ms or trial.median_ms) * f, (trial.max_ms or trial.median_ms) * f,
                    trial.ranked_iqr_ms or 0.0, trial.repetitions or 0)
    return Measurement(ok=True, timing=timing, **common)


def record_landscape(study: str, path: str | Path, *, db: str | None = None) -> Path:
    """Write every trial of ``study`` to ``path``; refuses a replayed study (copy the file)."""
    from tuner.api import show
    from workers.replay import save_landscape
    from workers.results import DeviceInfo

    detail = show(study, db=db)
    summary = detail.summary
    if summary.replay:
        raise UsageError(f"study {study!r} was itself replayed; its landscape file already exists")
    device = summary.settings.get("device")
    if not device:
        raise UsageError(f"study {study!r} did not store its device; tune it again to record it")
    entries = [(t.params, trial_measurement(t)) for t in detail.trials]
    problem = Problem(tuple(summary.shape), summary.dtype, tuple(sorted(summary.flags.items())))
    return save_landscape(path, device=DeviceInfo.from_json(device), family=summary.family,
                          problem=problem, template_hash=summary.template_hash, entries=entries)
