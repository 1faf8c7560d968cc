"""A measurement's arguments as one pickled request: what the pool sends a GPU actor a trial::

    ref = actor.measure_request.remote(shipment.ref, pack(binary, launch, problem, params, options))

Ray serializes each argument of an actor call on its own (the cubin, the launch, the problem,
the params and every keyword); on a 2-core machine one call with the pool's five arguments and
its keywords cost the coordinator 230-440 us of CPU, one with the family's reference and these
pickled together 120-270 us (``docs/scripts/ray_call_cost.py``). A bench class takes requests
by deriving from :class:`TakesRequests` (``GpuBench``, ``ReplayBench``); the pool calls
``measure`` as before on one that does not (a test's double).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

from ray import cloudpickle


def pack(binary: Any, launch: Any, problem: Any, params: Mapping[str, Any] | None,
         options: Mapping[str, Any], *, by_value: bool = False) -> bytes:
    """``measure``'s arguments but the family's reference, as one request: plain pickle (frozen
    dataclasses of ``workers`` and ``templates``, plain params and options; 13 us for a 60 KB
    binary). ``by_value``: the family is shipped by value (``workers.shipping``), and its
    module's classes, a launch's among them, must travel by value too: Ray's cloudpickle (33 us)."""
    dumps = cloudpickle.dumps if by_value else pickle.dumps
    return dumps((binary, launch, problem, None if params is None else dict(params), dict(options)),
                 protocol=pickle.HIGHEST_PROTOCOL)


class TakesRequests:
    """``measure_request``: ``measure`` of a packed request (:func:`pack`)."""

    def measure_request(self, family_ref: Any, request: bytes) -> Any:
        binary, launch, problem, params, options = pickle.loads(request)
        return self.measure(binary, launch, family_ref, problem, params=params, **options)  # type: ignore[attr-defined]
