"""Writes to Optuna's database study, in the coordinator's process or in a Ray actor of its own.

On a study of microsecond kernels the coordinator's loop spent about 50 ms of Python a measured
trial in Optuna's RDB storage (creating the trial, then telling it), more than the GPU worker
took to measure it. :class:`RayWriter` moves those writes, and the storing of each measured
trial, to another process: the coordinator sends each one and goes on; a write that depends on
an earlier one (the tell of a trial being created) is handed that write's reference, which Ray
resolves first, and an actor runs its calls in the order they were sent. On SQLite it is then
the only process that writes while a study runs (two writers waited on each other's locks)::

    writer = RayWriter(url)                 # its process starts (and imports) now
    writer.open(study_name)                 # once the study exists; or InlineWriter(study, repo)
    created = writer.call("create", params, distributions, {"owner": "host:pid"})
    writer.call("finish", created, {"study_id": 1, "params": {...}, "status": "ok", ...},
                0.0213, {"tflops": 98.1})   # Repository.record_trial, then Optuna's tell
    trial_id, number = writer.result(created)   # waits only if the create is still queued
    writer.flush()                              # every write sent so far is made

The writes use Optuna's storage (``Study._storage``: ``create_new_trial``, ``set_trial_*``),
which has no public equivalent for a RUNNING trial made in one write; Optuna is pinned below 6.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Mapping

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState, create_trial

from tuner import search


class StudyWriter:
    """The writes themselves, on one Optuna study and our repository (wherever this lives)."""

    def __init__(self, study: optuna.Study, repository: Any = None) -> None:
        self.study, self.repository = study, repository

    @classmethod
    def open(cls, name: str, url: str) -> "StudyWriter":
        from storage import open_repository

        study = optuna.load_study(study_name=name, storage=search.optuna_storage(url),
                                  sampler=optuna.samplers.RandomSampler())
        return cls(study, open_repository(url))

    def create(self, params: Mapping[str, Any], distributions: Mapping[str, BaseDistribution],
               user_attrs: Mapping[str, Any]) -> tuple[int, int]:
        """A RUNNING trial with its params and attributes, in one write: (trial id, number)."""
        template = create_trial(state=TrialState.RUNNING, params=dict(params),
                                distributions=dict(distributions), user_attrs=dict(user_attrs))
        # Optuna has no public call that creates a RUNNING trial and returns it; its storage does.
        storage = self.study._storage
        trial_id = storage.create_new_trial(self.study._study_id, template_trial=template)
        return trial_id, storage.get_trial_number_from_id(trial_id)

    def set_user_attrs(self, created: tuple[int, int], attrs: Mapping[str, Any]) -> None:
        """``attrs`` as user attributes (None values left out)."""
        for key, attr in attrs.items():
            if attr is not None:
                self.study._storage.set_trial_user_attr(created[0], key, attr)

    def tell(self, created: tuple[int, int], value: float, attrs: Mapping[str, Any]) -> None:
        """The result, with ``attrs`` as user attributes; a trial already finished (by another
        coordinator, from stored results) is left as it is. Straight to the storage, as
        ``Study.tell(skip_if_finished=True)`` would, less its two reads of the trial (6 ms of
        the writer's 30 a trial on SQLite); the database study's sampler has nothing to learn."""
        self.set_user_attrs(created, attrs)
        try:
            self.study._storage.set_trial_state_values(created[0], TrialState.COMPLETE, [float(value)])
        except UpdateFinishedTrialError:
            pass

    def finish(self, created: tuple[int, int], record: Mapping[str, Any], value: float,
               attrs: Mapping[str, Any]) -> None:
        """Store the measured trial (``Repository.record_trial`` under its number), then tell
        it: a crash in between leaves the database trial RUNNING, which the next run settles
        from the stored one."""
        self.repository.record_trial(number=created[1], **record)
        self.tell(created, value, attrs)

    def abandon(self, created: tuple[int, int], params: Mapping[str, Any] | None) -> None:
        """FAIL, and queued to be asked again when ``params`` are given (``search.abandon``)."""
        search.abandon(self.study, created[1], params)

    def ping(self) -> None:
        """Nothing: its answer says that every earlier call has run."""


class InlineWriter:
    """The writes made at once, in this process (tests, and wherever Ray is not up)."""

    def __init__(self, study: optuna.Study, repository: Any = None) -> None:
        self._writer = StudyWriter(study, repository)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self._writer, method)(*args)

    def result(self, handle: Any) -> Any:
        return handle

    def ready(self, handle: Any) -> bool:
        return True

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


class RayWriter:
    """The writes made by a Ray actor, in order, while the coordinator goes on."""

    def __init__(self, url: str, name: str | None = None) -> None:
        """Start the actor on the database at ``url`` (its process starts and imports Optuna and
        SQLAlchemy, seconds on a busy machine, while the caller starts its GPU actors and sets
        the study up); ``name``: :meth:`open` it now."""
        from storage.engine import absolute_sqlite
        from workers import ray_session

        self._ray = ray_session
        self._actor = ray_session.start_actor(_WriterActor, absolute_sqlite(url))
        if name is not None:
            self.open(name)

    def open(self, name: str) -> None:
        """Write to the study ``name`` from now on (it must exist); the actor opens it now, so
        that the first write does not wait for it. An error comes back from the first call."""
        self.call("open", name)

    def call(self, method: str, *args: Any) -> Any:
        return self._ray.call(self._actor, "run", method, *args)

    def result(self, handle: Any) -> Any:
        """The answer of a call (the database's own error raised as itself)."""
        return self._ray.result(handle) if self._ray.is_ref(handle) else handle

    def ready(self, handle: Any) -> bool:
        """Whether ``result(handle)`` would answer without waiting."""
        return self._ray.ready(handle) if self._ray.is_ref(handle) else True

    def flush(self) -> None:
        self.result(self.call("ping"))

    def close(self) -> None:
        self._ray.stop_actor(self._actor)


def beside_ray(url: str) -> RayWriter | None:
    """A RayWriter where this process has Ray up (a pool's), else None (write in-process)."""
    import sys

    session = sys.modules.get("workers.ray_session")  # never imports Ray where it is not up
    return RayWriter(url) if session is not None and session.ray_running() else None


class _WriterActor:
    """Opens the study on the first call after ``open``, so that an error reaches the caller as
    that call's."""

    def __init__(self, url: str) -> None:
        importlib.import_module("storage")  # imported now, while the coordinator starts up

        logging.getLogger("optuna").setLevel(logging.WARNING)
        self._url = url
        self._name: str | None = None
        self._writer: StudyWriter | None = None

    def run(self, method: str, *args: Any) -> Any:
        if method == "open":
            self._name, self._writer = args[0], None
        if self._writer is None:
            if self._name is None:
                raise RuntimeError("the study writer was not told which study to open")
            self._writer = StudyWriter.open(self._name, self._url)
        if method != "open":
            return getattr(self._writer, method)(*args)
        return None
