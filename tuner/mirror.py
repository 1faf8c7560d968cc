"""The sampler's study in memory, the record in the database.

Optuna's RDB storage makes a database round trip for each suggested parameter: an ask took about
90 ms on SQLite, where the same TPE ask in memory takes under 10 ms. A study asks several configs
for each one it measures (the others the family rejects, or they were measured before), so the
sampler works on an in-memory study and only configs that go to the GPU are written to the
database study, each in one transaction::

    mirror = MirroredStudy(study, writer=writer)  # study: the database one; its sampler moves
                                                  # to the memory study; writer: study_writer's
    proposal = mirror.ask(space.distributions)    # in memory (a queued trial: from the database)
    mirror.tell(proposal, float("inf"))           # rejected: in memory only
    mirror.repeated(proposal, 0.0213)             # measured before: FAIL in memory
    mirror.record(proposal, owner="host:pid")     # going to the GPU: a RUNNING database trial
    mirror.finish(proposal, 0.0213, record, tflops=98.1)  # stored, then told in both
    mirror.number(proposal)                       # the database trial's number

The database writes go through ``writer`` (``tuner.study_writer``), which makes them in order,
in this process or in a Ray actor. Trials queued in the database study (``study.enqueue_trial``:
warm start, starting points, trials a killed run left) are asked there, so two coordinators
never take the same one. ``sync`` copies the finished trials of other coordinators sharing the
study (PostgreSQL) into memory, at most every ``sync_interval_s``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, Trial, TrialState, create_trial

from tuner.study_writer import InlineWriter

SYNC_INTERVAL_S = 5.0
MIRROR_ATTR = "mirror"  # user attribute of a database trial: the mirror that created it


@dataclass
class Proposal:
    """One asked config: its in-memory trial and, once recorded, its database trial as the
    writer knows it (``created``: a queued trial's (id, number), or the writer's handle of the
    one it creates)."""

    trial: Trial
    created: Any = None

    @property
    def params(self) -> dict[str, Any]:
        return self.trial.params


@dataclass(frozen=True)
class Synced:
    """Trials of other coordinators seen by :meth:`MirroredStudy.sync`."""

    finished: tuple[FrozenTrial, ...] = ()  # COMPLETE, newly copied into memory
    running: tuple[FrozenTrial, ...] = ()  # RUNNING now


class MirroredStudy:
    def __init__(self, durable: optuna.Study, *, sync_interval_s: float = SYNC_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, writer: Any = None) -> None:
        """``writer``: where the database trials are written (``tuner.study_writer``; default
        in this process, at once)."""
        self.durable = durable
        self.writer = writer if writer is not None else InlineWriter(durable)
        self._token = uuid.uuid4().hex  # marks the database trials this mirror creates
        self.memory = optuna.create_study(direction="minimize", sampler=durable.sampler)
        # The database study keeps a sampler that costs nothing: its trials are made here, and
        # Optuna calls a study's sampler whenever a Trial of it is built.
        durable.sampler = optuna.samplers.RandomSampler()
        self._mine: set[int] = set()  # database trial numbers this mirror asked or created
        self._copied: set[int] = set()  # database trial numbers copied into memory
        self._waiting = 0
        self._interval, self._clock = sync_interval_s, clock
        self._last_sync = -float("inf")
        self.synced: Synced = self.sync(force=True)  # type: ignore[assignment]

    @property
    def sampler(self) -> optuna.samplers.BaseSampler:
        return self.memory.sampler

    def ask(self, distributions: Mapping[str, BaseDistribution]) -> Proposal:
        """A queued database trial while there are any, else the sampler's proposal in memory."""
        durable = self._pop_queued(distributions) if self._waiting else None
        if durable is None:
            return Proposal(self.memory.ask(dict(distributions)))
        self.memory.enqueue_trial(durable.params)
        return Proposal(self.memory.ask(dict(distributions)), (durable._trial_id, durable.number))

    def _pop_queued(self, distributions: Mapping[str, BaseDistribution]) -> Trial | None:
        """Take the oldest queued database trial (None when another coordinator took the last):
        set RUNNING only if still WAITING, as Optuna's own ask does (through its storage, as
        ``tuner.study_writer`` does; Optuna is pinned below 6)."""
        storage, study_id = self.durable._storage, self.durable._study_id
        for frozen in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)):
            try:
                if not storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING):
                    continue
            except UpdateFinishedTrialError:
                continue
            self._waiting = max(0, self._waiting - 1)
            trial = Trial(self.durable, frozen._trial_id)
            for name, distribution in distributions.items():  # the queued params (SearchSpace's
                trial.suggest_categorical(name, distribution.choices)  # are all categorical)
            self._mine.add(trial.number)
            return trial
        self._waiting = 0
        return None

    def record(self, proposal: Proposal, **user_attrs: Any) -> None:
        """Give the proposal a RUNNING database trial (params and attributes in one write)."""
        if proposal.created is not None:  # a queued trial, taken by ask
            self.writer.call("set_user_attrs", proposal.created, user_attrs)
            return
        proposal.created = self.writer.call("create", proposal.trial.params, proposal.trial.distributions,
                                             {**user_attrs, MIRROR_ATTR: self._token})

    def number(self, proposal: Proposal, wait: bool = True) -> int | None:
        """The database trial's number (the stored trial's number); waits for its creation, or
        with ``wait=False`` is None while the writer has not made it."""
        if proposal.created is None:
            raise ValueError("this proposal has no database trial yet")
        if not wait and not self.writer.ready(proposal.created):
            return None
        return self.writer.result(proposal.created)[1]

    def tell(self, proposal: Proposal, value: float, **attrs: Any) -> None:
        """Tell the sampler; the database trial too, with ``attrs`` as user attributes."""
        self.memory.tell(proposal.trial, value, skip_if_finished=True)
        if proposal.created is not None:
            self.writer.call("tell", proposal.created, value, attrs)

    def repeated(self, proposal: Proposal, value: float, **attrs: Any) -> None:
        """A config measured before, asked again: its database trial (a queued one) is told
        ``value``; the sampler's is FAIL, so that the sampler's data holds each config once.
        Told their value, the repeats of a study's best configs crowded TPE's density of good
        trials with copies, and it proposed them ever more often: a 300-trial study asked 1,069
        times, each ask slower than the last (10 ms in the first quarter, 27 in the last)."""
        self.memory.tell(proposal.trial, state=TrialState.FAIL, skip_if_finished=True)
        if proposal.created is not None:
            self.writer.call("tell", proposal.created, value, attrs)

    def finish(self, proposal: Proposal, value: float, record: Mapping[str, Any], **attrs: Any) -> None:
        """A measured result: told to the sampler at once; then, by the writer and in this order,
        stored (``Repository.record_trial(**record)`` under the trial's number) and told to the
        database study."""
        self.memory.tell(proposal.trial, value, skip_if_finished=True)
        self.writer.call("finish", proposal.created, dict(record), value, attrs)

    def abandon(self, proposal: Proposal) -> None:
        """Never to be told: FAIL in memory; in the database FAIL and queued to be asked again."""
        self._fail(proposal, requeue=True)

    def drop(self, proposal: Proposal) -> None:
        """Never to be told, nor asked again (another coordinator measures it): FAIL in both."""
        self._fail(proposal, requeue=False)

    def _fail(self, proposal: Proposal, requeue: bool) -> None:
        self.memory.tell(proposal.trial, state=TrialState.FAIL, skip_if_finished=True)
        if proposal.created is not None:
            self.writer.call("abandon", proposal.created, proposal.trial.params if requeue else None)

    def flush(self) -> None:
        """Wait until every database write sent so far is made."""
        self.writer.flush()

    def sync(self, force: bool = False) -> Synced | None:
        """Copy finished database trials of other coordinators (and of earlier runs) into memory;
        recount the queued ones. None (nothing read) within ``sync_interval_s`` of the last sync,
        unless ``force``."""
        now = self._clock()
        if not force and now - self._last_sync < self._interval:
            return None
        self._last_sync = now
        trials = self.durable.get_trials(deepcopy=False, states=(
            TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING))
        self._waiting = sum(t.state == TrialState.WAITING for t in trials)
        finished, running = [], []
        for t in trials:
            if (t.number in self._mine or t.number in self._copied or not t.params
                    or t.user_attrs.get(MIRROR_ATTR) == self._token):
                continue
            if t.state == TrialState.RUNNING:
                running.append(t)
            elif t.state == TrialState.COMPLETE:
                self.memory.add_trial(create_trial(value=t.value, params=t.params,
                                                   distributions=t.distributions))
                self._copied.add(t.number)
                finished.append(t)
        return Synced(tuple(finished), tuple(running))
