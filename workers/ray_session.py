"""Ray for this process: started (or joined) once, shared by the pools and the actors beside them.

    with shared_ray():                       # a local Ray, unless this process has one up
        with WorkerPool(...) as pool: ...    # studies one after another start faster
    actor = start_actor(SomeClass, arg)      # a CPU actor for work beside the pool
    result(call(actor, "method", x))         # its answer; its own exception, unwrapped

The rest of the project reaches Ray through here and ``workers.pool``; nothing outside
``workers/`` imports it.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator

import ray

from workers.driver import gpu_count
from workers.errors import NoGPUError


def start_ray(address: str | None = None, *, need_gpu: bool = False,
              runtime_env: dict[str, Any] | None = None) -> bool:
    """Start Ray, or join the cluster at ``address``, unless this process has it up already;
    True when it started it here. ``need_gpu``: a local Ray on a machine whose driver sees no
    GPU is refused (NoGPUError) before Ray starts, and prints, anything. ``runtime_env``: what
    every worker of this job gets (``workers.shipping.runtime_env``: a family's folder)."""
    if ray.is_initialized():
        return False
    if need_gpu and address is None:
        if gpu_count() == 0:
            raise NoGPUError("no GPU visible to the CUDA driver on this machine; run on a GPU "
                             "machine, pass ray_address=... of a cluster with GPUs, or "
                             "replay=<landscape.json>")
    ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING,
             runtime_env=runtime_env)
    return True


@contextmanager
def shared_ray(address: str | None = None, *, need_gpu: bool = False) -> Iterator[None]:
    """Keep one Ray up across several pools (studies one after another start faster), and for
    what runs beside a pool (a study's writer actor, started while the GPU actors start); it
    stops on leaving only where it started here."""
    started = start_ray(address, need_gpu=need_gpu)
    try:
        yield
    finally:
        if started:
            stop_ray()


def stop_ray() -> None:
    ray.shutdown()


def ray_running() -> bool:
    """Whether this process has Ray up (its actors can be started)."""
    return ray.is_initialized()


def start_actor(cls: type, *args: Any) -> Any:
    """A CPU actor of ``cls`` (no CPU reserved, never restarted); it starts in the background."""
    return ray.remote(num_cpus=0, max_restarts=0)(cls).remote(*args)


def call(actor: Any, method: str, *args: Any) -> Any:
    """Call ``actor.method(*args)``; returns at once, with a reference to its answer."""
    return getattr(actor, method).remote(*args)


def is_ref(value: Any) -> bool:
    return isinstance(value, ray.ObjectRef)


def result(ref: Any) -> Any:
    """The answer behind ``ref`` (waits for it); the actor's exception is raised as itself."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        raise (error.cause or error) from None


def ready(ref: Any) -> bool:
    """Whether :func:`result` would answer without waiting."""
    done, _ = ray.wait([ref], timeout=0)
    return bool(done)


def stop_actor(actor: Any) -> None:
    ray.kill(actor)
