"""Measurements posted to a host a poll at a time, results collected a poll at a time.

A host is a Ray actor standing in front of several GPUs: a node agent in front of a node's GPU
actors (:mod:`workers.agent`) or a host of simulated GPUs (:mod:`workers.simulate`). The pool
posts each measurement to its GPU (:meth:`Mailbox.post`: a :class:`Letter`, which it keeps
where it would keep an actor call's object ref), sends a host everything posted to it in one
``enqueue`` call a poll (:meth:`Mailbox.flush`), and has one ``collect`` call a host outstanding
(:meth:`Mailbox.collecting`), whose answer :meth:`Mailbox.open` turns back into letters. On a
2-core machine one actor call cost the coordinator 0.12-0.84 ms of CPU; a batch of 16-64,
0.014-0.05 ms a trial (docs/BENCHMARKS.md, "Scale by simulation")::

    mail = Mailbox(family_ref, problem)
    letter = mail.post(gpu, *payload)       # gpu: .host (the actor) and .index (its GPU there)
    mail.flush()                            # host.enqueue.remote(family_ref, problem, letters)
    for ref in mail.collecting(hold=0.02):  # host.collect.remote(timeout, hold)
        for letter, result in mail.open(ray.get(ref), ref): ...

The host's side is :class:`Outbox`: what finished, handed over by ``collect``.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(eq=False)
class Letter:
    """A measurement posted to a GPU of a host."""

    number: int
    gpu: Any  # what it was posted to: .host, .index


class Mailbox:
    """The pool's side of the hosts' ``enqueue`` and ``collect``."""

    COLLECT_WAIT_S = 1.0  # how long a host's collect waits for a first result

    def __init__(self, family: Any, problem: Any) -> None:
        self._family, self._problem = family, problem
        self._numbers = itertools.count()
        self._posted: dict[int, list[tuple[Any, ...]]] = {}
        self._hosts: dict[int, Any] = {}
        self._out: dict[int, Letter] = {}  # letter number -> letter, posted and not yet opened
        self._outstanding: dict[int, int] = {}  # host -> letters out
        self._collects: dict[Any, int] = {}  # collect ref -> host

    def post(self, gpu: Any, *payload: Any) -> Letter:
        """A measurement for ``gpu`` (``gpu.host`` the actor, ``gpu.index`` its GPU there): the
        host gets (letter number, index, *payload) with the others of the poll."""
        letter = Letter(next(self._numbers), gpu)
        host = id(gpu.host)
        self._hosts[host] = gpu.host
        self._posted.setdefault(host, []).append((letter.number, gpu.index, *payload))
        self._out[letter.number] = letter
        self._outstanding[host] = self._outstanding.get(host, 0) + 1
        return letter

    def flush(self) -> None:
        """Send what was posted: one ``enqueue`` call a host."""
        for host, letters in self._posted.items():
            self._hosts[host].enqueue.remote(self._family, self._problem, letters)
        self._posted.clear()

    def collecting(self, *, hold: float = 0.0, issue: bool = True) -> list[Any]:
        """The ``collect`` refs to wait on: one a host with letters out, made where none is
        (``issue``), answering ``hold`` seconds from now at the earliest."""
        if issue:
            waiting = set(self._collects.values())
            for host, count in self._outstanding.items():
                if count and host not in waiting:
                    self._collects[self._hosts[host].collect.remote(self.COLLECT_WAIT_S, hold)] = host
        return list(self._collects)

    def owns(self, ref: Any) -> bool:
        return ref in self._collects

    def host_of(self, ref: Any) -> Any:
        """The host a ``collect`` ref was sent to."""
        return self._hosts[self._collects[ref]]

    def open(self, answer: Sequence[tuple[int, Any]], ref: Any) -> list[tuple[Letter, Any]]:
        """A ``collect`` call's answer, as (letter, result)."""
        host = self._collects.pop(ref)
        self._outstanding[host] -= len(answer)
        return [(self._out.pop(number), result) for number, result in answer]

    def forget(self, host: Any) -> None:
        """A host that died: its letters are out no more (the pool handles their GPUs)."""
        key = id(host)
        self._posted.pop(key, None)
        self._outstanding.pop(key, None)
        for ref in [r for r, h in self._collects.items() if h == key]:
            del self._collects[ref]
        for number in [n for n, letter in self._out.items() if id(letter.gpu.host) == key]:
            del self._out[number]


class Outbox:
    """A host's finished results until the pool's ``collect`` takes them (in an async actor)."""

    def __init__(self) -> None:
        self._finished: list[tuple[int, Any]] = []  # (letter, result) not yet collected
        self._arrived: asyncio.Event | None = None

    def _deliver(self, letter: int, result: Any) -> None:
        self._finished.append((letter, result))
        self._signal().set()

    async def collect(self, timeout: float, hold: float = 0.0) -> list[tuple[int, Any]]:
        """The results finished since the last call, (letter, result), ``hold`` seconds from
        now; waits up to ``timeout`` seconds more for the first."""
        if hold > 0:
            await asyncio.sleep(hold)
        arrived = self._signal()
        if not self._finished:
            try:
                await asyncio.wait_for(arrived.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        arrived.clear()
        out, self._finished = self._finished, []
        return out

    def _signal(self) -> asyncio.Event:
        if self._arrived is None:  # made in the actor's event loop
            self._arrived = asyncio.Event()
        return self._arrived
