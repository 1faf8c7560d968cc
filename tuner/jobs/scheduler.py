"""The scheduler: runs queued jobs, a slice of trials at a time, through the studies of
:func:`tuner.tune`, several at once on the GPUs it shares among them.

    scheduler = Scheduler("sqlite:///tuner.db", SchedulerOptions(replay=("landscapes/",)))
    with api.ray_for(None, "landscapes/", family=fam):   # Ray up, in the main thread
        scheduler.run(stop)                               # until ``stop`` (an Event) is set

The GPUs are those of Ray (``api.gpus_to_share``: with replay workers, the simulated ones; a
replay without them stands for one). Whenever some are free, the scheduler takes the jobs whose
turn it is (``storage.jobs``: the highest priority open, and among equal priorities those served
longest ago), at most one a free GPU, and splits the free GPUs among them (:func:`split`): a job
alone gets every GPU, two jobs of equal priority on two GPUs get one each and run at once, and
a lower priority waits while a higher one is open. Each taken job runs one slice in a thread of
its own: its first unfinished problem tuned to at most ``slice_trials`` more trials of that
problem's study (``tuner.api.tune_here``: its own coordinator on the study, under its leases),
on a pool of its share of the GPUs (``PoolOptions.gpus``: Ray holds each GPU for one pool's
actors, so two studies never time on one GPU at once); then the job is given back and its GPUs
are free again. The pool is kept for the job's next slice (``SharedRun``: its actors are told
the next problem, not started again; a new pool took 4-7 s a slice on the GPU machine) while
the job takes the same number of GPUs; a kept pool is closed, freeing its GPUs, before a slice
of another job or of another share starts, when no job waits, and when its job ends. A problem
is done at its budget, or when its study can measure nothing more (every valid config
measured); the job, when all its problems are. Nothing of a job's progress
lives here: a study resumes by name and its stored trials are never measured again, so a
scheduler killed and started again goes on where the database left it. A job cancelled
meanwhile is not taken again; its slice running asks no more trials once its hold's renewal
sees the cancel (within RENEW_S), and its trials in flight finish and are stored.
"""

from __future__ import annotations

import logging
import queue
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from templates.family import KernelFamily, Problem
from tuner import api, database, lookup
from tuner.errors import TunerError, UsageError, first_line
from tuner.study import search
from tuner.study.final_best import DEFAULT_TOP
from tuner.study.many import landscapes_for
from tuner.study.options import StudyOptions
from tuner.study.shared_run import SharedRun
from workers.pool_options import PoolOptions

logger = logging.getLogger("tuner")

DEFAULT_SLICE = 8  # trials of one problem a turn
RENEW_S = 2.0  # a job held is renewed (and a cancel seen) this often (storage.LEASE_TTL_S: 60)


@dataclass(frozen=True)
class SchedulerOptions:
    """Where jobs are measured (``pool``: Ray's address, timeouts, and with ``replay`` the
    simulated GPUs the jobs share, ``simulate_gpus``; ``replay``: landscapes, files or folders of
    them, answered instead of GPUs), how many trials a turn (``slice_trials``), and how long an
    idle scheduler waits before looking again (``poll_s``)."""

    replay: Sequence[str | Path] = ()
    slice_trials: int = DEFAULT_SLICE
    poll_s: float = 1.0
    pool: PoolOptions = field(default_factory=PoolOptions)

    def __post_init__(self) -> None:
        if self.slice_trials < 1:
            raise UsageError(f"a slice takes 1 trial or more, not {self.slice_trials}")


class Scheduler:
    """Runs the jobs queued in the database at ``url``."""

    def __init__(self, url: str, options: SchedulerOptions | None = None) -> None:
        self.url = url
        self.options = options or SchedulerOptions()
        self.runner = search.owner_id()
        self._kept: dict[int, tuple[SharedRun, int]] = {}  # job id -> its pool kept, its GPUs
        self._kept_lock = threading.Lock()

    def run(self, stop: threading.Event) -> None:
        """Run slices until ``stop`` is set (the slices running then finish first)."""
        gpus = max(1, api.gpus_to_share(replay=bool(self.options.replay),
                                        simulate_gpus=self.options.pool.simulate_gpus))
        ended: queue.Queue[int] = queue.Queue()  # a job id, as its slice ends
        running: dict[int, tuple[threading.Thread, int]] = {}  # job id -> (its slice, its GPUs)
        with database.repository(self.url) as repo:
            try:
                while not stop.is_set():
                    free = gpus - sum(share for _, share in running.values())
                    started = self._start(repo, free, gpus, running, ended) if free > 0 else False
                    try:
                        done = [ended.get(timeout=0 if started else self.options.poll_s)]
                    except queue.Empty:
                        continue
                    while not ended.empty():
                        done.append(ended.get())
                    for job_id in done:
                        running.pop(job_id)[0].join()
            finally:
                for thread, _ in running.values():
                    thread.join()
                self._close_kept(lambda job_id, share: True)

    def _start(self, repo: Any, free: int, gpus: int, running: dict[int, tuple[threading.Thread, int]],
               ended: queue.Queue[int]) -> bool:
        """Take the jobs whose turn it is for ``free`` GPUs, and start a slice of each on its share
        (of ``gpus`` in all); False where none is waiting."""
        try:
            taken = database.call(lambda: repo.take_jobs(self.runner, _gone, most=free, running=list(running)))
        except TunerError as error:  # the database away a while: the next look tries again
            logger.warning("jobs: %s", error)
            return False
        except Exception:
            logger.exception("jobs: cannot take jobs")
            return False
        shares = dict(zip((job.id for job in taken), split(free, len(taken))))
        # the GPUs of pools kept for jobs not running now, or for another share, freed first
        self._close_kept(lambda job_id, share: job_id not in running and shares.get(job_id) != share)
        for job in taken:
            share = shares[job.id]
            thread = threading.Thread(target=self._turn, args=(repo, job, GpuShare(share, gpus), ended),
                                      name=f"job-{job.id}", daemon=True)
            running[job.id] = (thread, share)
            thread.start()
        return bool(taken)

    def _close_kept(self, which: Callable[[int, int], bool]) -> None:
        """Close the pools kept for the jobs that ``which(job id, its GPUs)`` names."""
        with self._kept_lock:
            closing = [self._kept.pop(job_id)[0] for job_id, (_, share) in list(self._kept.items())
                       if which(job_id, share)]
        for shared in closing:
            _close(shared)

    def _turn(self, repo: Any, job: Any, share: GpuShare, ended: queue.Queue[int]) -> None:
        """One slice of ``job`` on ``share``, then the job given back (and said over, if it is)."""
        state: str | None = None
        reason: str | None = None
        with self._kept_lock:
            shared, _ = self._kept.pop(job.id, (None, 0))
        shared = shared or SharedRun()
        try:
            with _renewing(repo, job.id, self.runner) as cancelled:
                self._slice(repo, job, share, cancelled, shared)
            state, reason = _concluded(database.call(lambda: repo.job(job.id)))
            if state is None:  # its next slice, on as many GPUs, starts on this pool
                with self._kept_lock:
                    self._kept[job.id], shared = (shared, share.gpus), None
        except TunerError as error:  # no GPU, the workers could not start: said on the job
            state, reason = "failed", first_line(error)
            logger.warning("job %d failed: %s", job.id, reason)
        except Exception:
            logger.exception("jobs: a slice of job %d failed", job.id)
        finally:
            if shared is not None:
                _close(shared)
            try:
                database.call(lambda: repo.release_job(job.id, self.runner, state=state, reason=reason))
            except TunerError as error:  # still held by this runner: taken again at the next look
                logger.warning("jobs: %s", error)
            ended.put(job.id)
        if state is not None:
            logger.info("job %d %s: %s", job.id, state, reason)

    def _slice(self, repo: Any, job: Any, share: GpuShare, cancelled: threading.Event, shared: SharedRun) -> None:
        entry = next((p for p in job.problems if p.state == "waiting"), None)
        if entry is None:
            return
        fam = lookup.family(job.family)
        problem = lookup.problem(fam, list(entry.shape), entry.dtype, entry.flags)
        try:
            landscape = self._landscape(fam, problem)
        except UsageError as error:
            database.call(lambda: repo.set_job_problem(job.id, entry.position, state="failed", reason=str(error)))
            return
        target = min(job.trials, entry.measured + self.options.slice_trials)
        options = StudyOptions(trials=target, sampler=job.settings.get("sampler") or "tpe",
                               seed=job.settings.get("seed"), retime=DEFAULT_TOP if target >= job.trials else 0,
                               skip_at_budget=True, replay=landscape)
        logger.info("job %d: %s %s to %d trials on %d of %d GPUs", job.id, fam.name, problem.key, target,
                    share.gpus, share.of)
        where = replace(self.options.pool, replay=landscape, gpus=share.gpus)
        result = api.tune_here(fam, problem, self.url, options, where,
                               stop_when=lambda: "its job was cancelled" if cancelled.is_set() else None,
                               shared=shared)
        stored = result.previous + result.measured + result.shared
        logger.info("job %d: %s %s at %d of %d trials (%s)", job.id, fam.name, problem.key, stored, job.trials,
                    result.status)
        database.call(lambda: repo.set_job_problem(job.id, entry.position, study=result.study))
        if stored >= job.trials or (result.status == "finished" and stored < target):
            database.call(lambda: repo.set_job_problem(job.id, entry.position, state="done", reason=result.reason))

    def _landscape(self, fam: KernelFamily, problem: Problem) -> Path | None:
        """The landscape among ``replay`` that records ``problem`` (None: no replay, GPUs)."""
        if not self.options.replay:
            return None
        for given in self.options.replay:
            try:
                return landscapes_for(fam, [problem], [given])[problem]
            except UsageError:
                continue
        raise UsageError(f"no landscape given records {fam.name} {problem.key}")


@dataclass(frozen=True)
class GpuShare:
    """The GPUs a slice measures on: ``gpus`` of the ``of`` the scheduler shares."""

    gpus: int
    of: int


def _close(shared: SharedRun) -> None:
    """A kept pool closed; what fails there is logged (the job's trials are stored already)."""
    try:
        shared.close()
    except Exception:  # noqa: BLE001 - a pool that fails to close must not stop the scheduler
        logger.exception("jobs: closing a kept pool failed")


def split(free: int, jobs: int) -> list[int]:
    """``free`` GPUs split among ``jobs`` (at most ``free``) as evenly as they go, the jobs first
    in turn order taking what does not divide: ``split(2, 1) == [2]``, ``split(3, 2) == [2, 1]``."""
    return [free // jobs + (1 if i < free % jobs else 0) for i in range(jobs)] if jobs else []


def _concluded(job: Any) -> tuple[str | None, str | None]:
    """(state, reason) of a job whose problems are all over; (None, None) while one waits."""
    if job is None or any(p.state == "waiting" for p in job.problems):
        return None, None
    failed = [p for p in job.problems if p.state == "failed"]
    if failed:
        return "failed", f"{len(failed)} of {len(job.problems)} problems failed: {failed[0].reason}"
    return "done", f"{len(job.problems)} problems tuned"


def _gone(runner: str | None, heartbeat: Any) -> bool:
    return not search.owner_alive(runner, heartbeat)


@contextmanager
def _renewing(repo: Any, job_id: int, runner: str) -> Iterator[threading.Event]:
    """``runner``'s hold of the job renewed every RENEW_S while the block runs; the event given
    is set once a renewal finds the job cancelled (its slice then asks no more trials)."""
    done, cancelled = threading.Event(), threading.Event()

    def renew() -> None:
        while not done.wait(RENEW_S):
            try:
                if repo.renew_job(job_id, runner) == "cancelled":
                    cancelled.set()
            except Exception as error:  # the next renewal tries again
                logger.warning("job %d: cannot renew its hold: %s", job_id, first_line(error))

    thread = threading.Thread(target=renew, name=f"job-{job_id}-renewal", daemon=True)
    thread.start()
    try:
        yield cancelled
    finally:
        done.set()
        thread.join()
