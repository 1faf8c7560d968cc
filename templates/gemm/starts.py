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


# The wgmma path first (sm_90a; the constraints drop it elsewhere, and where A's or B's rows are
# not 16-byte aligned). First C by TMA stores (where N % 8 == 0): two consumer warpgroups of
# 64 x 256 rows, persistent, four stages, in tile groups of 16 and of 8, then a block a tile, then
# 256 x 128 persistent: on an H100 (2026-11-26, timed in turns with cuBLAS,
# docs/scripts/gemm_timing.py) 0.99-1.00x cuBLAS on 4096^3 fp16 and 4096x12288x4096 bf16 nt, and
# 1.00x on 2048^3 (a block a tile), where the same tiles storing C from registers made 0.92-0.95x.
# Then those tiles storing C from registers (any N), with setmaxnreg: the fastest of
# docs/scripts/gemm_hopper_check.py's candidates on every large problem it timed (H200,
# 2026-11-23: 623-686 TFLOPS). Then for small M or small problems one consumer warpgroup of 64 rows
# with deep pipelines, K in parts where the tiles leave multiprocessors idle (the constraints drop
# split-K elsewhere), each the fastest on one of the probes of 2026-11-24 (H200):
# 16x14336x4096 (64x128, 8 stages: 43 us against 46 with 4), 128x4096x4096 (6 stages, K in 2: 23
# against 26), 64x4096x14336 (64x64, 8 stages, K in 2: 45 against 47), 1x4096x4096 (8 stages, K in
# 4: 22 against 24), 1024^3 (6 stages: 11.1 against 12.2). Then the next ones of 2026-11-23's
# candidates, and a cluster of two sharing B last (on a par, not faster).
WGMMA = dict(MMA="wgmma", BLOCK_K=64, SMEM_LAYOUT="swizzle", GROUP_M=8)
# After the first, the tiles of 192 and 224 columns, persistent in groups of 16 (H100,
# 2026-11-27, commit 0baea2d): 128 x 192 by TMA made 1.004x cuBLAS on 8192x14336x4096 (128 x 256:
# 0.985x), 128 x 224 from registers 0.921x on 1024x14336x4096 (0.877x: its 448 tiles of 128 x 256
# fill 3.4 waves of 132 blocks, 512 of 128 x 224 fill 3.9).
TMA_C_POINTS: tuple[dict[str, Any], ...] = tuple(
    dict(WGMMA, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=8, STAGES=4, PRODUCER_REGS=40, GROUP_M=group, SPLIT_K=1,
         CLUSTER_M=1, PERSISTENT=persistent, C_STORE=c_store)
    for bm, bn, group, persistent, c_store in ((128, 256, 16, 1, "tma"), (128, 192, 16, 1, "tma"),
                                               (128, 224, 16, 1, "direct"), (128, 256, 8, 1, "tma"),
                                               (128, 256, 8, 0, "tma"), (256, 128, 8, 1, "tma"))
)
# Then the ping-pong schedule (PINGPONG=1: each consumer warpgroup a whole tile, their epilogues
# under each other's products; where the tiles outnumber the multiprocessors), C by TMA: timed in
# turns with cuBLASLt beside every persistent cooperative config of C by TMA (H200, 2026-11-29,
# docs/BENCHMARKS.md), the fastest kind on each of four LLM projections with fused epilogues:
# 128 x 128 a warpgroup, 6 stages (bias + ReLU, K 1024) and 4 (bias, K 768); 64 x 256, 4 stages
# (bias + GELU, K 768 and 4096; GELU then by an exp and a division).
PINGPONG_POINTS: tuple[dict[str, Any], ...] = tuple(
    dict(WGMMA, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=8, STAGES=stages, PRODUCER_REGS=40, GROUP_M=16, SPLIT_K=1,
         CLUSTER_M=1, PERSISTENT=1, C_STORE="tma", PINGPONG=1)
    for bm, bn, stages in ((128, 128, 6), (64, 256, 4), (128, 128, 4))
)
# For small M (the 128-row tiles above are refused there), the same store of C by TMA from one
# consumer warpgroup of 64 rows: the fastest of every valid config of its kind (4-8 stages,
# K in parts or not, 64-256 columns), timed in turns with cuBLAS after the clean flush (H100,
# 2026-11-27, commit 3356263): 64 x 128, 6 stages, K in 2 on 16x4096x4096 (0.986x) and
# 1x4096x4096 (0.978x); 8 stages on 32x8192x8192 (0.975x); 6 stages on 16x14336x4096 (0.967x);
# 64 x 64, 8 stages, setmaxnreg 40 on 128x4096x4096 (1.020x, where a 14-trial study had found
# 0.885x). Then 8 stages in K of 2.
SMALL_M_TMA_C_POINTS: tuple[dict[str, Any], ...] = tuple(
    dict(WGMMA, BLOCK_M=64, BLOCK_N=bn, NUM_WARPS=4, STAGES=stages, PRODUCER_REGS=regs, SPLIT_K=split,
         CLUSTER_M=1, PERSISTENT=0, C_STORE="tma")
    for bn, stages, regs, split in ((128, 6, 0, 2), (128, 8, 0, 1), (128, 6, 0, 1), (64, 8, 40, 1), (128, 8, 0, 2))
)
# Small M (M <= 256, A row-major) before all of those: A's rows as the MMA's N (SWAP_AB), B's tile
# of 64 rows on its 64-row side, deep pipelines, K whole; each the fastest of every valid config of
# its kind on one problem, timed in turns with cuBLAS (H100, 2026-11-27, docs/BENCHMARKS.md):
# 16 x 64, 12 stages on 16x4096x4096 (1.10x) and 1x4096x4096 (1.13x); 32 x 64, 16 stages on
# 64x4096x14336 (1.05x) and 32x8192x8192 (0.99x); 64 x 64, 12 stages on 128x4096x4096 (1.02x);
# 16 x 64 persistent on 16x14336x4096 (1.00x); then 16 x 128, 8 stages.
SWAP_POINTS: tuple[dict[str, Any], ...] = tuple(
    dict(WGMMA, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=4, STAGES=stages, PRODUCER_REGS=0, SPLIT_K=1, CLUSTER_M=1,
         PERSISTENT=persistent, C_STORE="direct", SWAP_AB=1)
    for bm, bn, stages, persistent in ((16, 64, 12, 0), (32, 64, 16, 0), (64, 64, 12, 0), (16, 64, 12, 1),
                                       (16, 128, 8, 0))
)
WGMMA_POINTS: tuple[dict[str, Any], ...] = tuple(
    dict(WGMMA, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=warps, STAGES=stages, PRODUCER_REGS=regs, GROUP_M=group,
         SPLIT_K=split, CLUSTER_M=cluster)
    for bm, bn, warps, stages, regs, group, split, cluster in (
        (128, 256, 8, 4, 40, 8, 1, 1), (64, 128, 4, 8, 0, 8, 1, 1), (64, 128, 4, 6, 0, 8, 2, 1),
        (64, 64, 4, 8, 0, 8, 2, 1), (64, 128, 4, 8, 0, 8, 4, 1), (64, 128, 4, 6, 0, 8, 1, 1),
        (64, 64, 4, 4, 0, 8, 4, 1), (128, 256, 8, 4, 40, 16, 1, 1), (256, 128, 8, 4, 24, 8, 1, 1),
        (128, 128, 4, 4, 40, 8, 1, 1), (64, 256, 4, 4, 40, 8, 1, 1), (128, 256, 8, 4, 40, 8, 1, 2),
    )
)


# e4m3: per tensor 128 x 192 on two consumer warpgroups (one set of 96 accumulators a thread for a
# K block's products, one for the promoted sums), persistent, C by TMA, 4 and 3 stages: the two
# fastest of 16 configs on 8192^3 (0.997x and 0.994x torch._scaled_mm) and 4096x14336x4096
# (0.982x, 0.989x), timed in turns (H200, 2026-11-29, docs/BENCHMARKS.md); then block scales'
# 128 x 128 (two sets of a K block's products), persistent with C by TMA (1.98x the Triton peer on
# 8192^3) and the two of 6 stages; then the 16-bit wgmma points, 128 one-byte elements deep (the
# same 128 bytes a stage row).
FP8_POINTS: tuple[dict[str, Any], ...] = tuple(
    dict(WGMMA, BLOCK_K=128, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=warps, STAGES=stages, PRODUCER_REGS=regs,
         SPLIT_K=1, CLUSTER_M=1, PERSISTENT=persistent, C_STORE=c_store, GROUP_M=16)
    for bm, bn, warps, stages, regs, persistent, c_store in (
        (128, 192, 8, 4, 40, 1, "tma"), (128, 192, 8, 3, 40, 1, "tma"), (128, 128, 8, 4, 40, 1, "tma"),
        (128, 128, 8, 6, 40, 1, "tma"), (128, 128, 8, 6, 40, 0, "direct"))
)
# Then ping-pong, 64 x 128 a warpgroup (two sets of 64 accumulators, two of a K block's products):
# one warpgroup's products run while the other promotes. Correct on the GPU's tests; slower than
# the cooperative 128 x 128 on 8192^3 in turns (H200, 2026-11-29), kept as the kind's one point.
FP8_PINGPONG_POINTS: tuple[dict[str, Any], ...] = (
    dict(WGMMA, BLOCK_K=128, BLOCK_M=64, BLOCK_N=128, NUM_WARPS=8, STAGES=6, PRODUCER_REGS=40, GROUP_M=16,
         SPLIT_K=1, CLUSTER_M=1, PERSISTENT=1, C_STORE="tma", PINGPONG=1),
)


def starting_points(dtype: str = "fp16") -> list[dict[str, Any]]:
    """In the order they are measured (the family keeps those its constraints accept): for e4m3
    FP8_POINTS and FP8_PINGPONG_POINTS, then the wgmma ones 128 deep that are not among them."""
    if dtype == "e4m3":
        deep = [dict(p, BLOCK_K=128) for p in SWAP_POINTS + TMA_C_POINTS + SMALL_M_TMA_C_POINTS + WGMMA_POINTS]
        first = [dict(p) for p in FP8_POINTS + FP8_PINGPONG_POINTS]
        return first + [p for p in deep if p not in first]
    return [dict(p) for p in SWAP_POINTS + TMA_C_POINTS + PINGPONG_POINTS + SMALL_M_TMA_C_POINTS + WGMMA_POINTS
            + POINTS]
