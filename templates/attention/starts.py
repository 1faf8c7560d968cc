"""Configs every attention study measures first (KernelFamily.starting_points), before the
sampler proposes. Not a kernel file: changing them makes no new template version."""

from __future__ import annotations

from typing import Any

STARTING_POINTS: tuple[dict[str, Any], ...] = tuple(
    dict(BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=warps, STAGES=2, SMEM_LAYOUT=layout, WARP_SPECIALIZED=0,
         Q_IN_REGS=0, MMA=mma)
    for mma, bm, bn, warps, layout in (
        ("wgmma", 128, 128, 8, "swizzle"), ("wgmma", 128, 64, 8, "swizzle"), ("wgmma", 64, 128, 4, "swizzle"),
        ("sync", 128, 64, 4, "pad8"),
    )
)
