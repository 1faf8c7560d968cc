"""Compile on CPUs, measure on GPUs, through Ray; ticket in, Measurement out::

    with WorkerPool("attention", problem) as pool:        # one actor per GPU Ray sees
        pool.submit(7, params, None, launch, options)      # returns at once (None: rendered
                                                           # where it compiles; or a source)
        for ticket, measurement in pool.poll(timeout=1.0):
            ...
        retiming = pool.retime([(params, source, launch, options), ...])   # at the end, idle

With several GPUs, each re-times the study's incumbent now and then between its trials
(``set_incumbent``; rounds by ``workers.calibrate``), and ``calibrations()`` hands those timings
over, each with the GPU it ran on: the coordinator makes the GPUs' timings one set from them.

Each actor runs one measurement at a time with the next ones already sent (one or more:
``workers.depth``, from how long the coordinator stays away and how long a trial takes), so it
does not wait for the coordinator between trials; the rest of the queue stays here (a compiled
config goes to the GPU with the fewest sent: an idle one first), and a killed
actor loses nothing but the trial it was running (the one sent after it is measured again). A
measurement past ``measure_timeout_s`` kills and replaces its actor (failure ``timeout``); a
dead process (``worker``) or context (``crash``) is replaced too. Configs whose cubins are equal
are measured once. ``retime`` times several configs again, interleaved on one GPU actor
(``GpuBench.retime``), once nothing is in flight. ``replacements()`` says which tickets took a
worker down and how long its replacement took to be ready (the time a fault cost beyond its trial).

Every measurement takes one path: packed as one request (:mod:`workers.request`) and posted to
its GPU's host (:mod:`workers.mailbox`), a poll's measurements for a host in one call and what
finished in one call, instead of one Ray call a trial: a node agent in front of a node's GPU
actors (:mod:`workers.agent`), or a host of simulated GPUs (:mod:`workers.simulate`). A dead
agent is replaced, and its GPUs' actors with it.

The family is a reference every actor resolves in its own process (a name, a path, module:ATTR;
see ``workers.shipping``), or a family object, shipped by value. Each new actor is asked to load
it before its first trial: a node that cannot is a one-line WorkerError naming what to install.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError

from storage.records import params_key
from templates import get_family
from templates.family import DeviceLimits, KernelFamily, Launch, Problem, TemplateError
from workers.agent import AgentGpu, NodeAgent, Undelivered, node_id, on_node
from workers.calibrate import CALIBRATE_EVERY, CALIBRATE_TIMING, CalibrationSchedule
from workers.compile import binary_tags, check_toolkit_for_driver, default_cache_dir, toolkit_release
from workers.compile_task import SCREEN_SPILL_BYTES, CompileFailure, compile_task, screen, warm_compiler
from workers.depth import MAX_DEPTH, ActorDepth
from workers.errors import NoGPUError, WorkerError, summary_line
from workers.mailbox import Mailbox
from workers.pool_options import PoolOptions
from workers.ray_session import start_ray, stop_ray
from workers.request import pack
from workers.results import Binary, Calibration, CompileRequest, DeviceInfo, Measurement, Retiming
from workers.retime import MAX_SECONDS, ROUNDS
from workers.shipping import check_family, missing, runtime_env, ship
from workers.simulate import simulated_resources

logger = logging.getLogger(__name__)

_MAX_STARTS = 3  # consecutive actor deaths without a result before a GPU slot is given up
_START_TIMEOUT_S = 180.0
_COMPILE_GRACE_S = 30.0  # past compile_timeout_s the Ray task is cancelled by force


@dataclass
class _Ticket:
    ticket: int
    params: dict[str, Any]
    source: str | None  # None: rendered by the compile task
    launch: Launch
    options: tuple[str, ...]
    binary: Binary | None = None
    deadline: float = 0.0
    calibration: int = 0  # > 0: the incumbent, timed in this calibration round (no ticket)


@dataclass
class _Slot:
    actor: Any
    ready_ref: Any = None  # set while the actor is starting
    sent: deque[tuple[_Ticket, Any]] = field(default_factory=deque)  # (ticket, ref), in the actor's order
    deadline: float = 0.0  # of the first sent: the one the actor runs
    deaths: int = 0
    replacing: tuple[int | None, str, float] | None = None  # (ticket, why, since) until the new actor is ready
    gpu: dict[str, Any] = field(default_factory=dict)  # which GPU: {"uuid", "index", "name"}
    calibrated: int = 0  # the latest calibration round sent to it
    simulate: tuple[int, float] | None = None  # a replay standing for GPU i, factor f (tests)
    post_to: Any = None  # with a mailbox: what its measurements are posted to (.host, .index)
    generation: int = 0  # its actors started so far, less one (a node agent's letters name it)


@dataclass(frozen=True)
class Replacement:
    """A GPU worker killed and started again: for which ticket (None: a re-timing or the
    incumbent's calibration), why, and the seconds from the kill until the new actor was ready
    (told the problem, ``prepare`` done), or, while it is not (``ready`` False), until now."""

    ticket: int | None
    why: str
    seconds: float
    ready: bool = True


@dataclass
class _Hashes:
    done: dict[str, Measurement] = field(default_factory=dict)
    owner: dict[str, int] = field(default_factory=dict)  # hash -> ticket measuring it
    waiters: dict[str, list[_Ticket]] = field(default_factory=dict)


class WorkerPool:
    def __init__(self, family: str | KernelFamily, problem: Problem, options: PoolOptions | None = None,
                 **keywords: Any) -> None:
        """A pool for the family's ``problem``, run as ``options`` say (:class:`PoolOptions`;
        keywords replace its fields: ``WorkerPool(family, problem, replay=path)``)."""
        self.options = o = PoolOptions.of(options, keywords)
        ray_address, replay, simulate_gpus, worker_cls = o.ray_address, o.replay, o.simulate_gpus, o.worker_cls
        backend, replay_gpus, ship_folder = o.backend, o.replay_gpus, o.ship_folder
        if simulate_gpus is not None and (replay is None or simulate_gpus < 1):
            raise WorkerError("simulated GPUs need a replay landscape and a count of 1 or more")
        if o.gpus is not None and o.gpus < 1:
            raise WorkerError(f"a pool measures on 1 GPU or more, not {o.gpus}")
        self._simulate = simulate_gpus
        self._mail = Mailbox((), None)  # node agents or simulated GPUs: posted a host at a time (set at start)
        self._posted: dict[int, _Slot] = {}  # id(slot.post_to) -> its slot
        self._agents: list[Any] = []
        self.family, self.problem = family, problem
        self._replay = replay is not None
        self.recorded: tuple[Mapping[str, Any], ...] | None = None  # a replay's configs
        self._measure_timeout_s = o.measure_timeout_s
        self._compile_timeout_s = o.compile_timeout_s
        self._cache_dir = str(o.cache_dir if o.cache_dir is not None else default_cache_dir())
        self._backend, self._seed = backend, o.seed
        self._timing = o.timing
        self._screen_spill_bytes = o.screen_spill_bytes
        self._abort_above_ms: float | None = None
        self._calibrate = (o.calibrate_every, o.calibrate_seconds)
        self._schedule: CalibrationSchedule | None = None  # set when there are several GPUs
        self._calibrations: list[Calibration] = []
        self._depth = ActorDepth()  # measurements sent to each actor at once
        self._replay_gpus = tuple(float(f) for f in replay_gpus) if replay_gpus else ()
        if self._replay_gpus and replay is None:
            raise ValueError("replay_gpus goes with replay")
        ship_folder = ray_address is not None if ship_folder is None else ship_folder
        self._owns_ray = start_ray(ray_address, need_gpu=replay is None and worker_cls is None,
                                   runtime_env=runtime_env(family) if ship_folder else None,
                                   resources=simulated_resources(simulate_gpus))
        cpus = int(ray.cluster_resources().get("CPU", os.cpu_count() or 1))
        self._compile_workers = max(1, o.compile_workers or cpus)
        self._compile = ray.remote(num_cpus=1, max_retries=0)(compile_task)
        self._compile_queue: deque[_Ticket] = deque()
        self._compiling: dict[Any, _Ticket] = {}
        self._measure_queue: deque[_Ticket] = deque()
        self._owners: dict[Any, _Slot] = {}  # a starting actor's ready ref -> its slot
        self._hashes = _Hashes()
        self._results: list[tuple[int, Measurement]] = []
        self._replaced: list[Replacement] = []  # replacements whose new actor is ready
        self._known: set[int] = set()
        self._returned = 0
        self.gpu_busy_seconds = 0.0  # the GPU actors' time measuring (shared results: none)
        self.kernel_busy_seconds = 0.0  # of which the GPU ran the kernels
        self.flush_busy_seconds = 0.0  # and flushed the L2 before timed launches
        self._closed = False
        if replay is None:  # each CPU's worker loads the compiler while the GPU actors start
            warm = ray.remote(num_cpus=1, max_retries=0)(warm_compiler)
            for _ in range(self._compile_workers):
                warm.remote(backend)  # runs whether or not its answer is kept (it is not read)
        try:
            self._shipment = ship(family, to_cluster=ship_folder)
            self._start_actors(worker_cls, replay)
            if replay is None:
                check_toolkit_for_driver(toolkit_release(backend), self.device.cuda_version)
        except BaseException:
            self.close()
            raise

    # -- actors -------------------------------------------------------------------------------
    def _start_actors(self, worker_cls: type | None, replay: str | Path | None) -> None:
        if replay is not None:
            from workers.replay import ReplayBench

            self.recorded = self._recorded(replay, self.problem)
            if self._simulate:
                self._start_simulated(str(replay), min(self._simulate, self.options.gpus or self._simulate))
                return
            cls, options = worker_cls or ReplayBench, {"num_gpus": 0}
            if self._replay_gpus and not hasattr(cls, "simulate"):
                raise ValueError(f"replay_gpus needs a worker with simulate(); {cls.__name__} has none")
            args = (str(replay), self._shipment.ref)
        else:
            from workers.gpu import GpuBench

            cls, args, options = worker_cls or GpuBench, (), {"num_gpus": 1}
        options = {"num_cpus": 0, "max_restarts": 0, **options, **getattr(cls, "ray_options", {})}
        if options["num_gpus"] > 0:
            gpus = ray.cluster_resources().get("GPU", 0)
            if gpus < options["num_gpus"]:
                raise NoGPUError(
                    f"no GPU visible to Ray: the cluster has {gpus:g} GPU(s); run on a GPU machine, "
                    "pass ray_address=... of a cluster with GPUs, or replay=<landscape.json>")
            count = int(gpus // options["num_gpus"])
        else:
            count = len(self._replay_gpus) or int(getattr(cls, "num_workers", 1))
        count = min(count, self.options.gpus or count)
        self._worker_cls = cls
        self._actor_cls = ray.remote(cls).options(**options)
        self._actor_args = args
        self._prepares = hasattr(cls, "prepare")
        if not hasattr(cls, "measure_request"):
            raise WorkerError(f"{cls.__name__} takes no measurement requests: derive it from "
                              "workers.request.TakesRequests")
        self._slots = [_Slot(self._actor_cls.remote(*args)) for _ in range(count)]
        infos = []
        for i, slot in enumerate(self._slots):
            try:
                infos.append(ray.get(slot.actor.device_info.remote(), timeout=_START_TIMEOUT_S))
                if replay is None:  # a replay's numbers were recorded: no GPU of this run's
                    slot.gpu = dict(infos[-1].identity)
                if self._replay_gpus:
                    slot.simulate = (i, self._replay_gpus[i])
                    slot.gpu = ray.get(slot.actor.simulate.remote(*slot.simulate), timeout=_START_TIMEOUT_S)
            except RayError as exc:
                raise WorkerError(f"a worker failed to start: {summary_line(exc)}") from None
        if replay is None:  # a replay answers from its landscape: its actors need no family
            self._check_family()
        for slot in self._slots:  # after device_info: the pool does not wait for it
            self._prepare(slot)
        self._start_agents()
        self.device: DeviceInfo = infos[0]
        if any(info.name != self.device.name for info in infos):
            logger.warning("the GPUs differ: %s", sorted({i.name for i in infos}))
        if len(self._slots) > 1:
            every, seconds = self._calibrate
            self._schedule = CalibrationSchedule(len(self._slots), every=every, seconds=seconds)

    def _recorded(self, replay: str | Path, problem: Problem) -> tuple[Mapping[str, Any], ...]:
        """The configs the landscape ``replay`` records, or WorkerError where it records
        another family or problem."""
        from workers.replay import load_landscape

        landscape = load_landscape(replay, self.family)
        name = self._family_name()
        if landscape.family not in (self.family, name) or landscape.problem != problem:
            raise WorkerError(
                f"landscape {replay} records {landscape.family} {landscape.problem.key}, "
                f"not {name} {problem.key}")
        return tuple(params for params, _ in landscape.entries)

    def _start_agents(self) -> None:
        """One :class:`workers.agent.NodeAgent` on each node of the GPU actors, each slot posted
        to its node's agent."""
        try:
            nodes = ray.get([slot.actor.__ray_call__.remote(node_id) for slot in self._slots],
                            timeout=_START_TIMEOUT_S)
        except RayError as exc:
            raise WorkerError(f"a worker failed to start: {summary_line(exc)}") from None
        on: dict[str, dict[int, _Slot]] = {}
        for index, (slot, node) in enumerate(zip(self._slots, nodes)):
            on.setdefault(node, {})[index] = slot
        agents = {node: self._new_agent(node, {i: slot.actor for i, slot in slots.items()})
                  for node, slots in on.items()}
        for node, slots in on.items():
            for index, slot in slots.items():
                slot.post_to = AgentGpu(agents[node], index)
        try:  # each agent connected to its actors before a trial's time runs
            ray.get([agent.ready.remote() for agent in agents.values()], timeout=_START_TIMEOUT_S)
        except RayError as exc:
            raise WorkerError(f"a node agent failed to start: {summary_line(exc)}") from None
        self._mail = Mailbox((self._shipment.ref,), None)
        self._posted = {id(slot.post_to): slot for slot in self._slots}
        logger.info("%d GPU workers called through %d node agents", len(self._slots), len(agents))

    def _new_agent(self, node: str | None, actors: Mapping[int, Any]) -> Any:
        """A node agent calling ``actors`` (slot number -> actor), on ``node`` where it can."""
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0}
        if node is not None:
            options["scheduling_strategy"] = on_node(node)
        agent = ray.remote(NodeAgent).options(**options).remote(dict(actors))
        self._agents.append(agent)
        return agent

    def _agent_lost(self, host: Any, why: str) -> None:
        """A node agent died (its node, say): a new one takes its slots, whose actors are
        replaced (the measurements they held go again, as a dead actor's do)."""
        logger.warning("a node agent died: %s", why)
        self._mail.forget(host)  # type: ignore[union-attr]
        agent = self._new_agent(None, {})
        for slot in [s for s in self._slots if s.post_to.host is host]:
            del self._posted[id(slot.post_to)]
            slot.post_to = AgentGpu(agent, slot.post_to.index)
            self._posted[id(slot.post_to)] = slot
            self._replace(slot, f"its node agent died: {why}", count=False)

    def _start_simulated(self, replay: str, gpus: int) -> None:
        """``gpus`` simulated GPUs on host actors (:mod:`workers.simulate`), a slot each."""
        from workers.simulate import RESOURCE, SimulatedGpu, SimulatedGpus, host_counts

        have = ray.cluster_resources().get(RESOURCE, 0)
        if have < gpus:
            raise WorkerError(f"{gpus} simulated GPUs asked, but Ray has {have:g} of the resource "
                              f"{RESOURCE!r} (start it with resources={{{RESOURCE!r}: {gpus}}})")
        self._hosts = []
        for count in host_counts(gpus):
            cls = ray.remote(SimulatedGpus).options(num_cpus=0, max_restarts=0,
                                                    resources={RESOURCE: count})
            self._hosts.append((cls.remote(replay, self._shipment.ref, count), count))
        self._actor_cls, self._actor_args, self._prepares = None, (), False
        self._mail = Mailbox((self._shipment.ref,), None)
        self._slots = [_Slot(SimulatedGpu(host, i)) for host, count in self._hosts for i in range(count)]
        for slot in self._slots:
            slot.post_to = slot.actor
        self._posted = {id(slot.post_to): slot for slot in self._slots}
        try:
            infos = ray.get([host.device_info.remote() for host, _ in self._hosts], timeout=_START_TIMEOUT_S)
        except RayError as exc:
            raise WorkerError(f"a simulated GPU host failed to start: {summary_line(exc)}") from None
        self.device = infos[0]

    def busy_intervals(self) -> list[tuple[int, float, float]]:
        """Simulated GPUs: (gpu, start, end) of each measurement, ``time.monotonic`` seconds,
        GPUs numbered across hosts; [] for real GPUs."""
        out, first = [], 0
        for host, count in getattr(self, "_hosts", []):
            out += [(first + gpu, a, b) for gpu, a, b in ray.get(host.intervals.remote())]
            first += count
        return out

    def simulator_lateness(self) -> list[float]:
        """Simulated GPUs: how late (seconds) each measurement's sleep ended past its GPU time."""
        return [late for host, _ in getattr(self, "_hosts", []) for late in ray.get(host.lateness.remote())]

    def simulator_cpu_seconds(self) -> float:
        """The CPU time the simulated GPUs' host processes used (0 for real GPUs)."""
        return float(sum(ray.get([host.cpu_seconds.remote() for host, _ in getattr(self, "_hosts", [])])))

    def _family_name(self) -> str:
        """The family's name (a landscape records it), or the reference when it does not load."""
        try:
            return get_family(self.family).name
        except TemplateError:
            return str(self.family)

    def _check_family(self) -> None:
        """That every actor loads the family in its process (on its node), or WorkerError."""
        refs = [slot.actor.__ray_call__.remote(check_family, self._shipment.ref) for slot in self._slots]
        for ref in refs:
            try:
                why = ray.get(ref, timeout=_START_TIMEOUT_S)
            except RayError as exc:
                why = summary_line(exc.cause if isinstance(exc, RayTaskError) and exc.cause else exc)
            if why is not None:
                raise missing(self._shipment, why)

    def _prepare(self, slot: _Slot) -> None:
        """Have a new actor draw and upload the problem's inputs now, while the first configs
        are asked and compiled (it answers nothing: a failure shows in the first measurement)."""
        if self._prepares:
            slot.actor.prepare.remote(self._shipment.ref, self.problem, self._seed)

    def _replace(self, slot: _Slot, why: str, *, count: bool = True, ticket: int | None = None) -> None:
        """Kill the slot's actor and start a new one; ``count`` deaths that are the worker's.
        The time until the new actor is ready is kept against ``ticket`` (:meth:`replacements`;
        a new actor that fails to start and is replaced again adds to the first one's time)."""
        logger.warning("replacing a worker: %s", why)
        if self._simulate:  # a host holds many simulated GPUs, and they do not die
            raise WorkerError(f"a simulated GPU failed: {why}")
        if slot.replacing is None:
            slot.replacing = (ticket, why, time.monotonic())
        ray.kill(slot.actor, no_restart=True)
        self._owners.pop(slot.ready_ref, None)
        for item, _ in reversed(slot.sent):  # sent after the culprit: measured again, first
            if item.calibration:  # the incumbent is timed again by the new actor
                slot.calibrated = min(slot.calibrated, item.calibration - 1)
            else:
                self._measure_queue.appendleft(item)
        slot.sent.clear()
        slot.deaths = slot.deaths + 1 if count else 0
        if slot.deaths > _MAX_STARTS:
            self._ready(slot, ready=False)
            self._slots.remove(slot)
            if not self._slots:
                raise WorkerError(f"every worker died {_MAX_STARTS} times in a row; last: {why}")
            return
        slot.actor = self._actor_cls.remote(*self._actor_args)
        slot.generation += 1
        if slot.post_to is not None:  # its node agent calls the new actor from now on
            slot.post_to.host.adopt.remote(slot.post_to.index, slot.generation, slot.actor)
        if slot.simulate is not None:  # the same simulated GPU (calls run in order: before any trial)
            slot.actor.simulate.remote(*slot.simulate)
        self._prepare(slot)
        slot.ready_ref = slot.actor.__ray_ready__.remote()
        self._owners[slot.ready_ref] = slot

    # -- public surface -----------------------------------------------------------------------
    def retarget(self, problem: Problem, replay: str | Path | None = None) -> bool:
        """Serve another problem of the family with the same actors and node agents, as a new
        pool would: the tickets, results, busy seconds, replacements, calibrations and the
        anchor start over, and each actor is told the problem (a GPU's draws and uploads its
        inputs, freeing the last problem's; a replay's loads ``replay``, the problem's
        landscape). False, changing nothing, where the pool cannot: closed, work in flight,
        simulated GPUs or replays standing for several GPUs, a replay pool without a landscape
        or whose worker cannot load another, a GPU pool given one. A landscape of another
        problem raises WorkerError, the pool unchanged."""
        busy = self.pending() or self._compiling or self._compile_queue or self._measure_queue or any(
            slot.sent for slot in self._slots)
        if self._closed or busy or self._simulate or self._replay_gpus or (replay is None) == self._replay:
            return False
        if self._replay:
            if not hasattr(self._worker_cls, "load"):
                return False
            self._load(problem, replay)
        self.problem = problem
        self._start_over()
        for slot in self._slots:
            self._prepare(slot)
        return True

    def _load(self, problem: Problem, replay: str | Path) -> None:
        """Each replay actor answers from ``replay`` (``problem``'s landscape) from now on."""
        recorded = self._recorded(replay, problem)
        try:
            infos = ray.get([slot.actor.load.remote(str(replay), self._shipment.ref) for slot in self._slots],
                            timeout=_START_TIMEOUT_S)
        except RayError as exc:
            raise WorkerError(f"a worker failed to load {replay}: {summary_line(exc)}") from None
        self.recorded, self._actor_args = recorded, (str(replay), self._shipment.ref)
        self.device = infos[0] if infos else self.device

    def _start_over(self) -> None:
        """What one problem's study left in the pool, dropped (:meth:`retarget`)."""
        self._hashes, self._results, self._replaced = _Hashes(), [], []
        self._known, self._returned = set(), 0
        self.gpu_busy_seconds = self.kernel_busy_seconds = self.flush_busy_seconds = 0.0
        self._abort_above_ms = None
        self._calibrations = []
        self._depth = ActorDepth()
        for slot in self._slots:
            slot.calibrated = 0
        if len(self._slots) > 1:
            every, seconds = self._calibrate
            self._schedule = CalibrationSchedule(len(self._slots), every=every, seconds=seconds)

    @property
    def limits(self) -> DeviceLimits:
        return self.device.limits

    @property
    def compile_workers(self) -> int:
        """Configs compiled at once (one a CPU of the cluster, unless told)."""
        return self._compile_workers

    @property
    def num_gpus(self) -> int:
        """GPUs measuring (a replay's: none, unless it stands for several: ``replay_gpus``)."""
        return len(self._slots) if not self._replay or self._replay_gpus or self._simulate else 0

    @property
    def gpus(self) -> list[dict[str, Any]]:
        """Each worker's GPU, ``{"uuid", "index", "name"}``; the first is where ``retime`` runs.
        Simulated GPUs: none (they are the landscape's one GPU, with nothing to normalize)."""
        return [] if self._simulate else [dict(slot.gpu) for slot in self._slots]

    def set_incumbent(self, params: Mapping[str, Any], source: str, launch: Launch,
                      options: tuple[str, ...]) -> None:
        """The study's best config so far: with several GPUs, the first one that can be timed
        becomes the study's anchor, which each GPU times again between its trials, in rounds
        (``workers.calibrate``); the timings come out of :meth:`calibrations`. With one GPU, or
        once the anchor is chosen, it does nothing."""
        if self._schedule is None or self._schedule.anchored:
            return
        key = params_key(params)
        if key == self._schedule.key:
            return
        item = _Ticket(-1, dict(params), source, launch, tuple(options), calibration=1)
        self._schedule.offer(key, item)
        if self._replay:
            self._schedule.ready(key)
        else:  # compiled first (the cache answers: it was measured)
            self._compile_queue.appendleft(item)
        self._pump()

    def calibrations(self) -> list[Calibration]:
        """The incumbent's timings that came back since the last call, each with its GPU."""
        out, self._calibrations = self._calibrations, []
        return out

    def submit(self, ticket: int, params: Mapping[str, Any], source: str | None, launch: Launch,
               options: tuple[str, ...]) -> None:
        """Queue a config; ``source`` None: the compile task renders it (a replay compiles nothing)."""
        if ticket in self._known:
            raise ValueError(f"ticket {ticket} was already submitted")
        self._known.add(ticket)
        item = _Ticket(ticket, dict(params), source, launch, tuple(options))
        (self._measure_queue if self._replay else self._compile_queue).append(item)
        if not self._simulate:  # simulated GPUs get their work by the poll (Mailbox.flush)
            self._pump()

    def set_abort_above(self, ms: float | None) -> None:
        """Measurements dispatched from now on stop timing once clearly slower than ``ms``."""
        self._abort_above_ms = ms

    def replacements(self) -> list[Replacement]:
        """Every GPU worker replaced so far (a crash, a hang, a dead process), with the time it
        took to have a new one ready; one still starting counts its time until now."""
        now = time.monotonic()
        starting = [Replacement(s.replacing[0], s.replacing[1], now - s.replacing[2], ready=False)
                    for s in self._slots if s.replacing is not None]
        return [*self._replaced, *starting]

    def _ready(self, slot: _Slot, *, ready: bool = True) -> None:
        """The slot's new actor is ready (or given up): its replacement's time is kept."""
        if slot.replacing is not None:
            ticket, why, since = slot.replacing
            self._replaced.append(Replacement(ticket, why, time.monotonic() - since, ready=ready))
            slot.replacing = None

    def pending(self) -> int:
        """Tickets submitted and not yet returned by ``poll``."""
        return len(self._known) - self._returned

    def calibrating(self) -> bool:
        """Whether a timing of the incumbent is on its way (compiling, or sent to a GPU): a
        result held for its GPU's first ratio may wait for it."""
        compiling = list(self._compiling.values()) + list(self._compile_queue)
        return any(item.calibration for item in compiling) or any(
            item.calibration for slot in self._slots for item, _ in slot.sent)

    def poll(self, timeout: float) -> list[tuple[int, Measurement]]:
        """Finished tickets; waits up to ``timeout`` seconds for the first one."""
        self._depth.entered(time.monotonic())
        try:
            return self._poll(timeout)
        finally:
            self._depth.left(time.monotonic())

    max_actor_depth = MAX_DEPTH  # measurements a GPU actor may hold at once (``workers.depth``)

    def _poll(self, timeout: float) -> list[tuple[int, Measurement]]:
        end = time.monotonic() + max(timeout, 0.0)
        while True:
            self._pump()
            self._expire()
            self._mail.flush()  # and a new collect only to wait on (the poll's last made one)
            refs = list(self._compiling) + list(self._owners) + self._mail.collecting(issue=not self._results)
            now = time.monotonic()
            if self._results or not refs or now >= end:
                break
            deadlines = [s.deadline for s in self._slots if s.sent]
            deadlines += [t.deadline for t in self._compiling.values()]
            wait = max(0.0, min([end] + deadlines) - now)
            ready, _ = ray.wait(refs, num_returns=1, timeout=wait)
            if ready:
                self._take_in(refs)
        # the next collect leaves now and answers a while before the coordinator is back: it does
        # not wait on a round trip to the host then (3-4 ms a poll, 7% of its time)
        self._mail.collecting(hold=self._depth.hold())
        out, self._results = self._results, []
        self._returned += len(out)
        return out

    def serve(self) -> None:
        """Between the coordinator's asks, without waiting: what finished is taken in (finished
        trials come out of the next :meth:`poll`) and compiled configs go to the GPUs that have
        room. A coordinator that asks a while (a slow sampler, many results at once) keeps its
        GPUs fed: a GPU holds its running trial and one to three more, and a short trial ends in
        tens of milliseconds. With a mailbox (node agents, simulated GPUs) what was posted
        goes, and a collect that answered is taken in (a host with letters out and no collect
        gets one)."""
        self._depth.entered(time.monotonic())
        self._pump()
        self._mail.flush()
        refs = list(self._compiling) + list(self._owners) + self._mail.collecting()
        if refs and self._take_in(refs):
            self._pump()
            self._mail.flush()
        self._depth.left(time.monotonic())

    def _take_in(self, refs: list[Any]) -> int:
        """Handle those of ``refs`` that are ready now (each host's answer in its actors' order)."""
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            self._handle(ref)
        return len(ready)

    def retime(self, kernels: Sequence[tuple[Mapping[str, Any], str, Launch, Sequence[str]]], *,
               rounds: int = ROUNDS, max_seconds: float = MAX_SECONDS) -> Retiming:
        """Time configs (params, source, launch, options) again, interleaved on one GPU actor:
        compiled (the cache answers), then ``GpuBench.retime``. One Measurement per config, in
        order; a config that fails to compile or run, a hang or a dead worker fails in the
        result, never raises. Call it when nothing is in flight (at the end of a study)."""
        if self.pending():
            raise ValueError(f"retime with {self.pending()} tickets in flight")
        binaries = [None] * len(kernels) if self._replay else self._compile_now(kernels)
        settled: dict[int, Measurement] = {i: b for i, b in enumerate(binaries) if isinstance(b, Measurement)}
        todo = [i for i in range(len(kernels)) if i not in settled]
        retiming = Retiming((), rounds=0)
        if todo:
            retiming = self._retime_on_actor([(binaries[i], kernels[i][2]) for i in todo],
                                             [dict(kernels[i][0]) for i in todo], rounds, max_seconds)
            settled.update(zip(todo, retiming.measurements))
        self._add_busy(retiming)
        out = []
        for i, binary in enumerate(binaries):
            m = settled[i]
            if isinstance(binary, Binary):
                m = replace(m, **binary_tags(binary, m.resources))
            out.append(replace(m, replayed=True) if self._replay else m)
        return replace(retiming, measurements=tuple(out), replayed=self._replay)

    def _compile_now(self, kernels: Sequence[tuple[Mapping[str, Any], str, Launch, Sequence[str]]]
                     ) -> list[Binary | Measurement]:
        """Compile configs in parallel and wait for them (cache hits, for configs measured before)."""
        refs = [self._compile.remote(CompileRequest(source, launch.kernel, tuple(options)),
                                     self._backend, self._cache_dir, self._compile_timeout_s)
                for _, source, launch, options in kernels]
        end = time.monotonic() + self._compile_timeout_s + _COMPILE_GRACE_S
        out: list[Binary | Measurement] = []
        for ref in refs:
            try:
                result = ray.get(ref, timeout=max(0.0, end - time.monotonic()))
            except GetTimeoutError:
                ray.cancel(ref, force=True)
                result = Measurement.failed("compile", f"compile ran past {self._compile_timeout_s:g} s")
            except RayError as exc:
                result = Measurement.failed("worker", f"compile task died: {summary_line(exc)}")
            if isinstance(result, CompileFailure):
                result = Measurement.failed("compile", result.reason, detail=result.log[-4000:])
            out.append(result)
        return out

    def _retime_on_actor(self, kernels: list[tuple[Any, Launch]], params: list[dict[str, Any]],
                         rounds: int, max_seconds: float) -> Retiming:
        """The first actor's ``retime``; a hang, a dead process or a dead context replaces it."""
        def failed(kind: str, reason: str, **extra: Any) -> Retiming:
            return Retiming(tuple(Measurement.failed(kind, reason, **extra) for _ in kernels), rounds=0)

        if not self._slots:
            return failed("worker", "no GPU worker is left")
        slot = self._slots[0]
        deadline = self._measure_timeout_s * (1 + len(kernels)) + max_seconds
        try:
            if slot.ready_ref is not None:  # a replacement still starting
                self._owners.pop(slot.ready_ref, None)
                ray.get(slot.ready_ref, timeout=_START_TIMEOUT_S)
                slot.ready_ref = None
                self._ready(slot)
            ref = slot.actor.retime.remote(kernels, self._shipment.ref, self.problem, params=params,
                                           seed=self._seed, rounds=rounds, max_seconds=max_seconds)
            retiming = ray.get(ref, timeout=deadline)
        except GetTimeoutError:
            self._replace_quietly(slot, f"the re-timing ran past {deadline:g} s", count=False)
            return failed("timeout", f"the re-timing ran past {deadline:g} s; the worker was replaced")
        except RayActorError as exc:
            self._replace_quietly(slot, f"the worker process died: {summary_line(exc)}")
            return failed("worker", "the worker process died during the re-timing; it was replaced",
                          detail=summary_line(exc))
        except RayTaskError as exc:  # the bench raised: the re-timing fails, the worker stays
            return failed("worker", summary_line(exc.cause or exc), detail=str(exc)[-2000:])
        if any(m.failure == "crash" for m in retiming.measurements):
            self._replace_quietly(slot, "the CUDA context died during the re-timing", count=False)
        return retiming if retiming.gpu else replace(retiming, gpu=dict(slot.gpu))

    def _add_busy(self, work: Measurement | Retiming) -> None:
        """Count a measurement's (or re-timing's) GPU time: the worker's, the kernels', the flushes'."""
        self.gpu_busy_seconds += work.gpu_seconds
        self.kernel_busy_seconds += work.kernel_seconds
        self.flush_busy_seconds += work.flush_seconds

    def _replace_quietly(self, slot: _Slot, why: str, *, count: bool = True) -> None:
        """``_replace``, where losing the last worker is left to the next submit to report."""
        try:
            self._replace(slot, why, count=count)
        except WorkerError as exc:
            logger.warning("%s", exc)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for ref in self._compiling:
            ray.cancel(ref, force=True)
        for slot in getattr(self, "_slots", []) if not getattr(self, "_simulate", None) else []:
            ray.kill(slot.actor, no_restart=True)
        for host, _ in getattr(self, "_hosts", []):
            ray.kill(host, no_restart=True)
        for agent in getattr(self, "_agents", []):
            ray.kill(agent, no_restart=True)
        if self._owns_ray:
            stop_ray()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the machine --------------------------------------------------------------------------
    def _pump(self) -> None:
        while self._compile_queue and len(self._compiling) < self._compile_workers:
            item = self._compile_queue.popleft()
            request = CompileRequest(item.source or "", item.launch.kernel, item.options)
            render = () if item.source is not None else (self._shipment.ref, self.problem, item.params)
            ref = self._compile.remote(request, self._backend, self._cache_dir, self._compile_timeout_s,
                                       *render)
            item.deadline = time.monotonic() + self._compile_timeout_s + _COMPILE_GRACE_S
            self._compiling[ref] = item
        depth = self._depth.value
        room = [slot for slot in self._slots if slot.ready_ref is None and len(slot.sent) < depth]
        for slot in room:
            self._calibrate_on(slot)
        # the GPU with the fewest sent first (the first of those in the pool's order): an idle GPU
        # before a place behind another's running trial (the last trials of a study went to the
        # first GPU while the second idled); a heap, not a scan of 64 GPUs a trial
        free = [(len(slot.sent), i, slot) for i, slot in enumerate(room) if len(slot.sent) < depth]
        heapq.heapify(free)
        while self._measure_queue and free:
            sent, i, slot = heapq.heappop(free)
            self._dispatch(slot, self._measure_queue.popleft())
            if sent + 1 < depth:
                heapq.heappush(free, (sent + 1, i, slot))

    def _dispatch(self, slot: _Slot, item: _Ticket) -> None:
        timing = self._timing
        if item.calibration:  # the incumbent, never stopped early, and with fewer repetitions
            timing = replace(timing, **{k: min(v, getattr(timing, k)) for k, v in CALIBRATE_TIMING.items()})
        elif self._abort_above_ms is not None and timing.abort_above_ms is None:
            timing = replace(timing, abort_above_ms=self._abort_above_ms)
        anchor = self._schedule.anchor if self._schedule is not None and not item.calibration else None
        if anchor is not None and anchor.binary is not None and item.binary is not None:
            timing = replace(timing, anchor=(anchor.binary, anchor.launch))  # timed beside it (workers.paired)
        if not slot.sent:
            slot.deadline = time.monotonic() + self._measure_timeout_s
        # to its GPU's host (a node agent, simulated GPUs), with the poll's others (Mailbox.flush)
        request = pack(item.binary, item.launch, self.problem, item.params, {"seed": self._seed, "timing": timing},
                       by_value=not isinstance(self._shipment.ref, str))
        slot.sent.append((item, self._mail.post(slot.post_to, slot.generation, request)))

    def _expire(self) -> None:
        now = time.monotonic()
        for slot in list(self._slots):
            if slot.sent and now > slot.deadline:
                item, _ = slot.sent.popleft()
                # a hang is the kernel's fault, not the worker's: it does not count as a death
                self._replace(slot, f"ticket {item.ticket} ran past {self._measure_timeout_s:g} s",
                              count=False, ticket=_culprit(item))
                self._done(slot, item, Measurement.failed(
                    "timeout", f"ran past {self._measure_timeout_s:g} s; the worker was replaced"))
        for ref, item in list(self._compiling.items()):
            if now > item.deadline:
                ray.cancel(ref, force=True)
                del self._compiling[ref]
                if item.calibration:
                    self._incumbent_compiled(item, None)
                    continue
                self._resolve(item, Measurement.failed(
                    "compile", f"compile ran past {self._compile_timeout_s:g} s"))

    def _handle(self, ref: Any) -> None:
        if ref in self._compiling:
            item = self._compiling.pop(ref)
            try:
                result = ray.get(ref)
            except RayError as exc:
                if item.calibration:
                    self._incumbent_compiled(item, None)
                    return
                self._resolve(item, Measurement.failed("worker", f"compile task died: {summary_line(exc)}"))
                return
            if item.calibration:
                self._incumbent_compiled(item, result)
            elif isinstance(result, CompileFailure):
                self._resolve(item, Measurement.failed("compile", result.reason, detail=result.log[-4000:]))
            else:
                item.binary = result
                self._compiled(item)
            return
        if self._mail.owns(ref):
            self._delivered(ref)
            return
        slot = self._owners.pop(ref, None)  # a new actor's start
        if slot is None or ref is not slot.ready_ref:
            return
        slot.ready_ref = None
        try:
            ray.get(ref)
        except RayError as exc:
            self._replace(slot, f"the worker failed to start: {summary_line(exc)}")
        else:
            self._ready(slot)

    def _settle(self, slot: _Slot, key: Any, result: Measurement | Undelivered) -> None:
        """A measurement sent to ``slot`` (``key``: its ref or letter) answered, or failed."""
        running = bool(slot.sent) and slot.sent[0][1] is key
        item = self._received(slot, key)
        if isinstance(result, Measurement):
            measurement = result
            slot.deaths = 0
            if measurement.failure == "crash":  # the CUDA context is gone with the kernel
                self._replace(slot, f"ticket {item.ticket}: {measurement.reason}", count=False,
                              ticket=_culprit(item))
        elif result.kind == "died":
            if not running and slot.sent:
                # Ray may report a queued measurement's loss before the running one's: the one
                # that died with the actor is the running one; this one never ran, and goes again
                self._again(slot, item)
                item, _ = slot.sent.popleft()
            self._replace(slot, f"the worker process died: {result.text}", ticket=_culprit(item))
            measurement = Measurement.failed("worker", "the worker process died; it was replaced",
                                             detail=result.text)
        elif result.kind == "raised":  # the bench raised: the trial fails, the worker stays
            measurement = Measurement.failed("worker", result.text, detail=result.detail)
        else:  # posted for an actor replaced since (its letters left the slot then): again
            self._again(slot, item)
            return
        self._done(slot, item, measurement)

    def _again(self, slot: _Slot, item: _Ticket) -> None:
        """A measurement that never ran goes again (the incumbent: in the slot's next round)."""
        if item.calibration:
            slot.calibrated = min(slot.calibrated, item.calibration - 1)
        else:
            self._measure_queue.appendleft(item)

    def _delivered(self, ref: Any) -> None:
        """A host's ``collect`` answered (a node agent's, simulated GPUs'): each result to its
        slot; one for a measurement the slot no longer holds (its actor was replaced, or the
        measurement ran past its time) is dropped."""
        try:
            answer = ray.get(ref)
        except RayError as exc:
            if self._simulate:
                raise WorkerError(f"a simulated GPU host failed: {summary_line(exc)}") from None
            self._agent_lost(self._mail.host_of(ref), summary_line(exc))
            return
        for letter, result in self._mail.open(answer, ref):
            slot = self._posted.get(id(letter.gpu))
            if slot is not None and any(sent is letter for _, sent in slot.sent):
                self._settle(slot, letter, result)

    def _received(self, slot: _Slot, ref: Any) -> _Ticket:
        """Take a finished measurement off its slot; the next sent is now running."""
        index = next(i for i, (_, sent) in enumerate(slot.sent) if sent is ref)
        item, _ = slot.sent[index]
        del slot.sent[index]
        if index == 0 and slot.sent:
            slot.deadline = time.monotonic() + self._measure_timeout_s
        return item

    # -- the incumbent, timed on every GPU -----------------------------------------------------
    def _incumbent_compiled(self, item: _Ticket, result: Any) -> None:
        """The incumbent's compile came back: it can be timed, or (a failure) it is dropped."""
        assert self._schedule is not None
        key = params_key(item.params)
        if isinstance(result, Binary):
            item.binary = result
            self._schedule.ready(key)
        else:
            logger.warning("the incumbent could not be compiled again: the GPUs keep their ratios")
            self._schedule.drop(key)

    def _calibrate_on(self, slot: _Slot) -> None:
        """Send the current round's incumbent to ``slot``, ahead of the trials queued, once."""
        due = self._schedule.due(slot.calibrated) if self._schedule is not None else None
        if due is None:
            return
        number, incumbent = due
        slot.calibrated = number
        self._dispatch(slot, replace(incumbent, calibration=number))

    def _done(self, slot: _Slot, item: _Ticket, measurement: Measurement) -> None:
        """A measurement came back from ``slot`` (or failed there): tagged with its GPU, it
        answers its ticket, or is a calibration (the incumbent's timing on that GPU)."""
        if not measurement.gpu and slot.gpu:
            measurement = replace(measurement, gpu=dict(slot.gpu))
        self._depth.measured(measurement.gpu_seconds)
        if not item.calibration:
            if self._schedule is not None:
                self._schedule.counted()
            self._finish(item, measurement)
            return
        self._add_busy(measurement)
        if self._replay:
            measurement = replace(measurement, replayed=True)
        self._calibrations.append(Calibration(item.calibration, dict(item.params), measurement))

    # -- tickets ------------------------------------------------------------------------------
    @staticmethod
    def _key(item: _Ticket) -> str:
        """Equal cubin and equal launch (grid, block, smem, args): one measurement serves both."""
        launch = json.dumps(item.launch.to_json(), sort_keys=True, default=str)
        return f"{item.binary.cubin_hash}:{launch}"  # type: ignore[union-attr]

    def _compiled(self, item: _Ticket) -> None:
        reason = screen(item.binary, self._screen_spill_bytes, item.launch, self.limits)
        if reason is not None:
            self._resolve(item, Measurement.failed("screened", reason))
            return
        digest = self._key(item)
        hashes = self._hashes
        if digest in hashes.done:
            self._resolve(item, self._shared(hashes.done[digest], hashes.owner.get(digest)))
        elif digest in hashes.owner:
            hashes.waiters.setdefault(digest, []).append(item)
        else:
            hashes.owner[digest] = item.ticket
            self._measure_queue.append(item)

    def _finish(self, item: _Ticket, measurement: Measurement) -> None:
        """A measured ticket is done: answer it and every ticket waiting on the same cubin."""
        self._resolve(item, measurement)
        if item.binary is None:
            return
        digest, hashes = self._key(item), self._hashes
        waiters = hashes.waiters.pop(digest, [])
        if measurement.failure == "worker":  # not the cubin's fault: measure it again
            hashes.owner.pop(digest, None)
            for waiter in waiters:
                self._compiled(waiter)
            return
        hashes.done[digest] = measurement
        for waiter in waiters:
            self._resolve(waiter, self._shared(measurement, item.ticket))

    @staticmethod
    def _shared(measurement: Measurement, ticket: int | None) -> Measurement:
        note = f"shared: same cubin as ticket {ticket}, measured once"
        detail = f"{measurement.detail}; {note}" if measurement.detail else note
        return replace(measurement, detail=detail, gpu_seconds=0.0, kernel_seconds=0.0,
                       flush_seconds=0.0)

    def _resolve(self, item: _Ticket, measurement: Measurement) -> None:
        binary = item.binary
        if binary is not None:
            measurement = replace(measurement, **binary_tags(binary, measurement.resources))
        if self._replay:
            measurement = replace(measurement, replayed=True)
        self._add_busy(measurement)
        self._results.append((item.ticket, measurement))


def _culprit(item: _Ticket) -> int | None:
    """The ticket a replacement's time is kept against: None for the incumbent's calibration."""
    return None if item.calibration else item.ticket
