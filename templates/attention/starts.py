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


# The TMA path (LOADS=tma) first: two stages, setmaxnreg 24/240, S(j+1) issued before the
# softmax of S(j), and the two consumer warpgroups taking turns (ping-pong), the fastest of the
# path's candidates on the H200 (docs/scripts/hopper_check.py, 2026-11-23): at D=128 128 rows with
# 160 or 176 keys (530-570 TFLOPS, 0.93-0.98x cuDNN, without the causal mask), 128 keys with the
# TMA store under the causal mask; at D=64 128 x 128 and FA3's 192 x 128 (375 TFLOPS both).
# Then the schedules (docs/scripts/schedule_sweep.py, 2026-11-23, H200): at D=64 persistent
# blocks with 176 keys and the TMA store (1.04-1.07x the one-block-a-tile 128 x 128); under the
# causal mask the longest tiles first (1.37x on 2x16x1000x64, 1.05x persistent on 4x16x4096x128).
# The constraints drop what does not apply (TILE_ORDER=lpt without the mask). Persistent blocks
# of 128 x 160: the fastest of these on 8x16x2048x128 and 4x16x4096x128 in turns with cuDNN
# (0.985x and 0.988x; 128 x 160 a block a tile 0.944x and 0.984x; H200, 2026-11-29,
# docs/scripts/attention_turns.py).
TMA = dict(BLOCK_M=128, BLOCK_N=128, NUM_WARPS=8, STAGES=2, SMEM_LAYOUT="swizzle", WARP_SPECIALIZED=1, Q_IN_REGS=0,
           MMA="wgmma", LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1, PINGPONG=1, EPILOGUE="st16")
LPT = dict(TMA, TILE_ORDER="lpt")
TMA_POINTS: dict[int, tuple[dict[str, Any], ...]] = {
    128: (dict(TMA, BLOCK_N=160), dict(TMA, BLOCK_N=176), dict(LPT, SCHEDULE="persistent"),
          dict(TMA, BLOCK_N=160, SCHEDULE="persistent"), dict(LPT),
          dict(TMA, EPILOGUE="tma"), dict(TMA), dict(TMA, SCHEDULE="persistent"), dict(TMA, PINGPONG=0, BLOCK_N=160)),
    64: (dict(TMA, BLOCK_N=176, SCHEDULE="persistent", EPILOGUE="tma"), dict(LPT), dict(LPT, SCHEDULE="persistent"),
         dict(TMA), dict(TMA, SCHEDULE="persistent"), dict(TMA, BLOCK_M=192, NUM_WARPS=12, INTRA_OVERLAP=0, PINGPONG=0),
         dict(TMA, BLOCK_N=192), dict(TMA, BLOCK_M=192, NUM_WARPS=12, BLOCK_N=96, PINGPONG=0)),
}
# D=96 holds D=128's tiles (its swizzled tiles and O accumulator are 128 columns wide, the last 32
# unused), so it starts from D=128's points; FA3 takes 128 x 128 at D=96, here among them.
TMA_POINTS[96] = TMA_POINTS[128]
# D=256: FA3's tile of 128 rows on two consumer warpgroups with setmaxnreg 24/240 and the overlap,
# with its 80 keys, first without ping-pong, then with it and the TMA store, and the longest
# tiles first: 128 x 80 without ping-pong was the fastest of these on 4x8x4096x256 and
# 1x8x16384x256 fp16 in turns with cuDNN (1.007x and 1.041x; 128 x 64 without ping-pong, the
# earlier winner, 0.972x and 0.981x; H200, 2026-11-29, docs/scripts/attention_turns.py). Then
# 64 keys: without ping-pong or without the overlap, the TMA store, the longest tiles first, and
# one consumer warpgroup of 64 rows (96 keys, 176 fragment registers without the overlap).
WIDE_ONE_CONSUMER = dict(TMA, BLOCK_M=64, NUM_WARPS=4, PINGPONG=0)
TMA_POINTS[256] = (dict(TMA, BLOCK_N=80, PINGPONG=0), dict(TMA, BLOCK_N=80, EPILOGUE="tma"),
                   dict(LPT, BLOCK_N=80, PINGPONG=0),
                   dict(TMA, BLOCK_N=64, PINGPONG=0), dict(TMA, BLOCK_N=64), dict(LPT, BLOCK_N=64),
                   dict(TMA, BLOCK_N=64, INTRA_OVERLAP=0), dict(TMA, BLOCK_N=64, EPILOGUE="tma"),
                   dict(WIDE_ONE_CONSUMER, BLOCK_N=64), dict(WIDE_ONE_CONSUMER, BLOCK_N=96, INTRA_OVERLAP=0),
                   dict(WIDE_ONE_CONSUMER, BLOCK_N=64, STAGES=3, INTRA_OVERLAP=0))
# At D=256 FA2's 128 x 64 tile does not fit mma.sync's registers (two 16-row tiles a warp beside
# O's 128 columns), and at D=96 ptxas spills it: 64 x 64 on four warps instead.
SYNC_ONE_TILE = dict(BLOCK_M=64, BLOCK_N=64, NUM_WARPS=4, STAGES=2, SMEM_LAYOUT="pad8", WARP_SPECIALIZED=0,
                    Q_IN_REGS=0, MMA="sync")


# Problems of fewer 128-row tiles than the GPU has SMs (e.g. 1x8x512: 32 tiles on 132 SMs): first
# one consumer warpgroup of 64 rows, which doubles the blocks. Two bf16 winners of 2026-11-23
# on the H200 (1x8x512x64: 9.5 us, 1.09x the Triton peer; 2x8x512x64: 10.7 us), where
# the fp16 studies, which had not measured them, kept the cp.async 64x128 tile (10.6-11.5 us).
ONE_CONSUMER = dict(TMA, BLOCK_M=64, NUM_WARPS=4, PRODUCER_REGS=56, PINGPONG=0)
FEW_TILES_POINTS = (dict(ONE_CONSUMER, STAGES=4), dict(ONE_CONSUMER, BLOCK_N=176, STAGES=3))
# At D=256 neither fits shared memory: under the causal mask (the constraints drop it without),
# 64 x 64 in two stages, persistent, the longest tiles first, the fastest config of the recorded
# 2x8x1024x256 fp16 causal landscape (128 tiles; 128 x 80, the first of D=256's points, 1.12x its
# time).
FEW_TILES_AT_D256 = (dict(ONE_CONSUMER, BLOCK_N=64, SCHEDULE="persistent", TILE_ORDER="lpt"),)


def starting_points(head_dim: int, few_tiles: bool = False) -> list[dict[str, Any]]:
    """In the order they are measured (the family keeps those its constraints accept).
    ``few_tiles``: the problem has fewer 128-row tiles than the GPU has SMs."""
    few = FEW_TILES_POINTS + FEW_TILES_AT_D256 if head_dim == 256 else FEW_TILES_POINTS
    return ([dict(p) for p in few if few_tiles] + [dict(p) for p in TMA_POINTS.get(head_dim, ())]
            + ([dict(FIRST_AT_D128)] if head_dim == 128 else []) + [dict(p) for p in COMMON]
            + ([dict(SYNC_ONE_TILE)] if head_dim in (96, 256) else []))
