"""Configs every GEMM study measures first (KernelFamily.starting_points), before the sampler
proposes. Not a kernel file: changing them makes no new template version."""

from __future__ import annotations

from typing import Any

# The tiles a kernel engineer tries first on an Ampere-style pipeline: CUTLASS's and Triton's
# 128 x 128 x 32 on 8 warps with three stages, its 64-deep and wider variants, and small tiles
# for small M or N (more blocks than SMs).
POINTS: tuple[dict[str, Any], ...] = tuple(
    dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, NUM_WARPS=warps, STAGES=stages, SMEM_LAYOUT="swizzle", GROUP_M=8)
    for bm, bn, bk, warps, stages in (
        (128, 128, 32, 8, 3), (128, 256, 32, 8, 3), (256, 128, 32, 8, 3), (128, 128, 64, 8, 3),
        (128, 128, 32, 4, 4), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4), (64, 64, 64, 4, 3),
    )
)


def starting_points() -> list[dict[str, Any]]:
    """In the order they are measured (the family keeps those its constraints accept)."""
    return [dict(p) for p in POINTS]
