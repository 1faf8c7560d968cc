"""The attention family's parameter space and its constraints."""

from __future__ import annotations

import math
from typing import Any, Mapping

from templates.family import DeviceLimits, Param, Problem

PARAMS: tuple[Param, ...] = (
    Param("BLOCK_M", (64, 128, 32), "query rows per thread block (32: more blocks for small problems)"),
    Param("BLOCK_N", (32, 64, 128), "keys per step of the K/V loop"),
    Param("NUM_WARPS", (4, 8, 2), "warps that compute (16 or 32 rows each)"),
    Param("STAGES", (1, 2, 3), "cp.async K/V stages in shared memory (1: no overlap)"),
    Param("SMEM_LAYOUT", ("pad8", "swizzle", "pad0", "pad16"), "row padding in halves, or XOR swizzle"),
    Param("WARP_SPECIALIZED", (0, 1), "one producer warp loads K/V, the compute warps only compute"),
    Param("Q_IN_REGS", (1, 0), "keep Q's mma fragments in registers across the K/V loop"),
    Param("MMA", ("sync", "wgmma"), "tensor-core path: warp mma.sync, or warpgroup wgmma (sm_90a)"),
)

REGISTER_LIMIT = 255
# Fragment registers a compute thread may hold before the compiler must spill; the rest of the
# 255 go to addresses, indices, softmax state and the mma operands in flight.
FRAGMENT_REGISTER_BUDGET = 200


def m_tiles(params: Mapping[str, Any]) -> float:
    """16-row mma tiles per compute warp."""
    return params["BLOCK_M"] / (16 * params["NUM_WARPS"])


def row_stride(params: Mapping[str, Any], head_dim: int) -> int:
    layout = params["SMEM_LAYOUT"]
    return head_dim + (int(layout[3:]) if layout.startswith("pad") else 0)


def threads(params: Mapping[str, Any]) -> int:
    return 32 * (params["NUM_WARPS"] + params["WARP_SPECIALIZED"])


def scale_log2(head_dim: int) -> float:
    """The kernel's softmax scale argument: log2(e) / sqrt(D) (it exponentiates with exp2)."""
    return math.log2(math.e) / math.sqrt(head_dim)


def smem_bytes(params: Mapping[str, Any], head_dim: int) -> int:
    rows = params["BLOCK_M"] + 2 * params["STAGES"] * params["BLOCK_N"]
    # wgmma's swizzle atoms must start on 1024-byte boundaries: room to align the base.
    slack = 1024 if params["MMA"] == "wgmma" else 0
    return 2 * rows * row_stride(params, head_dim) + slack


def fragment_registers(params: Mapping[str, Any], head_dim: int) -> int:
    """Registers per compute thread held across the K/V loop: the S and O accumulators and
    (optionally) Q's fragments. With mma.sync P is packed from S one 16-key step at a time, so it
    adds little; wgmma takes all of P's fragments at once."""
    tiles = int(m_tiles(params))
    per_tile = params["BLOCK_N"] // 2 + head_dim // 2
    if params["Q_IN_REGS"]:
        per_tile += head_dim // 4
    if params["MMA"] == "wgmma":
        per_tile += params["BLOCK_N"] // 4
    return tiles * per_tile


def check(params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
    """None when the config can run; otherwise the first reason it cannot."""
    head_dim = problem.shape[3]
    tiles = m_tiles(params)
    if tiles != int(tiles) or tiles < 1:
        return (
            f"divisibility: BLOCK_M={params['BLOCK_M']} is not a multiple of 16*NUM_WARPS="
            f"{16 * params['NUM_WARPS']}"
        )
    if tiles > 2:
        return "divisibility: more than two 16-row tiles per warp"
    if params["MMA"] == "wgmma":
        reason = _wgmma_check(params, device)
        if reason:
            return reason
    if params["SMEM_LAYOUT"] == "swizzle" and head_dim % 64:
        return "layout: the XOR swizzle needs D to be a multiple of 64"
    if threads(params) > device.max_threads_per_block:
        return f"threads: {threads(params)} > {device.max_threads_per_block}"
    smem = smem_bytes(params, head_dim)
    if smem > device.max_smem_per_block_optin:
        return f"shared memory: {smem} bytes > {device.max_smem_per_block_optin} opt-in limit"
    regs = fragment_registers(params, head_dim)
    if regs > FRAGMENT_REGISTER_BUDGET:
        return f"registers: {regs} fragment registers per thread > {FRAGMENT_REGISTER_BUDGET}"
    if threads(params) * min(REGISTER_LIMIT, regs + 48) > device.regs_per_sm:
        return "registers: the block cannot fit one SM's register file without spilling"
    return None


def _wgmma_check(params: Mapping[str, Any], device: DeviceLimits) -> str | None:
    if device.compute_capability != (9, 0):
        return f"arch: wgmma needs sm_90a, {device.name} is sm_{''.join(map(str, device.compute_capability))}"
    if params["NUM_WARPS"] % 4 or m_tiles(params) != 1:
        return "divisibility: wgmma computes 64 rows per warpgroup (NUM_WARPS a multiple of 4, BLOCK_M = 16*NUM_WARPS)"
    if params["SMEM_LAYOUT"] != "swizzle":
        return "layout: wgmma reads 128-byte-swizzled tiles (SMEM_LAYOUT=swizzle)"
    return None
