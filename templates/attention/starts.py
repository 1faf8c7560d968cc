"""Configs every attention study measures first (KernelFamily.starting_points), before the
sampler proposes. Not a kernel file: changing them makes no new template version."""

from __future__ import annotations

from typing import Any

# FA3's warpgroup tiles (128 rows on two warpgroups, or 64 on one) and FA2's 128x64 tile.
COMMON: tuple[dict[str, Any], ...] = tuple(
    dict(BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=warps, STAGES=2, SMEM_LAYOUT=layout, WARP_SPECIALIZED=0,
         Q_IN_REGS=0, MMA=mma)
    for mma, bm, bn, warps, layout in (
        ("wgmma", 128, 128, 8, "swizzle"), ("wgmma", 128, 64, 8, "swizzle"), ("wgmma", 64, 128, 4, "swizzle"),
        ("sync", 128, 64, 4, "pad8"),
    )
)
# At D=128, first the 128x128 warpgroup tile with three stages and Q held in registers: the
# fastest config of both D=128 landscapes recorded on the H200 (tests/data), where the first
# common point was 1.02x and 1.04x.
FIRST_AT_D128 = dict(BLOCK_M=128, BLOCK_N=128, NUM_WARPS=8, STAGES=3, SMEM_LAYOUT="swizzle",
                     WARP_SPECIALIZED=0, Q_IN_REGS=1, MMA="wgmma")


def starting_points(head_dim: int) -> list[dict[str, Any]]:
    """In the order they are measured."""
    return ([dict(FIRST_AT_D128)] if head_dim == 128 else []) + [dict(p) for p in COMMON]
