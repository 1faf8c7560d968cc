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
import os
import signal
import socket
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import ray

from workers.driver import gpu_count
from workers.errors import ClusterUnreachable, NoGPUError
from workers.watchdog import Watchdog

logger = logging.getLogger("workers")

CONNECT_TIMEOUT_S = 3.0  # how long an address given may take to accept a connection
DEFERRED = (signal.SIGINT, signal.SIGTERM)  # held while Ray starts or stops, acted on after

_watchdog: Watchdog | None = None  # of the local Ray this process started


def start_ray(address: str | None = None, *, need_gpu: bool = False,
              runtime_env: dict[str, Any] | None = None,
              resources: dict[str, float] | None = None) -> bool:
    """Start Ray, or join the cluster at ``address``, unless this process has it up already;
    True when it started it here. ``need_gpu``: a local Ray on a machine whose driver sees no
    GPU is refused (NoGPUError) before Ray starts, and prints, anything. ``runtime_env``: what
    every worker of this job gets (``workers.shipping.runtime_env``: a family's folder).

    ``address``: None (or ``"local"``) starts a Ray of this process's own, whatever a previous
    cluster left behind (``RAY_ADDRESS``, the address file of ``ray start``); ``"auto"``, a
    ``host:port`` of the head's GCS and a ``ray://host:port`` of its client server join that
    cluster, each the way ``"auto"`` does in Ray (with this machine's token, where there is
    one). Nothing answering there is :class:`ClusterUnreachable`, within seconds.
    ``resources``: Ray custom resources of a local Ray (simulated GPUs: :mod:`workers.simulate`).

    Ctrl-C and SIGTERM while Ray starts are held until it is up (:func:`_signals_deferred`):
    then Ray is stopped again and the signal delivered, to the handler the process chose. A
    local Ray's processes end with this process, even one killed (:mod:`workers.watchdog`)."""
    global _watchdog
    if ray.is_initialized():
        return False
    if address in (None, "", "local"):
        if need_gpu and gpu_count() == 0:
            raise NoGPUError("no GPU visible to the CUDA driver on this machine; run on a GPU "
                             "machine, pass ray_address=... of a cluster with GPUs, or "
                             "replay=<landscape.json>")
        _token_auth(only_with_token=False)
        address = "local"
    else:
        _check_reachable(address)
        _token_auth(only_with_token=True)
    watchdog = Watchdog.start() if address == "local" else None
    try:
        with _signals_deferred(starting=True) as caught:
            logger.debug("starting Ray (%s)", address)
            extra = {"resources": resources} if resources and address == "local" else {}
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING,
                     runtime_env=runtime_env, **extra)
            logger.debug("Ray is up")
    except BaseException:
        if watchdog is not None:
            watchdog.stop()
        raise
    _watchdog = watchdog
    if caught:
        stop_ray()
        signal.raise_signal(caught[0])  # KeyboardInterrupt, or the process's SIGTERM handler
    return True


@contextmanager
def _signals_deferred(*, starting: bool = False) -> Iterator[list[int]]:
    """Hold SIGINT and SIGTERM while Ray starts or stops: the list yielded gets each one that
    came, and the handlers the process chose are back on leaving.

    A Ctrl-C raised inside ``ray.init`` was either lost (the study then ran to its end) or
    left Ray half started; blocking the signals instead (``pthread_sigmask``) would hand the
    block down to the processes Ray starts. ``starting``: Ray's own handlers are kept out of
    this process too: the SIGTERM handler ``ray.init`` puts in (``sys.exit`` from wherever it
    stands) and the native one of its core worker (a stack dump on SIGTERM, then the handler
    before it). Ray's other processes keep theirs. Only in the main thread (signals go to it
    alone); elsewhere nothing is touched."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = {signum: signal.getsignal(signum) for signum in DEFERRED}
    utils, constants = ray._private.utils, ray._private.ray_constants
    ray_sets_sigterm = utils.set_sigterm_handler
    native = constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    for signum in DEFERRED:
        signal.signal(signum, lambda signum, frame: caught.append(signum))
    if starting:
        utils.set_sigterm_handler = lambda handler: None
        constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True  # read as the driver's core worker starts
    try:
        yield caught
    finally:
        utils.set_sigterm_handler = ray_sets_sigterm
        constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = native
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _token_auth(*, only_with_token: bool) -> None:
    """Ray's token authentication, as Ray 2.60 sets it for ``ray.init()`` and ``"auto"``, where
    ``RAY_AUTH_MODE`` leaves the choice to Ray: on for a local Ray (Ray's default, without the
    notice it prints on every start saying so), and for a cluster joined by any address where
    this machine has a token (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``):
    Ray loads it only for ``"auto"``, and a head started with ``ray start`` on a machine with a
    token refuses a driver without it. A ``RAY_AUTH_MODE`` set by the user is left as it is
    (``disabled`` opts out, as Ray's notice says)."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    from ray._private.authentication import authentication_token_setup as setup

    if only_with_token and not setup.AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        return
    setup._enable_token_auth()  # RAY_AUTH_MODE=token, for this process and what it starts


def cluster_target(address: str) -> tuple[str, int]:
    """The host and port that must answer for ``address`` to be joined: the GCS of ``host:port``
    (Ray's default port 6379 where none is given), the client server of ``ray://host:port``
    (10001), and for ``"auto"`` the cluster ``RAY_ADDRESS`` or ``ray start`` names on this
    machine. ConnectionError where ``"auto"`` finds none; ValueError for no address at all."""
    if address == "auto":
        named = os.environ.get("RAY_ADDRESS")
        if named and named != "auto":
            return cluster_target(named)
        from ray._private.services import canonicalize_bootstrap_address_or_die

        address = canonicalize_bootstrap_address_or_die("auto")
    scheme, _, rest = address.rpartition("://")
    default_port = 10001 if scheme else 6379
    host, colon, port = rest.rstrip("/").rpartition(":")
    if not colon or "]" in port:  # no port given (an IPv6 host alone ends with "]")
        host, port = rest.rstrip("/"), str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ValueError(f"not a Ray address (auto, host:port or ray://host:port): {address!r}")
    return host, int(port)


def _check_reachable(address: str) -> None:
    """ClusterUnreachable unless something accepts a connection where ``address`` points, within
    CONNECT_TIMEOUT_S (Ray itself retries an address where nothing listens for minutes)."""
    try:
        host, port = cluster_target(address)
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as error:  # ConnectionError, a timeout, an unknown host
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        if isinstance(error, socket.timeout):
            reason = f"no answer in {CONNECT_TIMEOUT_S:g}s"
        raise ClusterUnreachable(f"cannot reach the Ray cluster at {address}: {reason}") from None


@contextmanager
def shared_ray(address: str | None = None, *, need_gpu: bool = False, runtime_env: dict[str, Any] | None = None,
               resources: dict[str, float] | None = None) -> Iterator[None]:
    """Keep one Ray up across several pools (studies one after another start faster), and for
    what runs beside a pool (a study's writer actor, started while the GPU actors start); it
    stops on leaving only where it started here (:func:`start_ray` for the arguments)."""
    started = start_ray(address, need_gpu=need_gpu, runtime_env=runtime_env, resources=resources)
    try:
        yield
    finally:
        if started:
            stop_ray()


def stop_ray() -> None:
    """Stop Ray (a Ctrl-C or SIGTERM meanwhile is acted on once it is down) and its watchdog."""
    global _watchdog
    with _signals_deferred() as caught:
        ray.shutdown()
        if _watchdog is not None:
            _watchdog.stop()
            _watchdog = None
    if caught:
        signal.raise_signal(caught[0])


def ray_running() -> bool:
    """Whether this process has Ray up (its actors can be started)."""
    return ray.is_initialized()


def cluster_gpus(resource: str = "GPU") -> int:
    """How many whole GPUs the Ray this process has up offers its actors (``resource``: the
    custom resource of simulated GPUs, ``workers.simulate.RESOURCE``, counts those instead)."""
    return int(ray.cluster_resources().get(resource, 0))


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
