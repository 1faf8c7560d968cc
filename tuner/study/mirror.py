"""The sampler's study in memory; the study's trials in our tables, their one record.

A study asks several configs for each one it measures (the others the family rejects, or they
were measured before), and an ask of Optuna's in-memory study takes under 10 ms, so the sampler
works on an in-memory Optuna study. Only configs that go to the GPU reach the database: a
running trial (``Repository.claim_trial``) that becomes the measured one
(``Repository.record_trial``). The memory study is rebuilt from the stored trials when a study
resumes, and takes in those that other coordinators sharing it (PostgreSQL) store::

    mirror = MirroredStudy(repo, study.id, space, sampler, owner="host:pid")
    mirror.sync(force=True)                       # the stored trials, into memory
    mirror.enqueue(params)                        # asked before anything the sampler proposes
    proposal = mirror.ask(space.distributions)    # in memory
    mirror.tell(proposal, float("inf"))           # rejected: in memory only
    mirror.repeated(proposal)                     # measured before: FAIL in memory
    number = mirror.record(proposal, params, limit=200)  # going to the GPU: its config's lease
    mirror.renew()                                # the leases renewed, every LEASE_RENEW_S
    mirror.finish(proposal, 0.0213, params, outcome)  # told in memory, stored in place of the running one
    mirror.abandon(proposal)                      # never measured: left to the next run

``sync`` reads the stored and running trials at most every ``sync_interval_s`` (the stored ones
by number: those the memory lacks). ``record``
raises ``storage.ClaimRefused`` where the config's lease is not granted (measured, held by
another coordinator, or the study's trial count reached), and ``finish`` where it was lost.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import Trial, TrialState

from storage import LEASE_RENEW_S, ClaimRefused, ranked_ms
from tuner.study import search
from tuner.study.options import DEFAULT_LOOP, LoopOptions

SYNC_INTERVAL_S = 5.0


@dataclass
class Proposal:
    """One asked config: its in-memory trial and, once recorded, its stored trial's number. A
    config proposed outside Optuna's ask (a batch: :mod:`tuner.study.batchtpe`) has no trial but its
    ``encoded`` params; told, it joins :meth:`MirroredStudy.observed` alone (adding it to the
    memory study cost 1 ms a trial, and the batch proposer reads the observations only)."""

    trial: Trial | None
    number: int | None = None
    encoded: dict[str, Any] | None = None
    checked: bool = False  # drawn from the family's valid configs: its check would pass

    @property
    def params(self) -> dict[str, Any]:
        return self.trial.params if self.trial is not None else dict(self.encoded or {})


@dataclass(frozen=True)
class Synced:
    """What :meth:`MirroredStudy.sync` read: ``storage.TrialRecord`` and ``RunningRecord``."""

    finished: tuple[Any, ...] = ()  # stored trials newly taken into memory (earlier runs, others)
    running: tuple[Any, ...] = ()  # trials other coordinators measure now


def objective(trial: Any) -> float:
    """What the sampler is told of a stored trial: its median (normalized to the reference GPU
    where several GPUs measured the study), or ``inf`` when it failed."""
    ms = ranked_ms(getattr(trial, "normalized_ms", None), trial.median_ms)
    ok = trial.status == "ok" and ms is not None and math.isfinite(ms)
    return float(ms) if ok else search.FAILED_VALUE


class MirroredStudy:
    def __init__(self, repository: Any, study_id: int, space: search.SearchSpace,
                 sampler: optuna.samplers.BaseSampler, *, owner: str | None = None,
                 sync_interval_s: float = SYNC_INTERVAL_S, loop: LoopOptions = DEFAULT_LOOP) -> None:
        """``owner``: who measures the trials this records (``search.owner_id()``); ``loop``:
        its ``clock`` (None: time.monotonic) and its ``meter`` (a :class:`tuner.study.meter.Meter`
        that times the sampler's asks and tells)."""
        self.repository, self.study_id, self.space, self.owner = repository, study_id, space, owner
        self.meter = loop.meter
        clock = loop.clock or time.monotonic
        self._observed: list[tuple[dict[str, Any], float]] = []  # see observed()
        self.memory = search.memory_study(sampler)
        self._taken: set[int] = set()  # stored trial numbers the memory study holds
        self._mine: set[int] = set()  # running trials this mirror recorded
        self._interval, self._clock = sync_interval_s, clock
        self._last_sync = self._last_renew = -math.inf
        self._waiting = 0  # configs enqueued and not asked yet (Optuna's ask takes them first)

    @property
    def sampler(self) -> optuna.samplers.BaseSampler:
        return self.memory.sampler

    def enqueue(self, params: Mapping[str, Any]) -> None:
        """Ask ``params`` (decoded, of the space) before anything the sampler proposes."""
        self.memory.enqueue_trial(self.space.encode(params))
        self._waiting += 1

    def ask(self, distributions: Mapping[str, BaseDistribution]) -> Proposal:
        """The sampler's proposal, or the first config enqueued and not asked yet."""
        self._waiting = max(0, self._waiting - 1)
        if self.meter is None:
            return Proposal(self.memory.ask(dict(distributions)))
        began = time.perf_counter()
        proposal = Proposal(self.memory.ask(dict(distributions)))
        self.meter.asked(time.perf_counter() - began)
        return proposal

    def proposed(self, encoded: Mapping[str, Any], *, checked: bool = False) -> Proposal:
        """A config (as Optuna holds it) proposed outside the sampler's ask: no trial in the memory
        study (Optuna's ask and tell cost 1 ms a config); told, it joins :meth:`observed`.
        ``checked``: drawn from the family's valid configs."""
        return Proposal(None, encoded=dict(encoded), checked=checked)

    def _tell(self, trial: Trial | Proposal | None, value: float | None = None,
              state: TrialState | None = None) -> None:
        began = time.perf_counter()
        if isinstance(trial, Proposal):  # asked outside Optuna: its proposer reads observed()
            if value is not None and state is None:
                self._observed.append((trial.params, float(value)))
        else:
            self.memory.tell(trial, value, state=state, skip_if_finished=True)
            if value is not None and state is None:
                self._observed.append((trial.params, float(value)))
        if self.meter is not None:
            self.meter.told(time.perf_counter() - began)

    def record(self, proposal: Proposal, params: Mapping[str, Any], *, limit: int | None = None) -> int:
        """A running trial of ``params`` (the proposal, decoded) in the database, the lease of
        its config: its number. ``limit``: the study's trial count, measured and running."""
        proposal.number = self.repository.claim_trial(self.study_id, params, owner=self.owner, limit=limit)
        self._mine.add(proposal.number)
        return proposal.number

    def record_many(self, items: Sequence[tuple[Proposal, Mapping[str, Any]]], *,
                    limit: int | None = None) -> list[int | ClaimRefused]:
        """:meth:`record` for many proposals, their leases claimed in one transaction
        (``Repository.claim_trials``): each one's number, or why its lease was refused."""
        if not items:
            return []
        granted = self.repository.claim_trials(self.study_id, [params for _, params in items],
                                               owner=self.owner, limit=limit)
        for (proposal, _), number in zip(items, granted):
            if not isinstance(number, ClaimRefused):
                proposal.number = number
                self._mine.add(number)
        return granted

    def waiting(self) -> int:
        """Configs enqueued and not asked yet (they come before the sampler's proposals): counted
        as they are enqueued and asked (Optuna would list the memory study's trials, all of a
        resumed study's, at each batch)."""
        return self._waiting

    def observed(self) -> list[tuple[dict[str, Any], float]]:
        """Every config told with a value, by the sampler's asks, outside them (a batch's
        proposals: not in the memory study, whose sampler a batch does not ask) or from the
        stored trials: (params as Optuna holds them, value)."""
        return list(self._observed)

    def renew(self, force: bool = False) -> None:
        """Renew the leases of the trials this mirror recorded, at most every ``LEASE_RENEW_S``."""
        now = self._clock()
        if self.owner is None or not self._mine or (not force and now - self._last_renew < LEASE_RENEW_S):
            return
        self._last_renew = now
        self.repository.renew_leases(self.study_id, self.owner)

    def tell(self, proposal: Proposal, value: float) -> None:
        """Tell the sampler alone (a config the family rejected)."""
        self._tell(proposal.trial if proposal.trial is not None else proposal, value)

    def repeated(self, proposal: Proposal) -> None:
        """A config measured before, asked again: FAIL in memory, so that the sampler's data
        holds each config once. Told their value, the repeats of a study's best configs crowded
        TPE's density of good trials with copies, and it proposed them ever more often: a
        300-trial study asked 1,069 times, each ask slower than the last (10 ms in the first
        quarter, 27 in the last)."""
        self._tell(proposal.trial if proposal.trial is not None else proposal, state=TrialState.FAIL)

    def finish(self, proposal: Proposal, value: float, params: Mapping[str, Any], outcome: Any) -> Any:
        """A measured result: told to the sampler, then stored in place of the running trial
        (``Repository.record_trial``: ``outcome`` a ``storage.TrialOutcome``, under its number);
        returns the stored ``storage.TrialRecord``."""
        if proposal.number is None:
            raise ValueError("finish takes a recorded proposal")
        self._tell(proposal.trial if proposal.trial is not None else proposal, value)
        self._mine.discard(proposal.number)
        stored = self.repository.record_trial(self.study_id, proposal.number, params, outcome, owner=self.owner)
        self._taken.add(proposal.number)
        return stored

    def finish_many(self, items: Sequence[tuple[Proposal, float, Mapping[str, Any], Any]]) -> list[Any]:
        """:meth:`finish` for many results (proposal, value, params, outcome), stored in one
        transaction (``Repository.record_trials``): each one's ``storage.TrialRecord``, or
        ``ClaimRefused`` where its lease was lost (nothing stored for it)."""
        if not items:
            return []
        for proposal, value, _, _ in items:
            if proposal.number is None:
                raise ValueError("finish takes a recorded proposal")
            self._tell(proposal.trial if proposal.trial is not None else proposal, value)
            self._mine.discard(proposal.number)
        stored = self.repository.record_trials(
            self.study_id, [(p.number, params, outcome) for p, _, params, outcome in items], owner=self.owner)
        for (proposal, _, _, _), record in zip(items, stored):
            if not isinstance(record, ClaimRefused):
                self._taken.add(proposal.number)
        return stored

    def abandon(self, proposal: Proposal) -> None:
        """Never to be told by this run: FAIL in memory; its running trial is left without an
        owner, for the next run to measure first."""
        self._tell(proposal.trial if proposal.trial is not None else proposal, state=TrialState.FAIL)
        if proposal.number is not None and proposal.number in self._mine:
            self.repository.leave_trial(self.study_id, proposal.number)
            self._mine.discard(proposal.number)

    def drop(self, proposal: Proposal) -> None:
        """Never to be told, nor asked again (another coordinator measures it): FAIL in memory,
        its running trial (if any) forgotten."""
        self._tell(proposal.trial if proposal.trial is not None else proposal, state=TrialState.FAIL)
        if proposal.number is not None and proposal.number in self._mine:
            self.repository.drop_trial(self.study_id, proposal.number)
            self._mine.discard(proposal.number)

    def _untaken(self) -> list[Any]:
        """The stored trials the memory study lacks (and perhaps some it holds): their numbers
        read first, then those trials alone, where most are held already."""
        if not self._taken:
            return self.repository.trials(self.study_id)
        new = [n for n in self.repository.trial_numbers(self.study_id) if n not in self._taken]
        if len(new) > len(self._taken):
            return self.repository.trials(self.study_id)
        return self.repository.trials(self.study_id, numbers=new) if new else []

    def sync(self, force: bool = False) -> Synced | None:
        """Take the stored trials the memory study lacks into it (those of earlier runs and of
        other coordinators); read the running trials of others. None (nothing read) within
        ``sync_interval_s`` of the last sync, unless ``force``."""
        now = self._clock()
        if not force and now - self._last_sync < self._interval:
            return None
        self._last_sync = now
        finished = []
        for trial in self._untaken():
            if trial.number in self._taken:
                continue
            self._taken.add(trial.number)
            frozen = search.stored_trial(self.space, trial.params, objective(trial))
            if frozen is not None:
                self.memory.add_trial(frozen)
                self._observed.append((dict(frozen.params), float(frozen.value)))
            finished.append(trial)
        running = [r for r in self.repository.running(self.study_id) if r.number not in self._mine]
        return Synced(tuple(finished), tuple(running))
