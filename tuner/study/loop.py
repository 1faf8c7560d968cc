"""The coordinator: Optuna asks, the family checks, the pool measures, storage records, Optuna is told.

Several trials are in flight at once (``lookahead``); the coordinator is the only writer of the
database. It runs against anything with the :class:`Pool` interface (a :class:`workers.WorkerPool`)::

    plan = StudyPlan(family, problem, record, space, first=warm_configs)
    coordinator = Coordinator(plan, pool=pool, repository=repo, sampler=sampler,
                              options=StudyOptions(trials=200))
    outcome = coordinator.run()      # LoopOutcome(status="finished", reason="200 trials measured")

Rules it keeps:

- the sampler asks and learns in memory (:class:`tuner.study.mirror.MirroredStudy`), on a study
  rebuilt from the stored trials; a trial that goes to the GPU is stored as running (its
  number taken), and measured it is stored in its place: our tables are its one record;
- configs given as ``first`` (warm start, the family's starting points) are asked before
  anything the sampler proposes, unless measured already;
- a config the family rejects is told ``inf`` at once, to the sampler only; it is never
  compiled, not stored (storage holds measured trials only) and does not count toward the
  trial budget;
- a config measured before (in this study, by this run, an earlier one or another coordinator
  sharing it) is never measured again: the sampler's trial fails (:meth:`MirroredStudy.repeated`:
  the sampler holds each config once); one asked again while in flight here waits for that
  result, one in flight elsewhere is dropped;
- a config goes to the GPU only under its lease (``Repository.claim_trial``: a running trial,
  one per config and study, granted in one transaction): coordinators sharing a study never
  measure a config together or twice, and together stop at the study's ``trials``; the leases
  are renewed while they are measured (``storage.LEASE_RENEW_S``);
- it stops after ``trials`` measured trials of the study, after ``time_budget`` seconds of this
  run, when every valid config has been measured, or after ``max_idle_asks`` asks in a row that
  brought nothing new; where the rest of the study's trials are in flight elsewhere, it waits
  for them (and measures any whose coordinator dies);
- running trials of a killed or interrupted run are settled, at the start and at every sync:
  dropped when their config is measured, else measured first (a trial whose coordinator still
  runs and renews its lease is left to it: :func:`tuner.study.search.owner_alive`);
- on KeyboardInterrupt it keeps what finished, leaves what was in flight to be measured first
  by the next run and returns ``status="interrupted"``;
- once finished, it re-times the study's ``retime`` fastest trials interleaved on one GPU and
  the stored best follows the re-timed medians (:mod:`tuner.study.final_best`; 0: not);
- with several GPUs, each trial's median is also stored normalized by the study's anchor (a fixed
  config every GPU times now and then) as its own GPU timed it close in time, in the terms of the
  reference GPU's first timing of it (:mod:`tuner.study.normalize`), with the anchor's drift around it;
  the sampler, the best so far and the re-timing's candidates go by the normalized medians; a
  result of a GPU with no ratio yet waits in flight for its first round. With one GPU nothing of
  it runs.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

import optuna

from storage import ClaimRefused, TrialOutcome, params_key
from templates.family import KernelFamily, Problem, TemplateError
from tuner.study import gc_tuning, search
from tuner.study.faults import FaultCost
from tuner.study.final_best import DEFAULT_TOP, retime_study
from tuner.study.mirror import MirroredStudy, Proposal, Synced, objective
from tuner.study.normalize import GpuScale
from tuner.study.options import DEFAULT_LOOP, LoopOptions, StudyOptions
from tuner.study.progress import BestSoFar, Progress
from workers.results import Measurement

logger = logging.getLogger("tuner")

# While the sampler is asked, the pool is served (``WorkerPool.serve``) at most this often: each
# GPU holds only its running trial and a few more, and a trial stopped early ends in milliseconds.
SERVE_EVERY_S = 0.005
# A candidate whose first repetitions take longer than this times the best so far is clearly
# behind: its timing stops there (workers.kernel_run.EARLY_REPS repetitions) and the GPU moves on.
EARLY_STOP_FACTOR = 1.5


class Pool(Protocol):
    """Everything the coordinator (and :func:`tuner.tune` around it) uses of
    :class:`workers.WorkerPool`; a test's double implements the same (``tests/tuner/tuner_doubles.FakePool``).

    A ticket submitted comes back once from :meth:`poll` with its Measurement. With several GPUs
    the pool also times an incumbent on every GPU in rounds (:meth:`set_incumbent`,
    :meth:`calibrations`); with one, those do nothing and return nothing.
    """

    device: Any  # workers.DeviceInfo of the GPUs measuring (a replay's: the recorded GPU's)
    limits: Any  # templates.family.DeviceLimits of that GPU: what the family checks configs against
    num_gpus: int  # GPUs measuring
    gpus: list[dict[str, Any]]  # each GPU's {"uuid", "index", "name"}; the first re-times ([] : one model)
    compile_workers: int  # configs compiled at once
    max_actor_depth: int  # measurements a GPU may hold at once (workers.depth)
    recorded: Sequence[dict[str, Any]] | None  # a replay's configs (None: real GPUs)
    gpu_busy_seconds: float  # the GPUs' time measuring so far
    kernel_busy_seconds: float  # of which the kernels ran
    flush_busy_seconds: float  # and the L2 was flushed before timed launches

    def submit(self, ticket: int, params: dict[str, Any], source: str | None, launch: Any,
               options: Sequence[str]) -> None:
        """Queue a config to compile and measure (``source`` None: rendered where it compiles)."""

    def poll(self, timeout: float) -> list[tuple[int, Measurement]]:
        """Finished tickets; waits up to ``timeout`` seconds for the first one."""

    def serve(self) -> None:
        """Between asks, without waiting: compiled configs go to the GPUs, finished ones are
        taken in (they come out of the next :meth:`poll`)."""

    def pending(self) -> int:
        """Tickets submitted and not yet returned by :meth:`poll`."""

    def set_abort_above(self, ms: float | None) -> None:
        """Timings sent from now on stop once clearly slower than ``ms`` (None: never)."""

    def set_incumbent(self, params: dict[str, Any], source: str, launch: Any, options: Sequence[str]) -> None:
        """The best config so far, for every GPU to time now and then (several GPUs)."""

    def calibrations(self) -> list[Any]:
        """The incumbent's timings (``workers.results.Calibration``) since the last call."""

    def calibrating(self) -> bool:
        """Whether a timing of the incumbent is on its way."""

    def retime(self, kernels: Sequence[tuple[dict[str, Any], str, Any, Sequence[str]]], *,
               rounds: int, max_seconds: float) -> Any:
        """Time configs (params, source, launch, options) again, interleaved on the first GPU:
        a ``workers.results.Retiming``. Called with nothing in flight."""

    def replacements(self) -> list[Any]:
        """GPU workers replaced so far (``workers.pool.Replacement``: the ticket that took one
        down, and how long its replacement took)."""

    def busy_intervals(self) -> list[tuple[int, float, float]]:
        """Simulated GPUs: (gpu, start, end) of each measurement; [] otherwise."""

    def simulator_cpu_seconds(self) -> float:
        """Simulated GPUs: the CPU time their host processes used; 0 otherwise."""

    def simulator_lateness(self) -> list[float]:
        """Simulated GPUs: how late each measurement's sleep ended; [] otherwise."""


@dataclass(frozen=True)
class StudyPlan:
    """What a coordinator runs: the family's problem, its stored study (``storage.StudyRecord``)
    and space, the configs asked first (warm start, the family's starting points) and the
    family's valid configs (None: the coordinator lists them)."""

    family: KernelFamily
    problem: Problem
    record: Any
    space: search.SearchSpace
    first: Sequence[dict[str, Any]] = ()
    valid: Sequence[dict[str, Any]] | None = None


@dataclass
class _InFlight:
    proposal: Proposal
    params: dict[str, Any]
    key: str
    followers: list[Proposal] = field(default_factory=list)
    submitted: float = 0.0  # the coordinator's clock when it went to the pool


@dataclass(frozen=True)
class LoopOutcome:
    status: str  # "finished" | "interrupted"
    reason: str
    measured: int  # by this run
    failed: int
    reused: int
    invalid: int
    previous: int  # measured by earlier runs of the study
    elapsed_s: float
    retimed: tuple[Any, ...] = ()  # storage.RetimeRecord of the re-timing at the end, ranked
    shared: int = 0  # measured meanwhile by other coordinators sharing the study
    faults: tuple[FaultCost, ...] = ()  # this run's failed trials and what each cost (tuner.study.faults)


def gpu_scale(pool: Pool) -> GpuScale | None:
    """With several GPUs (``pool.gpus``), what makes their timings one set: ratios to the first,
    where the re-timing runs (:mod:`tuner.study.normalize`); None with one."""
    gpus = list(pool.gpus or [])
    return GpuScale(str(gpus[0].get("uuid") or "")) if len(gpus) > 1 else None


def gpu_columns(m: Measurement, normalized: float | None, ratio: float | None,
                anchor: tuple[float | None, float | None, str | None] = (None, None, None)) -> dict[str, Any]:
    """What a trial stores of the GPU that measured it: its identity, its clocks, temperature and
    power around the timing, and (several GPUs) its median normalized by the anchor, with the
    anchor's time on that GPU then, its drift around it and which config it is (``anchor``:
    (ms, spread, params key))."""
    state = dict(m.clocks)
    if state and m.gpu.get("name"):
        state["name"] = m.gpu["name"]
    if m.paired is not None and normalized is not None:  # timed beside the anchor (workers.paired)
        state["anchor_ratio"] = m.paired.ratio
        state["anchor_ratio_iqr"] = m.paired.ratio_iqr
    if anchor[0] is not None:
        state["anchor_ms"] = anchor[0]
    if anchor[1] is not None:
        state["anchor_spread"] = anchor[1]
    if anchor[0] is not None and anchor[2] is not None:
        state["anchor"] = anchor[2]
    return {"gpu_state": state or None, "gpu_uuid": m.gpu.get("uuid") or None,
            "gpu_index": m.gpu.get("index"), "normalized_ms": normalized, "gpu_ratio": ratio}


def default_lookahead(pool: Pool) -> int:
    """Compile workers plus as many trials per GPU as a GPU may hold at once (the one it runs
    and those queued behind it: ``workers.depth``, 2 to 4), so no GPU waits for a compile."""
    compilers = pool.compile_workers or os.cpu_count() or 1
    return int(compilers) + int(pool.max_actor_depth) * max(1, int(pool.num_gpus or 1))


class Coordinator:
    """Runs one study to its budget. See the module docstring for the rules."""

    def __init__(
        self,
        plan: StudyPlan,
        *,
        pool: Pool,
        repository: Any,
        sampler: optuna.samplers.BaseSampler,
        options: StudyOptions,
        loop: LoopOptions = DEFAULT_LOOP,
    ) -> None:
        """Runs ``plan`` on ``pool``, recording in ``repository``; ``options``: the budget
        (``trials``, ``time_budget``), ``retime`` and ``early_stop``; ``loop``: how the loop runs."""
        self.family, self.problem, self.pool = plan.family, plan.problem, pool
        self.meter = loop.meter  # tuner.study.meter.Meter: asks and tells timed
        self.repository, self.sampler, self.record, self.space = repository, sampler, plan.record, plan.space
        self.first = [dict(params) for params in plan.first]
        self.stored = loop.stored  # called with each trial this run stores (storage.TrialRecord)
        self.trials, self.time_budget = options.trials, options.time_budget
        self.lookahead = max(1, loop.lookahead or default_lookahead(pool))
        self.max_idle_asks = loop.max_idle_asks
        self.retime = options.retime
        self.early_stop = options.early_stop
        self.poll_interval = loop.poll_interval
        self.clock = clock = loop.clock or time.monotonic
        self.loop = replace(loop, clock=clock)
        self.progress = loop.progress or Progress(
            plan.record.name, trials=options.trials, time_budget=options.time_budget, clock=clock
        )
        self._known: dict[str, float] = {}  # params_key -> objective told to Optuna
        self._best_known: tuple[float, str] | None = None  # the least finite (value, key) of _known
        self._in_flight: dict[int, _InFlight] = {}  # pool ticket -> trial
        self._in_flight_keys: dict[str, int] = {}
        self._tickets = itertools.count()
        self._previous = 0
        self._shared = 0  # stored meanwhile by other coordinators
        self._full = False  # the study's trial count is reached with trials in flight elsewhere
        self._queued: set[str] = set()  # configs enqueued to be measured first
        self._idle = 0
        self._unmeasured: set[str] = set()  # valid configs neither measured nor in flight
        self._elsewhere: set[str] = set()  # configs other coordinators sharing the study measure now
        # configs known here that the sampler's observations may lack (a result lost to another
        # coordinator, a proposal of one known): the batch proposer is told them as in flight
        self._not_again: set[str] = set()
        self._n_valid = 0
        self._failed: list[tuple[int, FaultCost]] = []  # (pool ticket, cost without replacements)
        self._started = clock()
        self._proposals: MirroredStudy | None = None  # made by run(), after the resume
        self._proposer: Any = None  # tuner.study.batchtpe.BatchProposer, made on the first batch
        # the family's valid configs: given (the caller listed them already), else listed by _resume
        self._given_valid = None if plan.valid is None else list(plan.valid)
        self._valid: list[dict[str, Any]] = []
        self._scale = gpu_scale(pool)  # several GPUs: their timings made one set
        self._held: dict[int, Measurement] = {}  # ticket -> measured on a GPU with no ratio yet
        self._incumbent: str | None = None  # the best config so far, as the GPUs time it
        self._anchor_key: str | None = None  # the config the GPUs time in rounds (tuner.study.normalize)
        self._served = 0.0  # time.monotonic() of the pool's last serve between asks
        self._advised: set[str] = set()  # ptxas' note codes told once (_advise)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> LoopOutcome:
        self._started = self.clock()
        self._proposals = MirroredStudy(self.repository, self.record.id, self.space, self.sampler,
                                        owner=search.owner_id(), loop=self.loop)
        self._resume()
        self.repository.set_study_status(self.record.id, "running")
        status, reason = "interrupted", "stopped by an error"
        try:
            with gc_tuning.quiet():
                reason = self._loop()
            status = "finished"
        except KeyboardInterrupt:
            reason = "interrupted by the user"
            try:
                self._collect(0.0)  # what finished meanwhile is kept
            except KeyboardInterrupt:
                pass
        finally:
            self._release_held(force=True)  # measured: kept, whatever stopped the loop
            if self._in_flight:
                logger.warning("re-queueing %d trials that were in flight", len(self._in_flight))
            self._abandon_in_flight()
            self.repository.set_study_status(self.record.id, status)
            self.progress.in_flight = 0
            self.progress.finish(status, reason)
        retimed = self._retime() if status == "finished" else []
        c = self.progress.counts
        return LoopOutcome(status, reason, c.measured, c.failed, c.reused, c.invalid,
                           self._previous, self.clock() - self._started, tuple(retimed), self._shared,
                           self._fault_costs())

    def _fault_costs(self) -> tuple[FaultCost, ...]:
        """This run's failed trials, each with the time its GPU workers' replacements took
        (``pool.replacements()``; a replacement still starting counts its
        time so far)."""
        by_ticket: dict[int, list[float]] = {}
        for done in self.pool.replacements():
            if done.ticket is not None:
                by_ticket.setdefault(done.ticket, []).append(done.seconds)
        return tuple(FaultCost.of(c.number, c.failure, c.reason, c.wall_s, c.params, by_ticket.get(ticket, ()))
                     for ticket, c in self._failed)

    def _retime(self) -> list[Any]:
        """Re-time the study's fastest trials (:mod:`tuner.study.final_best`); Ctrl-C skips it."""
        if self.retime < 1:
            return []
        try:
            return retime_study(self.family, self.problem, pool=self.pool,
                                repository=self.repository, record=self.record, top=self.retime)
        except KeyboardInterrupt:
            logger.warning("re-timing interrupted: the winner stays the search's fastest")
            return []

    def _loop(self) -> str:
        while True:
            stop = self._stop_reason()
            if stop is None and not self._full:
                self._fill()
                stop = self._stop_reason()
            self._mirror.renew()
            if self._in_flight:
                self._collect(self.poll_interval)
                self.progress.tick(len(self._in_flight))
            elif stop is not None:
                return stop
            elif self._full:
                self._wait_for_others()

    def _wait_for_others(self) -> None:
        """The rest of the study's trials are in flight elsewhere: wait for them to be stored,
        taking over those whose coordinator is gone (:meth:`_synced` queues them)."""
        time.sleep(self.poll_interval)
        self.progress.tick(0)
        self._synced(self._mirror.sync(force=True))

    def _stop_reason(self) -> str | None:
        """Why no new trial should be asked now, or None."""
        measured = self._previous + self._shared + self.progress.counts.measured
        if not self._unmeasured:  # first: a grid's budget is its valid configs, and this says so
            return f"every valid config ({self._n_valid}) measured"
        if self.trials is not None and measured + len(self._in_flight) >= self.trials:
            return f"{self.trials} trials measured"
        if self.time_budget is not None and self.clock() - self._started >= self.time_budget:
            return f"time budget of {self.time_budget:g}s spent"
        if self._idle >= self.max_idle_asks:
            return f"{self._idle} asks in a row brought no new config"
        return self.loop.stop_when() if self.loop.stop_when is not None else None

    # -- one trial --------------------------------------------------------------------------------
    @property
    def _mirror(self) -> MirroredStudy:
        if self._proposals is None:
            raise RuntimeError("the coordinator asks only inside run()")
        return self._proposals

    def _screen(self, proposal: Proposal) -> tuple[Proposal, dict[str, Any], str, tuple[Any, ...]] | None:
        """A proposal that should go to the GPU: (proposal, params, key, (None, launch,
        options): the pool renders the source); None when it is measured, in flight, measured
        elsewhere or rejected (each handled here)."""
        params = self.space.decode(proposal.params)
        key = params_key(params)
        if key in self._known:
            self._not_again.add(key)
            self._mirror.repeated(proposal)
            self.progress.reused()
            self._idle += 1
            return None
        if key in self._in_flight_keys:
            self._in_flight[self._in_flight_keys[key]].followers.append(proposal)
            self.progress.reused()
            self._idle += 1
            return None
        if key in self._elsewhere:  # its result reaches the sampler through a later sync
            self._mirror.drop(proposal)
            self.progress.reused()
            self._idle += 1
            return None
        reason = None if proposal.checked else self.family.check(params, self.problem, self.pool.limits)
        if reason is None:
            try:
                launch = self.family.launch(params, self.problem)
                options = tuple(self.family.compile_options(params, self.problem))
            except TemplateError as error:
                reason = f"render: {error}"
        if reason is not None:
            self._reject(proposal, key, reason)
            self._idle += 1
            return None
        # the source is rendered where it compiles (the pool's compile task), not here: a
        # coordinator feeding many GPUs spent 0.2-0.5 ms a trial in Jinja
        return proposal, params, key, (None, launch, options)

    def _submit(self, proposal: Proposal, params: dict[str, Any], key: str, work: tuple[Any, ...]) -> None:
        """Send a leased config to the pool."""
        ticket = next(self._tickets)
        self.pool.submit(ticket, params, *work)
        self._in_flight[ticket] = _InFlight(proposal, params, key, submitted=self.clock())
        self._in_flight_keys[key] = ticket
        self._unmeasured.discard(key)
        self._idle = 0
        logger.debug("ticket %d submitted %s", ticket, params)

    # -- batches: many asks, one claim transaction; the results of a poll in one transaction -----
    def _fill(self) -> None:
        """Ask until ``lookahead`` trials are in flight, in batches: the free slots' configs
        asked (``tpe``: proposed at once, one model for the batch,
        :class:`tuner.study.batchtpe.BatchProposer`), screened, and their leases claimed in one
        transaction (``Repository.claim_trials``)."""
        self._synced(self._mirror.sync())
        idle_rounds = 0
        while idle_rounds < 4:
            if self._stop_reason() is not None or self._full:
                return
            slots = self.lookahead - len(self._in_flight)
            left = slots  # trials the study still lacks beyond those in flight
            if self.trials is not None:
                measured = self._previous + self._shared + self.progress.counts.measured
                left = self.trials - measured - len(self._in_flight)
            free = min(slots, left)
            # a small batch waits for more free slots, unless it is all the study still lacks:
            # waiting gains nothing then, and the study's last trials were asked only once every
            # trial in flight had come back, while the GPUs idled (0.4-1.7 s a study)
            if free <= 0 or (free < self._min_batch() and left > slots and self._in_flight):
                return
            ready = [r for r in map(self._screen, self._propose(free)) if r is not None]
            granted = self._mirror.record_many([(r[0], r[1]) for r in ready], limit=self.trials)
            sent = 0
            for (proposal, params, key, work), number in zip(ready, granted):
                if isinstance(number, ClaimRefused):
                    self._refused(proposal, key, number.why)
                else:
                    self._submit(proposal, params, key, work)
                    sent += 1
            idle_rounds = 0 if sent else idle_rounds + 1
            self._serve_pool()

    def _min_batch(self) -> int:
        """The fewest free slots worth a batch while trials are in flight: an eighth of the
        lookahead. Each GPU holds its next trial or more (``workers.depth``), so slots left
        free a while leave no GPU idle, and a batch's fixed costs (the model, two transactions)
        are shared by more trials."""
        return max(1, self.lookahead // 8)

    def _propose(self, count: int) -> list[Proposal]:
        """Up to ``count`` proposals: the sampler's asks where it is not ``tpe``; else the configs
        enqueued (warm start, settled trials) first, asked with their params, or else one batch of
        :class:`tuner.study.batchtpe.BatchProposer` (once a batch proposes, the memory study's TPE
        is asked no more: it lacks the batches' trials)."""
        batcher, waiting = self._batcher(), self._mirror.waiting()
        if batcher is None or waiting:  # waiting: enqueued configs, asked with their own params
            asked = []
            for _ in range(count if batcher is None else min(count, waiting)):
                asked.append(self._mirror.ask(self.space.distributions))
                self._serve_pool()
            return asked
        began = time.perf_counter()
        # in flight here, and what other coordinators sharing the study measure now: never proposed
        pending = [f.proposal.params for f in self._in_flight.values()]
        pending += [self.space.encode(p) for p in map(json.loads, self._elsewhere | self._not_again)
                    if self.space.contains(p)]
        picks = batcher.propose(observed=self._mirror.observed(), pending=pending, count=count)
        if self.meter is not None:
            self.meter.asked(time.perf_counter() - began, len(picks))
        if not picks and not self._in_flight:  # every valid config of the space is measured
            self._unmeasured.clear()
        # the batch proposer draws from the family's valid configs (``valid_configs``): checked
        return [self._mirror.proposed(pick, checked=True) for pick in picks]

    def _serve_pool(self) -> None:
        """Between asks: the pool hands compiled configs to its GPUs and takes in what finished
        (``serve``: the results come out of the next poll), at most every ``SERVE_EVERY_S``."""
        now = time.monotonic()
        if now - self._served >= SERVE_EVERY_S:
            self._served = now
            self.pool.serve()

    def _batcher(self) -> Any:
        """The batch proposer of a ``tpe`` study (None for the other samplers), made once."""
        if self._proposer is None and getattr(self.sampler, "batch_proposals", False):
            from tuner.study.batchtpe import BatchProposer

            # the valid configs of the space (not a walk of the space: attention's is 7.3 million)
            valid = [c for c in self._valid if self.space.contains(c)]
            self._proposer = BatchProposer(self.space, valid, seed=getattr(self.sampler, "batch_seed", None),
                                           liar=getattr(self.sampler, "constant_liar", True))
        return self._proposer

    def _collect(self, timeout: float) -> None:
        """Every result of a poll told to the sampler and stored together, in one transaction
        (``Repository.record_trials``); results held for a GPU's ratio
        (:meth:`_held_for_ratio`) are released one by one when their GPU has one."""
        results = self.pool.poll(timeout)
        self._calibrated()
        done = []
        for ticket, measurement in results:
            if ticket not in self._in_flight:
                logger.warning("ignoring a result for unknown ticket %r", ticket)
                continue
            if not self._held_for_ratio(ticket, measurement):
                flight = self._take_ticket(ticket, measurement)
                done.append((flight, measurement, *self._outcome(flight, measurement)))
        if done:
            self._set_early_stop()
            self._refresh_incumbent()
            stored = self._mirror.finish_many([(f.proposal, value, f.params, outcome)
                                               for f, _, outcome, value in done])
            for (flight, m, outcome, value), record in zip(done, stored):
                if isinstance(record, ClaimRefused):
                    self._lost(flight)
                else:
                    self._measured(flight, m, outcome, value, record)
        self._release_held()

    def _refused(self, proposal: Proposal, key: str, why: str) -> None:
        """The config's lease was not granted: measured or held by another coordinator (its
        result reaches the sampler through a later sync), or the study's trial count is reached
        by its measured and running trials (then no more is asked until something changes)."""
        self._mirror.drop(proposal)
        if why == "full":
            self._full = True
            return
        # held or measured elsewhere: not proposed again (the batch proposer, whose picks repeat
        # until its observations change, is told it is in flight) until a sync brings its result
        self._elsewhere.add(key)
        self.progress.reused()
        self._idle += 1

    def _reject(self, proposal: Proposal, key: str, reason: str) -> None:
        """Tell a config the family rejected: ``inf`` at once, nothing compiled or stored."""
        self._know(key, search.FAILED_VALUE)
        self._unmeasured.discard(key)
        self._mirror.tell(proposal, search.FAILED_VALUE)
        self.progress.invalid()
        logger.debug("invalid: %s (%s)", reason, key)

    def _synced(self, synced: Synced | None) -> None:
        """Take in what other coordinators sharing the study measured, or measure now."""
        if synced is None:  # not read this time
            return
        for trial in synced.finished:
            self._shared += 1
            if trial.key not in self._known:
                self._know(trial.key, objective(trial))
                self._unmeasured.discard(trial.key)
        self._elsewhere = {t.key for t in synced.running if not self._settle(t)}
        if synced.finished:
            self._set_early_stop()
            self._refresh_incumbent()

    def _settle(self, running: Any) -> bool:
        """A running trial of another coordinator (``storage.RunningRecord``): False when its
        owner is alive and renews its lease (left to it); else settled here, True: dropped when
        its config is measured, else dropped and its config queued to be measured first (by
        whichever coordinator drops it first)."""
        if search.owner_alive(running.owner, running.heartbeat_at or running.started_at):
            return False
        if running.key in self._known:
            self.repository.drop_trial(self.record.id, running.number)
        elif self.repository.drop_trial(self.record.id, running.number):  # not settled elsewhere
            if self.space.contains(running.params) and running.key not in self._queued \
                    and running.key not in self._in_flight_keys:
                self._mirror.enqueue(running.params)
                self._queued.add(running.key)
                self._full = False
            logger.info("trial %d was left running by a run that stopped or died: queued", running.number)
        return True

    def _finish_ticket(self, ticket: int, measurement: Measurement) -> None:
        self._finish(self._take_ticket(ticket, measurement), measurement)

    def _take_ticket(self, ticket: int, measurement: Measurement) -> _InFlight:
        """A ticket's trial out of flight (a failure's cost noted)."""
        flight = self._in_flight.pop(ticket)
        del self._in_flight_keys[flight.key]
        if not measurement.ok:
            self._failed.append((ticket, FaultCost.of(
                flight.proposal.number, measurement.failure or "worker", measurement.reason or "",
                self.clock() - flight.submitted, flight.params)))
        return flight

    def _finish(self, flight: _InFlight, m: Measurement) -> None:
        """The sampler learns; the measured trial is stored in place of its running one, with
        the GPU's clocks and temperature as read for it (none for a failure)."""
        outcome, value = self._outcome(flight, m)
        self._set_early_stop()
        self._refresh_incumbent()
        try:
            record = self._mirror.finish(flight.proposal, value, flight.params, outcome)
        except ClaimRefused:  # this run stalled past its leases' life; another took the config
            self._lost(flight)
            return
        self._measured(flight, m, outcome, value, record)

    def _outcome(self, flight: _InFlight, m: Measurement) -> tuple[TrialOutcome, float]:
        """A measurement as the trial to store and the value to tell; the config is known."""
        timing, res = m.timing, m.resources
        tflops = None
        if m.ok and timing is not None and timing.median_ms > 0:
            tflops = self.family.tflops(self.problem, timing.median_ms)
        normalized, ratio = self._normalized(m)
        outcome = TrialOutcome(
            status="ok" if m.ok else "failed", failure=m.failure, reason=m.reason, detail=m.detail,
            registers=res.registers if res else None,
            smem_static=res.smem_static if res else None,
            stack_bytes=res.stack_bytes if res else None,
            spill_stores=res.spill_stores if res else None,
            spill_loads=res.spill_loads if res else None,
            cubin_hash=m.cubin_hash, toolkit=m.toolkit, compile_seconds=m.compile_seconds,
            median_ms=timing.median_ms if timing else None,
            min_ms=timing.min_ms if timing else None,
            max_ms=timing.max_ms if timing else None,
            iqr_ms=timing.iqr_ms if timing else None,
            repetitions=timing.repetitions if timing else None,
            tflops=tflops, error=m.error, max_abs_error=m.max_abs_error,
            replayed=m.replayed, **gpu_columns(m, normalized, ratio, self._anchor(m)),
        )
        value = timing.median_ms if m.ok and timing is not None else search.FAILED_VALUE
        if normalized is not None:
            value = normalized
        self._know(flight.key, value)
        return outcome, value

    def _lost(self, flight: _InFlight) -> None:
        """This run stalled past the trial's lease's life; another coordinator took the config."""
        logger.warning("trial %d: its lease was taken over meanwhile; the result is not stored",
                       flight.proposal.number)
        self._not_again.add(flight.key)
        for follower in flight.followers:
            self._mirror.drop(follower)

    def _measured(self, flight: _InFlight, m: Measurement, outcome: TrialOutcome, value: float,
                  record: Any) -> None:
        self._published(record)
        self._advise(flight.proposal.number, m)
        for follower in flight.followers:
            self._mirror.repeated(follower)
        self.progress.measured(
            flight.proposal.number, flight.params,
            failure=None if m.ok else m.failure,
            median_ms=value if m.ok and m.timing else None, tflops=outcome.tflops,
        )

    def _advise(self, number: int, m: Measurement) -> None:
        """ptxas' notes of a cut wgmma pipeline, each code told once a run as a warning (the
        template reads a wgmma's registers early: a loss no other field of the trial shows)."""
        for advisory in m.advisories:
            code = advisory.split(":")[0]
            if code not in self._advised:
                self._advised.add(code)
                logger.warning("trial %d: ptxas %s (told once a run; `tuner lint` lists the notes under each "
                               "config it compiles)", number, advisory)

    def _published(self, trial: Any) -> None:
        """A stored trial, to whoever wants each one (``stored``: the optuna-dashboard copy,
        :mod:`tuner.study.dashboard`). The sampler's own view of it is told by ``MirroredStudy.finish``."""
        if self.stored is not None:
            self.stored(trial)

    # -- resume and interruption ------------------------------------------------------------------
    def _resume(self) -> None:
        """Load what the study measured before into the sampler; settle running trials a killed
        or interrupted run left; queue the ``first`` configs not measured yet."""
        self._valid = self._given_valid if self._given_valid is not None else \
            self.family.valid_configs(self.problem, self.pool.limits)
        valid = {params_key(c) for c in self._valid}
        self._n_valid = len(valid)
        synced = self._mirror.sync(force=True)
        assert synced is not None
        best: BestSoFar | None = None
        for trial in synced.finished:
            if trial.key not in self._known:
                self._know(trial.key, objective(trial))
            self._previous += 1
            ranked = trial.ranked_ms
            if trial.ok and ranked is not None and (best is None or ranked < best.median_ms):
                best = BestSoFar(ranked, trial.tflops, dict(trial.params), trial.number)
        for running in synced.running:
            if not self._settle(running):
                logger.info("trial %d is being measured by %s: left to it", running.number,
                            running.owner)
        for params in self.first:
            key = params_key(params)
            if key not in self._known and key not in self._queued and self.space.contains(params):
                self._mirror.enqueue(params)
                self._queued.add(key)
        self._unmeasured = valid - self._known.keys()
        self._synced(self._mirror.sync(force=True))
        self.progress.resumed(self._previous, best)
        self._set_early_stop()
        self._refresh_incumbent()

    def _set_early_stop(self) -> None:
        """Tell the pool a timing may stop once it is clearly behind the best so far."""
        if not self.early_stop:
            return
        if self._best_known is not None:
            self.pool.set_abort_above(EARLY_STOP_FACTOR * self._best_known[0])

    def _know(self, key: str, value: float) -> None:
        """A config's objective, as told to the sampler; the fastest finite one kept as it comes
        (a scan of every known config at each poll grew with the study)."""
        replaced = self._known.get(key)
        self._known[key] = value
        if replaced is not None and self._best_known == (replaced, key) and value != replaced:
            finite = [(v, k) for k, v in self._known.items() if math.isfinite(v)]  # rare: measured again
            self._best_known = min(finite) if finite else None
        elif math.isfinite(value) and (self._best_known is None or (value, key) < self._best_known):
            self._best_known = (value, key)

    # -- several GPUs: one set of timings (tuner.study.normalize) ----------------------------------
    def _normalized(self, m: Measurement) -> tuple[float | None, float | None]:
        """(the trial's median on the reference GPU, the ratio used); (None, None) with one GPU
        or for a failure. A GPU with no ratio yet keeps its raw median (ratio None)."""
        if self._scale is None or not m.ok or m.timing is None:
            return None, None
        if self._by_pair(m):
            return self._scale.paired(m.paired.ratio, m.paired.anchor_ms)
        return self._scale.normalized(m.gpu.get("uuid"), m.timing.median_ms)

    def _anchor(self, m: Measurement) -> tuple[float | None, float | None, str | None]:
        """The anchor's time on the GPU that measured ``m`` now, and its drift there (several
        GPUs and a result with a ratio only)."""
        if self._scale is None or not m.ok or m.timing is None:
            return None, None, None
        uuid = m.gpu.get("uuid")
        if self._by_pair(m):  # its own, over the same time
            return m.paired.anchor_ms, None, self._anchor_key
        return self._scale.local(uuid), self._scale.spread(uuid), self._anchor_key

    def _by_pair(self, m: Measurement) -> bool:
        """Whether ``m`` is normalized by its own timing beside the anchor (``workers.paired``):
        it has one, and the standard is known."""
        return m.paired is not None and self._scale is not None and self._scale.standard is not None

    def _held_for_ratio(self, ticket: int, m: Measurement) -> bool:
        """Whether a result waits for its GPU's first ratio (several GPUs, a GPU whose first
        round has not come back: the first trial or two of a study on each GPU but the
        reference) before it is told and stored, so that it too is normalized. It stays in
        flight meanwhile; :meth:`_release_held` finishes it."""
        if self._scale is None or not m.ok or m.timing is None or self._ratio_known(m):
            return False
        self._held[ticket] = m
        self._refresh_incumbent()
        return True

    def _release_held(self, *, force: bool = False) -> None:
        """Finish the held results whose GPU has a ratio now; all of them when ``force``d (the
        loop stops) or when the pool has nothing else in flight, not even a timing of the
        incumbent (no round is coming back for them: they keep their raw median, with no ratio)."""
        if not self._held:
            return
        busy = self.pool.pending() or self.pool.calibrating()
        idle = force or not busy
        for ticket, m in list(self._held.items()):
            if idle or self._scale is None or self._ratio_known(m):
                del self._held[ticket]
                self._finish_ticket(ticket, m)

    def _ratio_known(self, m: Measurement) -> bool:
        """Whether ``m`` can be normalized now: timed beside the anchor, once the standard is
        known; else once its GPU has a ratio."""
        assert self._scale is not None
        if m.paired is not None:
            return self._by_pair(m)
        return self._scale.ratio(m.gpu.get("uuid")) is not None

    def _calibrated(self) -> None:
        """Take in the GPUs' timings of the anchor that came back (``pool.calibrations``)."""
        if self._scale is None:
            return
        for calibration in self.pool.calibrations():
            m = calibration.measurement
            if m.ok and m.timing is not None:
                if self._anchor_key is None:
                    self._anchor_key = params_key(calibration.params)
                    logger.info("the anchor every GPU times between its trials: %s", calibration.params)
                self._scale.observe(calibration.round, str(m.gpu.get("uuid") or ""), m.timing.median_ms)
            else:
                logger.warning("GPU %s could not time the anchor: %s", m.gpu.get("index"), m.reason)
        logger.debug("GPU ratios to the reference: %s", self._scale.ratios())

    def _refresh_incumbent(self) -> None:
        """Give the pool the best config so far (by normalized median), for every GPU to time
        now and then (several GPUs only)."""
        if self._scale is None:
            return
        best = self._best_known
        if best is None:  # nothing told yet: a held result serves (its GPU waits for a round)
            held = [(m.timing.median_ms, self._in_flight[t].key) for t, m in self._held.items()
                    if m.timing is not None]
            best = min(held) if held else None
        if best is None or best[1] == self._incumbent:
            return
        key = best[1]
        params = json.loads(key)
        try:
            source = self.family.render(params, self.problem)
            launch = self.family.launch(params, self.problem)
            options = tuple(self.family.compile_options(params, self.problem))
        except TemplateError:
            return
        self._incumbent = key
        self.pool.set_incumbent(params, source, launch, options)

    def _abandon_in_flight(self) -> None:
        for flight in list(self._in_flight.values()):
            self._mirror.abandon(flight.proposal)
            for follower in flight.followers:
                self._mirror.abandon(follower)
        self._in_flight.clear()
        self._in_flight_keys.clear()

