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

Winners are chosen to a stated confidence: each re-timed median has an interval
(``storage.ranking.interval_ms``). Where the leader's overlaps others', the leader and those are
re-timed again, interleaved, up to ``TIE_ROUNDS`` more times (each as long as the first, at most
``max_seconds``), the medians of all their re-timings kept; those still within the leader's
noise then are a tie, broken by fewer registers, then less static shared memory, then the simpler
config (more parameters at the family's first choice), then the median. The log line says what
was tied, how it was broken and how long the extra rounds took.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Sequence

from storage import RETIMED_FLOOR, RetimeEntry, interval_ms, ranked_ms, tied
from templates.family import KernelFamily, Problem, TemplateError
from workers.retime import MAX_SECONDS, ROUNDS

logger = logging.getLogger("tuner")

DEFAULT_TOP = 5  # trials re-timed at the end of a study (0: none)
TIE_ROUNDS = 2  # re-timings again of the configs within the leader's noise, at most
NOISE_FACTOR = 3  # candidates past the top still within the leader's noise: up to this many times top


def candidates(trials: Sequence[Any], top: int) -> list[Any]:
    """The ``top`` fastest ok trials (``storage.TrialRecord``) with distinct cubins, fastest
    first (ties: the lower number), by ``storage.ranked_ms``: their normalized medians where
    several GPUs measured the study; then those further down still within the leader's noise
    (their intervals overlap, ``storage.ranking.tied``), up to ``NOISE_FACTOR`` times ``top``
    in all: the re-timing grows with the noise."""
    picked, cubins = [], set()

    def ranked(t: Any) -> tuple[float, int]:
        return ranked_ms(getattr(t, "normalized_ms", None), t.median_ms), t.number

    def interval(t: Any) -> float | None:
        return getattr(t, "interval_ms", None)

    for trial in sorted((t for t in trials if t.ok), key=ranked):
        if trial.cubin_hash is not None and trial.cubin_hash in cubins:
            continue
        if len(picked) >= top:
            lead = picked[0]
            if len(picked) >= NOISE_FACTOR * top or not tied(ranked(lead)[0], interval(lead),
                                                             ranked(trial)[0], interval(trial)):
                break
        cubins.add(trial.cubin_hash)
        picked.append(trial)
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
    by_number = {t.number: (t, k) for t, k in zip(timed, kernels)}
    decided = _decide(family, problem, pool, entries, by_number,
                      _Again(rounds, max_seconds, retiming.replayed))
    state = {"before": dict(retiming.clocks_before), "after": dict(retiming.clocks_after),
             "rounds": retiming.rounds, **decided.state()}
    if retiming.gpu:  # the one GPU it ran on (with several, the reference of the normalization)
        state["gpu"] = dict(retiming.gpu)
    records = repository.record_retiming(record.id, [entries[t.number] for t in picked],
                                         gpu_state=state, replayed=retiming.replayed,
                                         order=decided.order or None)
    logger.info("%s", summary(records, picked[0].number, rounds=retiming.rounds,
                              replayed=retiming.replayed))
    if decided.tied:
        logger.info("%s", decided.text())
    return records


class _Decision:
    """How the re-timing's winner was chosen: the ok entries' order, best first; the trials tied
    with the leader within the noise (the leader first) and what broke the tie; the extra rounds'
    seconds."""

    def __init__(self, order: list[int], tied: list[int], broken_by: str, seconds: float, again: int) -> None:
        self.order, self.tied, self.broken_by, self.seconds, self.again = order, tied, broken_by, seconds, again

    def state(self) -> dict[str, Any]:
        """What the re-timing stores of it (nothing where the leader stood apart at once)."""
        out: dict[str, Any] = {}
        if self.again:
            out.update(tie_retimings=self.again, tie_seconds=round(self.seconds, 3))
        if self.tied:
            out.update(tied=self.tied, tie_broken_by=self.broken_by)
        return out

    def text(self) -> str:
        return (f"within the noise of each other after {self.again} more re-timing(s) ({self.seconds:.1f} s): "
                f"{', '.join(f'#{n}' for n in self.tied)}; winner #{self.tied[0]} by {self.broken_by}")


class _Again:
    """How the close entries are re-timed again: as the first re-timing (``rounds``,
    ``max_seconds``); not at all where it was replayed (a landscape answers the same)."""

    def __init__(self, rounds: int, max_seconds: float, replayed: bool) -> None:
        self.rounds, self.max_seconds, self.replayed = rounds, max_seconds, replayed


def _decide(family: KernelFamily, problem: Problem, pool: Any, entries: dict[int, RetimeEntry],
            by_number: dict[int, Any], how: _Again) -> _Decision:
    """Re-time the entries within the leader's noise again (:data:`TIE_ROUNDS` times at most),
    updating ``entries`` with the median of their re-timings; then the order, ties broken."""
    began, again = time.monotonic(), 0
    medians = {n: [e.median_ms] for n, e in entries.items() if e.failure is None}
    while True:
        ranked = sorted(medians, key=lambda n: (entries[n].median_ms, n))
        if not ranked:
            return _Decision([], [], "", 0.0, 0)
        close = _within_noise(entries, ranked)
        if len(close) < 2 or again >= TIE_ROUNDS or how.replayed:
            break
        redo = pool.retime([by_number[n][1] for n in close], rounds=how.rounds, max_seconds=how.max_seconds)
        if not all(m.ok and m.timing is not None for m in redo.measurements):
            break  # a failure now: the first re-timing's numbers stand
        again += 1
        for n, m in zip(close, redo.measurements):
            medians[n].append(m.timing.median_ms)
            e = entries[n]
            median = statistics.median(medians[n])
            entries[n] = RetimeEntry(n, median_ms=median, iqr_ms=m.timing.iqr_ms,
                                     min_ms=min(e.min_ms or m.timing.min_ms, m.timing.min_ms),
                                     max_ms=max(e.max_ms or m.timing.max_ms, m.timing.max_ms),
                                     repetitions=(e.repetitions or 0) + m.timing.repetitions,
                                     tflops=family.tflops(problem, median))
    close = _within_noise(entries, ranked)
    if len(close) < 2:
        return _Decision(ranked, [], "", time.monotonic() - began, again)
    key, how = _tie_break(family, close, by_number, entries)
    winners = sorted(close, key=key)
    order = winners + [n for n in ranked if n not in close]
    return _Decision(order, winners, how, time.monotonic() - began, again)


def _within_noise(entries: dict[int, RetimeEntry], ranked: list[int]) -> list[int]:
    """The leader and the entries within its noise (their intervals overlap), in ranked order."""
    def interval(n: int) -> float | None:
        e = entries[n]
        return interval_ms(e.median_ms, e.iqr_ms, e.repetitions, floor=RETIMED_FLOOR)

    lead = ranked[0]
    return [lead] + [n for n in ranked[1:] if tied(entries[lead].median_ms, interval(lead),
                                                       entries[n].median_ms, interval(n))]


def _tie_break(family: KernelFamily, close: list[int], by_number: dict[int, Any],
               entries: dict[int, RetimeEntry]) -> tuple[Any, str]:
    """The sort key among tied trials, and what decided it: fewer registers, less static shared
    memory, the simpler config (more parameters at the family's first choice), the median."""
    first = {p.name: p.choices[0] for p in family.params}

    def key(n: int) -> tuple[Any, ...]:
        trial = by_number[n][0]
        plain = sum(1 for name, value in trial.params.items() if first.get(name) == value)
        return (trial.registers if trial.registers is not None else 1 << 30,
                trial.smem_static if trial.smem_static is not None else 1 << 40,
                -plain, entries[n].median_ms, n)

    keys = [key(n) for n in close]
    names = ("registers", "static shared memory", "the simpler config", "the median")
    for i, name in enumerate(names):
        if len({k[i] for k in keys}) > 1:
            return key, name
    return key, "the trial number"


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
