"""The gemm space's candidates that fit a device, listed once for every problem tuned on it:
``GemmFamily.valid_configs`` checks a problem among them (66,080 of the 556,800 candidates on an
H100). Not a kernel file: what is valid is ``space.check``'s to say, and this only passes over
what it would refuse for any problem, so the template's hash does not depend on it."""

from __future__ import annotations

import functools
from typing import Any, Mapping

from templates.family import DeviceLimits
from templates.gemm import space


@functools.lru_cache(maxsize=8)
def device_candidates(device: DeviceLimits) -> tuple[dict[str, Any], ...]:
    """The ``space.candidates`` that :func:`fits_device` passes: listed once for all the problems
    tuned on ``device`` (of the 556,800 candidates, a problem's check then reads a fraction)."""
    return tuple(c for c in space.candidates() if fits_device(c, device))


def fits_device(params: Mapping[str, Any], device: DeviceLimits) -> bool:
    """False where a rule of :func:`space.check` that reads neither the problem's shape nor its
    flags refuses ``params`` (a candidate): then no problem accepts it on ``device``."""
    if space.wgmma(params):
        rows = space.warpgroup_rows(params)
        if device.compute_capability != (9, 0) or rows not in (64, 128):
            return False
        if space.pingpong_check(params) or space.plain_accumulators_spill(params):
            return False
        if params["SWAP_AB"] and (params["BLOCK_M"] not in space.SWAP_BLOCK_M or params["C_STORE"] == "tma"
                                  or params["CLUSTER_M"] > 1):
            return False
        if not params["SWAP_AB"] and params["BLOCK_M"] < space.SMALLEST_TILE["BLOCK_M"]:
            return False
        if params["PRODUCER_REGS"] and params["PRODUCER_REGS"] < space.MIN_LOOPING_PRODUCER_REGS and (
                params["PERSISTENT"] or params["CLUSTER_M"] > 1):
            return False
        if params["SPLIT_K"] > 1 and space.accumulators(params) > 64 and not params["PRODUCER_REGS"]:
            return False
        return space.accumulators(params) <= space.MAX_ACCUMULATORS
    wm, wn = space.warp_tile(params)
    return not (params["STAGES"] > space.MAX_SYNC_STAGES or params["BLOCK_M"] < space.SMALLEST_TILE["BLOCK_M"]
                or params["BLOCK_N"] in space.NON_POW2_BLOCK_N or params["BLOCK_M"] % space.warps_m(params)
                or params["BLOCK_N"] % space.warps_n(params) or wm % 16 or wn % 16
                or space.threads(params) > device.max_threads_per_block
                or space.fragment_registers(params) > space.FRAGMENT_REGISTER_BUDGET)
