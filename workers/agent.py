"""A node agent: one Ray actor a GPU node that calls that node's GPU actors for the pool.

The pool called each GPU actor once a trial: 0.12-0.27 ms of the coordinator's CPU a call on a
2-core machine, 0.26-0.52 ms on the GPU machine (``docs/scripts/ray_call_cost.py``), and with
its waits and results 1.1-1.2 ms a trial (``docs/scripts/real_dispatch.py``): what about 25 GPUs
of 30 ms trials need, not 64. With agents, the pool posts a poll's measurements for a node in
one call and collects what finished in one call (:mod:`workers.mailbox`); the agent makes the
trial's call to its GPU actor on the node's own CPU::

    agent = NodeAgent.options(scheduling_strategy=on_node(node_id)).remote({0: actor_a, 1: actor_b})
    mail.post(AgentGpu(agent, 0), generation, request)      # workers.request.pack
    mail.flush()                                            # agent.enqueue(...): actor_a.measure_request
    ...; agent.adopt.remote(0, 1, new_actor)                 # the pool replaced GPU 0's actor

Each GPU actor gets its measurements in the order posted (the agent calls it from one place,
at once). A result comes back as the actor's Measurement, or as :class:`Undelivered` where
the call failed: the actor died (``died``: the pool replaces it, as it does when it called
the actor itself) or the bench raised (``raised``: the trial fails, the actor stays). A
measurement posted for an actor the pool has since replaced (an older ``generation``) is
answered ``stale``; one posted for a newer actor than the agent was given waits for its
``adopt`` (Ray does not promise an async actor's calls run in the order sent).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ray.exceptions import RayActorError, RayTaskError

from workers.errors import summary_line
from workers.mailbox import Outbox


@dataclass(frozen=True)
class Undelivered:
    """Why a posted measurement has no Measurement: ``died`` (the GPU actor's process or node
    is gone), ``raised`` (the bench raised; ``detail`` its traceback's tail) or ``stale`` (posted
    for an actor the pool replaced before the agent sent it)."""

    kind: str
    text: str
    detail: str = ""


def undelivered(exc: BaseException) -> Undelivered:
    """Why a call to a GPU actor brought no Measurement: its process is gone (``died``: any loss
    of the call but the bench's own error) or the bench raised (``raised``)."""
    if isinstance(exc, RayTaskError) and not isinstance(exc, RayActorError):
        return Undelivered("raised", summary_line(exc.cause or exc), str(exc)[-2000:])
    return Undelivered("died", summary_line(exc))


@dataclass(frozen=True)
class AgentGpu:
    """A GPU slot as the mailbox posts to it: its node's agent (``host``) and its slot number."""

    host: Any
    index: int


def node_id(actor_self: Any) -> str:
    """The Ray node an actor runs on (called in the actor: ``actor.__ray_call__.remote(node_id)``)."""
    import ray

    return ray.get_runtime_context().get_node_id()


def on_node(node: str) -> Any:
    """Ray's scheduling strategy for an actor on ``node``, or elsewhere when that node is gone."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node, soft=True)


class NodeAgent(Outbox):
    """An async Ray actor: the GPU actors of one node, called for the pool (see the module)."""

    def __init__(self, actors: Mapping[int, Any]) -> None:
        super().__init__()
        self._actors: dict[int, tuple[int, Any]] = {index: (0, actor) for index, actor in actors.items()}
        self._waiting: dict[int, list[tuple[int, int, Any, bytes]]] = {}  # for an actor not adopted yet

    async def adopt(self, index: int, generation: int, actor: Any) -> None:
        """Slot ``index``'s new actor (the pool's ``generation``-th); measurements that waited for
        it go now, in their order."""
        known = self._actors.get(index)
        if known is not None and known[0] >= generation:
            return
        self._actors[index] = (generation, actor)
        waiting, self._waiting[index] = self._waiting.pop(index, []), []
        for item in waiting:
            self._send(index, *item)
        if not self._waiting[index]:
            del self._waiting[index]

    async def enqueue(self, family: Sequence[Any], _problem: Any,
                      letters: Sequence[tuple[int, int, int, bytes]]) -> None:
        """Measurements posted at once, each (letter, slot, generation, request): ``family`` is
        a 1-tuple of the pool's family reference (a tuple: an object ref in it travels as a
        ref, which each GPU actor resolves)."""
        (ref,) = family
        for letter, index, generation, request in letters:
            self._send(index, letter, generation, ref, request)

    def _send(self, index: int, letter: int, generation: int, family: Any, request: bytes) -> None:
        known = self._actors.get(index)
        if known is None or known[0] < generation or self._waiting.get(index):
            self._waiting.setdefault(index, []).append((letter, generation, family, request))
            return
        if known[0] > generation:
            self._deliver(letter, Undelivered("stale", f"posted for slot {index}'s actor {generation}, "
                                                       f"replaced by actor {known[0]}"))
            return
        call = known[1].measure_request.remote(family, request)
        asyncio.get_running_loop().create_task(self._answer(letter, call))

    async def _answer(self, letter: int, call: Any) -> None:
        try:
            result: Any = await call
        except Exception as exc:  # noqa: BLE001 - any loss of the call is told to the pool
            result = undelivered(exc)
        self._deliver(letter, result)

    async def ready(self) -> int:
        """Once each of its GPU actors has answered it (Ray connects a caller to an actor on
        its first call: not during a trial's time): how many there are."""
        for _, actor in list(self._actors.values()):
            await actor.__ray_ready__.remote()
        return len(self._actors)
