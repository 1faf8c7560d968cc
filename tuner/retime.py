"""Honest winners: at the end of a study its fastest trials are timed again, interleaved on one
GPU (A B C D E A B C D E ...), and the winner is chosen by those medians::

    records = retime_study(family, problem, pool=pool, repository=repo, record=study, top=5)
    records[0].trial_number, records[0].median_ms       # the winner, now the stored best

A study's medians were taken minutes or hours apart: a kernel timed while the GPU was cool and
boosting looks faster than its equal timed later, hot. Timed round-robin, whatever drifts
falls on every candidate alike. The candidates are the ``top`` fastest ok trials with distinct
cubins; the pool re-compiles them (the cache answers) and ``GpuBench.retime`` times them; the
repository stores each one's re-timed median, spread and rank with the GPU's clocks before and
after, and points the best at the winner. A candidate that fails now is stored failed and
cannot win; the trials themselves are never changed.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from storage import RetimeEntry, ranked_ms
from templates.family import KernelFamily, Problem, TemplateError
from workers.retime import MAX_SECONDS, ROUNDS

logger = logging.getLogger("tuner")

DEFAULT_TOP = 5  # trials re-timed at the end of a study (0: none)


def candidates(trials: Sequence[Any], top: int) -> list[Any]:
    """The ``top`` fastest ok trials (``storage.TrialRecord``) with distinct cubins, fastest
    first (ties: the lower number), by ``storage.ranked_ms``: their normalized medians where
    several GPUs measured the study."""
    picked, cubins = [], set()
    def ranked(t: Any) -> tuple[float, int]:
        return ranked_ms(getattr(t, "normalized_ms", None), t.median_ms), t.number

    for trial in sorted((t for t in trials if t.ok), key=ranked):
        if trial.cubin_hash is not None and trial.cubin_hash in cubins:
            continue
        cubins.add(trial.cubin_hash)
        picked.append(trial)
        if len(picked) == top:
            break
    return picked


def retime_study(family: KernelFamily, problem: Problem, *, pool: Any, repository: Any, record: Any,
                 top: int = DEFAULT_TOP, rounds: int = ROUNDS,
                 max_seconds: float = MAX_SECONDS) -> list[Any]:
    """Re-time the study's ``top`` fastest trials and store the outcome (``storage.RetimeRecord``
    list, ranked). [] when there is nothing to re-time, or when the study's latest re-timing
    already covered exactly these trials (a resumed run that found nothing new)."""
    picked = candidates(repository.trials(record.id), top)
    if not picked:
        return []
    latest = repository.retimes(record.id)
    if {r.trial_id for r in latest} == {t.id for t in picked}:
        logger.info("top %d already re-timed (winner #%d): not again", len(picked),
                    next((r.trial_number for r in latest if r.rank == 1), picked[0].number))
        return []
    entries: dict[int, RetimeEntry] = {}
    kernels, timed = [], []
    for trial in picked:
        try:
            kernels.append((trial.params, family.render(trial.params, problem),
                            family.launch(trial.params, problem),
                            tuple(family.compile_options(trial.params, problem))))
            timed.append(trial)
        except TemplateError as error:
            entries[trial.number] = RetimeEntry(trial.number, failure="invalid", reason=f"render: {error}")
    retiming = pool.retime(kernels, rounds=rounds, max_seconds=max_seconds)
    for trial, m in zip(timed, retiming.measurements):
        entries[trial.number] = _entry(family, problem, trial.number, m)
    state = {"before": dict(retiming.clocks_before), "after": dict(retiming.clocks_after),
             "rounds": retiming.rounds}
    if retiming.gpu:  # the one GPU it ran on (with several, the reference of the normalization)
        state["gpu"] = dict(retiming.gpu)
    records = repository.record_retiming(record.id, [entries[t.number] for t in picked],
                                         gpu_state=state, replayed=retiming.replayed)
    logger.info("%s", summary(records, picked[0].number, rounds=retiming.rounds,
                              replayed=retiming.replayed))
    return records


def _entry(family: KernelFamily, problem: Problem, number: int, m: Any) -> RetimeEntry:
    """A worker's Measurement of one re-timed kernel as the repository takes it."""
    if not m.ok or m.timing is None or m.timing.median_ms <= 0:
        return RetimeEntry(number, failure=m.failure or "worker", reason=m.reason or "no timing")
    t = m.timing
    return RetimeEntry(number, median_ms=t.median_ms, iqr_ms=t.iqr_ms, min_ms=t.min_ms,
                       max_ms=t.max_ms, repetitions=t.repetitions,
                       tflops=family.tflops(problem, t.median_ms))


def summary(records: Sequence[Any], search_winner: int, *, rounds: int, replayed: bool) -> str:
    """``re-timed top 5 interleaved (30 rounds): #12 1.2340 ms (search 1.2400) ...; winner #12``."""
    how = "replayed" if replayed else f"{rounds} rounds"
    parts = []
    for r in records:
        if r.ok:
            parts.append(f"#{r.trial_number} {r.median_ms:.4f} ms (search {r.search_median_ms:.4f})")
        else:
            parts.append(f"#{r.trial_number} failed ({r.failure}: {r.reason})")
    winner = next((r for r in records if r.rank == 1), None)
    if winner is None:
        end = "every one failed; the winner stays the search's"
    elif winner.trial_number != search_winner:
        end = f"winner #{winner.trial_number} (the search's was #{search_winner})"
    else:
        end = f"winner #{winner.trial_number}"
    clocks = clock_change(records[0].gpu_state or {}) if records else ""
    gpu = (records[0].gpu_state or {}).get("gpu") if records else None
    where = ""
    if gpu and (gpu.get("index") is not None or gpu.get("uuid")):
        where = f" on GPU {gpu['index'] if gpu.get('index') is not None else gpu.get('uuid')}" + (
            f" ({gpu['uuid']})" if gpu.get("index") is not None and gpu.get("uuid") else "")
    return f"re-timed top {len(records)} interleaved{where} ({how}): {', '.join(parts)}; {end}" + (
        f" | {clocks}" if clocks else "")


def clock_change(state: dict[str, Any]) -> str:
    """``SM 1980->1755 MHz, 41->58 C`` from a re-timing's clocks before and after, or ''."""
    before, after = state.get("before") or {}, state.get("after") or {}
    shown = []
    if "sm_mhz" in before and "sm_mhz" in after:
        shown.append(f"SM {before['sm_mhz']}->{after['sm_mhz']} MHz")
    if "temperature_c" in before and "temperature_c" in after:
        shown.append(f"{before['temperature_c']}->{after['temperature_c']} C")
    return ", ".join(shown)
