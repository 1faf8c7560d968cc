"""The GEMM family's parameter space and its constraints."""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Mapping

from templates.family import DeviceLimits, Param, Problem
from templates.gemm.problem import alignment, block_scaled, is_fp8

PARAMS: tuple[Param, ...] = (
    Param("BLOCK_M", (128, 64, 256, 32, 16), "rows of C per thread block (16 and 32 with SWAP_AB only)"),
    Param("BLOCK_N", (128, 64, 256, 192, 224), "columns of C per thread block (192 and 224 on the wgmma path "
          "only, so that the tiles of a problem fill the last wave of blocks: 224 with B K-major, C from registers)"),
    Param("BLOCK_K", (32, 64, 128), "depth of one K step (one pipeline stage of A and B); 128: e4m3's, one "
          "128-byte swizzled row of 1-byte elements (the wgmma path)"),
    Param("NUM_WARPS", (8, 4), "warps per block: 2 x 2, or 2 x 4 (4 x 2 where BLOCK_M > BLOCK_N)"),
    Param("STAGES", (3, 2, 4, 6, 8, 12, 16), "A and B tiles in flight (cp.async; wgmma: TMA, where 6-16 keep "
          "more bytes in flight for the memory-bound small-M problems)"),
    Param("SMEM_LAYOUT", ("swizzle", "pad8"), "XOR swizzle of 16-byte chunks, or 8 halves of row padding"),
    Param("GROUP_M", (8, 1, 4, 16), "output tiles in column-major groups of this many tile rows, so "
          "that a wave of blocks shares A's and B's tiles in L2 (1: row by row)"),
    Param("MMA", ("sync", "wgmma"), "sync: warps' mma.sync fed by cp.async (any GPU from sm_80); wgmma: "
          "Hopper's pipeline (sm_90a): TMA loads into mbarrier-tracked stages by a producer warpgroup, "
          "NUM_WARPS / 4 consumer warpgroups issuing wgmma from shared memory"),
    Param("PRODUCER_REGS", (0, 40, 24), "wgmma: setmaxnreg gives the producer warpgroup this many registers "
          "and the consumers the rest (0: no setmaxnreg)"),
    Param("PERSISTENT", (0, 1), "wgmma: 1: one block a multiprocessor loops over the output tiles, the "
          "producer loading the next tile's stages under this one's epilogue; 0: a block a tile"),
    Param("SPLIT_K", (1, 2, 4, 8), "wgmma: K in this many parts, each its own work unit, for problems of "
          "fewer tiles than multiprocessors; the last part of a tile to finish sums the fp32 parts "
          "(kept in a workspace) in a fixed order and stores C"),
    Param("CLUSTER_M", (1, 2), "wgmma: 2: clusters of two blocks on vertically adjacent tiles, each copying "
          "half of their shared B stage by TMA multicast to both (B read from L2 once for the two)"),
    Param("C_STORE", ("direct", "tma"), "wgmma: how the epilogue stores C: from registers to global memory, or "
          "by stmatrix into two 64 x 64 staging boxes a consumer warpgroup, each stored by TMA while the "
          "next is filled (where N % 8 == 0: C's rows on 16-byte boundaries)"),
    Param("SWAP_AB", (0, 1), "wgmma, small M: 1: the MMA computes C's tile transposed, B's BLOCK_N rows on its "
          "64-row side and A's BLOCK_M (16-128) rows as its N, so that a few rows of A are not padded to 64 "
          "(A row-major; C stored from registers)"),
    Param("PINGPONG", (0, 1), "wgmma, persistent, two consumer warpgroups: 1: each computes whole tiles, the "
          "two taking them in turn (named barriers), one's epilogue under the other's products; 0: both share "
          "each tile's rows"),
)

# Accumulator and operand registers a thread may hold before ptxas must spill: the rest of the
# 255 go to addresses, indices and the epilogue (checked by tests/templates/test_gemm.py on
# every config's ptxas report).
FRAGMENT_REGISTER_BUDGET = 168
# From ptxas' reports of every tile, stage and warp count at three layouts (bf16, bias + GELU):
# 160 fragment registers or more spilled only where a thread also issues more than 12 16-byte
# loads a stage (4 warps, 64 deep: 16 or 20), and never with 12 or fewer.
TIGHT_FRAGMENTS = 160
TIGHT_LOADS = 12
# Where A's or B's rows are not 16-byte aligned each chunk is eight guarded loads: there 160 or
# more spilled with 10 and 12 chunks a stage (4 of 150 tiles of a 1001 x 999 x 4097 problem).
UNALIGNED_TIGHT_LOADS = 8
ELEMENT_BYTES = 2
# A tile wider than this many times the problem's own (its power of two) is never worth a trial:
# e.g. 256 rows for M = 16.
SMALLEST_TILE = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}
# SWAP_AB: A's rows are the MMA's N (a multiple of 8, here 16 to 128), for M up to SWAP_MAX_M (above it
# the 64-row side of the MMA is filled by M anyway).
SWAP_BLOCK_M = (16, 32, 64, 128)
SWAP_MAX_M = 256
# Tile widths besides the powers of two, so that a problem's tiles can fill the last wave of blocks:
# 192 (three 64-column boxes) and 224 (not whole boxes of an N-major B or of C's staging: B K-major
# only, C from registers); neither on the mma.sync path.
NON_POW2_BLOCK_N = (192, 224)


# The wgmma path: one 128-byte swizzle atom deep (64 16-bit elements, 128 e4m3 ones), each consumer
# warpgroup's accumulators at most this many fp32 registers a thread (64 x 256 or 128 x 128 a
# warpgroup), the consumers' registers after setmaxnreg at most MAX_CONSUMER_REGS.
WGMMA_BLOCK_K = 64
FP8_BLOCK_K = 128
# e4m3: a consumer holds a second set of fp32 accumulators (a K block's products beside the
# promoted sums): at most this many a set, FP8_LIGHT_ACCUMULATORS where two blocks share a
# multiprocessor (128 registers a thread), FP8_SPLIT_ACCUMULATORS with K in parts (below). With
# block scales B's scale is one a tile per 128-deep K block (BLOCK_N 64 or 128).
FP8_BLOCK_N = (64, 128)
MAX_PROMOTED_ACCUMULATORS = 96
FP8_LIGHT_ACCUMULATORS = 32
# Beside the two sets, a consumer thread needs this many registers more: FP8_OTHER_REGS at the
# launch's cap, FP8_SETMAXNREG_OTHER_REGS where setmaxnreg gives the consumers their own. ptxas'
# reports: with 64 a set, one config of each kind (tile, warps, setmaxnreg, persistent, split-K,
# cluster, C store, swap; both scale modes, GELU's two forms) spilled only as two sets of 64 on two
# consumer warpgroups at the cap (168 registers a thread), and none of 2,256 (each kind at its
# fewest and most stages, three epilogues, three shapes) with this rule; two sets of 96 (128 x 192
# on two warpgroups) in 232 registers after setmaxnreg did not spill, nor about 600 others of 96 a
# set (every kind, four problems) but 4, by 8 bytes, each with K in 8 parts on a persistent block
# of one consumer warpgroup: with K in parts, at most FP8_SPLIT_ACCUMULATORS a set.
FP8_OTHER_REGS = 48
FP8_SETMAXNREG_OTHER_REGS = 40
FP8_SPLIT_ACCUMULATORS = 64
MAX_ACCUMULATORS = 128
REGISTER_FILE = 65536
MAX_CONSUMER_REGS = 240
# PINGPONG=1: two consumer warpgroups (NUM_WARPS 8) of a persistent block taking whole tiles in turn,
# each unit a whole tile (SPLIT_K 1), A's rows on the MMA's 64-row side (SWAP_AB 0)
PINGPONG_FIXED = {"PERSISTENT": 1, "NUM_WARPS": 8, "SPLIT_K": 1, "SWAP_AB": 0}
# A's rows on the MMA's 64-row side, more than this many accumulators a consumer thread need
# setmaxnreg (at the launch's cap of 168 registers they spill). ptxas' reports: of 1,968 compiles
# of every ping-pong kind (tile, setmaxnreg, cluster, C store; fewest and most stages; five
# epilogues, four layouts, e4m3) 52 spilled (4-12 bytes), all of them 128 accumulators a thread
# without setmaxnreg; 96 or fewer never did. Sharing tiles, 128 a thread at the cap spilled 4-20
# bytes from registers and beside GELU's erf by TMA (128 x 256, 128 x 224, 256 x 128 on two
# consumer warpgroups).
PLAIN_ACCUMULATORS = 96
# With C stored by TMA, the epilogue loads the tile's whole bias (a register a column pair of each
# 8-column n-tile) before its first box where a consumer thread has this many registers beside its
# accumulators, else box by box. ptxas' reports on every wgmma kind (tile, setmaxnreg, persistent,
# cluster, C store, ping-pong) of seven bias problems (every epilogue, four layouts, e4m3 with
# either scale): 1,132 compiles, none spilled; loaded ahead, 128 x 192 at the cap (72 spare)
# spilled 4-40 bytes beside GELU's erf. (From registers the loads stay column pair by column pair:
# loaded ahead they were up to 8.5% slower, H200.)
BIAS_AHEAD_SPARE_REGS = 96
HOPPER_PARAMS = ("PRODUCER_REGS", "PERSISTENT", "SPLIT_K", "CLUSTER_M", "C_STORE", "SWAP_AB", "PINGPONG")
MAX_SYNC_STAGES = 4  # the mma.sync path's cp.async pipeline (its 864 configs)
# ptxas' reports: with PERSISTENT or CLUSTER_M the producer warpgroup's loop
# holds more than 24 registers (8-32 bytes spilled at 24, none at 40).
MIN_LOOPING_PRODUCER_REGS = 40
SMEM_PER_SM = 233472  # sm_90: 228 KiB a multiprocessor, 1 KiB of it reserved for each block
RESERVED_SMEM_PER_BLOCK = 1024
# split-K: the workspace holds the fp32 parts of at most this many work units (tiles x SPLIT_K);
# the parts are worth their traffic only where the tiles alone leave multiprocessors idle.
MAX_SPLIT_UNITS = 512


C_BOX_BYTES = 64 * 64 * ELEMENT_BYTES  # C_STORE=tma: one staging box of C


def c_staging_bytes(params: Mapping[str, Any]) -> int:
    """C_STORE=tma: two staging boxes a consumer warpgroup; else none."""
    return 2 * consumers(params) * C_BOX_BYTES if params.get("C_STORE") == "tma" else 0


def barrier_bytes(params: Mapping[str, Any]) -> int:
    """The 1024-byte alignment of the stages, their full and empty mbarriers, split-K's flag."""
    return 1024 + 16 * params["STAGES"] + 16


def blocks_per_sm(params: Mapping[str, Any], layout: str) -> int:
    """wgmma: the blocks a multiprocessor is built to hold (``__launch_bounds__``' minimum, and a
    persistent launch's blocks a multiprocessor): two where both fit in its shared memory and the
    consumers' accumulators leave room in half the registers (one consumer warpgroup of at most 64
    accumulators a thread, no setmaxnreg: 128 registers a thread), else one."""
    fits = 2 * (smem_bytes(params, layout) + RESERVED_SMEM_PER_BLOCK) <= SMEM_PER_SM
    light = consumers(params) == 1 and accumulators(params) <= 64 and not params["PRODUCER_REGS"]
    return 2 if fits and light else 1


def tiles(params: Mapping[str, Any], problem: Problem) -> int:
    """Output tiles of C, the rows of tiles rounded up to whole clusters (a block whose tile lies
    past M computes it for its half of B and stores nothing)."""
    m, n, _ = problem.shape
    cluster = params["CLUSTER_M"]
    return -(-m // (params["BLOCK_M"] * cluster)) * cluster * -(-n // params["BLOCK_N"])


def units(params: Mapping[str, Any], problem: Problem) -> int:
    """Work units: the output tiles, each in SPLIT_K parts of K."""
    return tiles(params, problem) * params["SPLIT_K"]


def workspace(params: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """split-K's buffers (none without it): room for the fp32 parts of MAX_SPLIT_UNITS units, and a
    counter a tile. Sized by the config alone, so one allocation serves every problem it accepts."""
    if params["SPLIT_K"] == 1:
        return ()
    return (("partials", MAX_SPLIT_UNITS * params["BLOCK_M"] * params["BLOCK_N"] * 4),
            ("counters", MAX_SPLIT_UNITS * 4))


def wgmma(params: Mapping[str, Any]) -> bool:
    return params["MMA"] == "wgmma"


def consumers(params: Mapping[str, Any]) -> int:
    """wgmma: consumer warpgroups (NUM_WARPS counts their warps; the producer's are extra)."""
    return params["NUM_WARPS"] // 4


def mma_tile(params: Mapping[str, Any]) -> tuple[int, int]:
    """wgmma: the block's tile as the MMA sees it, (its 64-row side, its N): (BLOCK_M, BLOCK_N), or
    with SWAP_AB (BLOCK_N, BLOCK_M)."""
    if params.get("SWAP_AB"):
        return params["BLOCK_N"], params["BLOCK_M"]
    return params["BLOCK_M"], params["BLOCK_N"]


def pingpong(params: Mapping[str, Any]) -> bool:
    """wgmma, PINGPONG=1: the consumer warpgroups take whole tiles in turn (a config of the space
    before the parameter: 0)."""
    return params.get("PINGPONG", 0) == 1


def warpgroup_rows(params: Mapping[str, Any]) -> int:
    """wgmma: the MMA's rows a consumer warpgroup computes: the tile's share, or with ping-pong all."""
    rows = mma_tile(params)[0]
    return rows if pingpong(params) else rows // consumers(params)


def accumulators(params: Mapping[str, Any]) -> int:
    """wgmma: fp32 accumulator registers a consumer thread holds (its warpgroup's rows x N / 128)."""
    return warpgroup_rows(params) * mma_tile(params)[1] // 128


def launch_registers(params: Mapping[str, Any]) -> int:
    """The register cap a thread gets from __launch_bounds__(threads, 1)."""
    return min(255, REGISTER_FILE // threads(params) // 8 * 8)


def consumer_registers(params: Mapping[str, Any]) -> int:
    """wgmma: the registers a consumer thread may use: the launch cap, or with setmaxnreg what the
    producer gives up shared among the consumer warpgroups, at most MAX_CONSUMER_REGS."""
    cap = launch_registers(params)
    if not params["PRODUCER_REGS"]:
        return cap
    pool = (1 + consumers(params)) * min(256, (cap + 7) // 8 * 8)
    return min(MAX_CONSUMER_REGS, (pool - params["PRODUCER_REGS"]) // consumers(params) // 8 * 8)


def plain_accumulators_spill(params: Mapping[str, Any]) -> bool:
    """wgmma, A's rows on the MMA's 64-row side: more than PLAIN_ACCUMULATORS a thread without
    setmaxnreg."""
    return not params["SWAP_AB"] and accumulators(params) > PLAIN_ACCUMULATORS and not params["PRODUCER_REGS"]


def bias_ahead(params: Mapping[str, Any], sets: int = 1) -> bool:
    """wgmma, C by TMA: whether the epilogue loads the tile's whole bias before its first box (see
    BIAS_AHEAD_SPARE_REGS): the consumer's registers less ``sets`` times its accumulators. e4m3
    passes ``fp8_part_sets``, which leaves the promoted sums' set uncounted: that is the rule
    ptxas' reports checked (none of its e4m3 compiles spilled), not a count of every set."""
    spare = consumer_registers(params) - sets * accumulators(params)
    return params["C_STORE"] == "tma" and spare >= BIAS_AHEAD_SPARE_REGS


def warps_m(params: Mapping[str, Any]) -> int:
    """Warps along M (the rest along N)."""
    if params["NUM_WARPS"] == 4:
        return 2
    return 4 if params["BLOCK_M"] > params["BLOCK_N"] else 2


def warps_n(params: Mapping[str, Any]) -> int:
    return params["NUM_WARPS"] // warps_m(params)


def warp_tile(params: Mapping[str, Any]) -> tuple[int, int]:
    """(rows, columns) of C each warp computes."""
    return params["BLOCK_M"] // warps_m(params), params["BLOCK_N"] // warps_n(params)


def threads(params: Mapping[str, Any]) -> int:
    """mma.sync: the warps; wgmma: the consumers' warps and the producer warpgroup."""
    return 32 * params["NUM_WARPS"] + (128 if wgmma(params) else 0)


def operand_tiles(params: Mapping[str, Any], layout: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows, contiguous columns) of A's and of B's tile in shared memory: each as it is stored."""
    bm, bn, bk = params["BLOCK_M"], params["BLOCK_N"], params["BLOCK_K"]
    a = (bk, bm) if layout[0] == "t" else (bm, bk)
    b = (bn, bk) if layout[1] == "t" else (bk, bn)
    return a, b


def row_stride(params: Mapping[str, Any], columns: int) -> int:
    return columns + (8 if params["SMEM_LAYOUT"] == "pad8" else 0)


def operand_bytes(params: Mapping[str, Any]) -> int:
    """Bytes of an element of A and B: 1 where BLOCK_K is e4m3's 128 (a 128-byte row), else 2."""
    return 1 if params["BLOCK_K"] == FP8_BLOCK_K else ELEMENT_BYTES


def stage_bytes(params: Mapping[str, Any], layout: str) -> int:
    return sum(operand_bytes(params) * rows * row_stride(params, cols) for rows, cols in operand_tiles(params, layout))


def smem_bytes(params: Mapping[str, Any], layout: str) -> int:
    if wgmma(params):
        return params["STAGES"] * stage_bytes(params, layout) + c_staging_bytes(params) + barrier_bytes(params)
    return params["STAGES"] * stage_bytes(params, layout)


def fragment_registers(params: Mapping[str, Any]) -> int:
    """Registers per thread held through the K loop: C's fp32 accumulators (rows x columns / 32)
    and one 16-deep step of A's and B's fragments."""
    wm, wn = warp_tile(params)
    return wm * wn // 32 + wm // 4 + wn // 4


def loads_per_thread(params: Mapping[str, Any]) -> int:
    """16-byte chunks of A and B each thread copies a stage."""
    elements = params["BLOCK_K"] * (params["BLOCK_M"] + params["BLOCK_N"])
    return -(-elements // 8 // threads(params))


def check(params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
    """None when the config can run; otherwise the first reason it cannot."""
    if is_fp8(problem):
        reason = _fp8_check(params, problem)
        if reason:
            return reason
    if wgmma(params):
        return _wgmma_check(params, problem, device)
    if params["BLOCK_K"] == FP8_BLOCK_K:
        return f"path: BLOCK_K={FP8_BLOCK_K} for e4m3 on the wgmma path only"
    for name in HOPPER_PARAMS:
        if params[name] != _first(name):
            return f"path: {name} applies to MMA=wgmma only"
    if params["STAGES"] > MAX_SYNC_STAGES:
        return f"path: more than {MAX_SYNC_STAGES} stages on the wgmma path only"
    if params["BLOCK_M"] < SMALLEST_TILE["BLOCK_M"]:
        return f"path: BLOCK_M={params['BLOCK_M']} with SWAP_AB on the wgmma path only"
    if params["BLOCK_N"] in NON_POW2_BLOCK_N:
        return f"path: BLOCK_N={params['BLOCK_N']} on the wgmma path only"
    layout = problem.flag("layout")
    wm, wn = warp_tile(params)
    if params["BLOCK_M"] % warps_m(params) or params["BLOCK_N"] % warps_n(params) or wm % 16 or wn % 16:
        return (f"divisibility: a {params['BLOCK_M']}x{params['BLOCK_N']} tile on {warps_m(params)}x"
                f"{warps_n(params)} warps is not whole 16x16 tiles a warp")
    for name, dim in (("BLOCK_M", problem.shape[0]), ("BLOCK_N", problem.shape[1]), ("BLOCK_K", problem.shape[2])):
        fits = max(SMALLEST_TILE[name], _power_of_two(dim))
        if params[name] > fits:
            return f"tile: {name}={params[name]} is wider than the problem needs ({fits})"
    if threads(params) > device.max_threads_per_block:
        return f"threads: {threads(params)} > {device.max_threads_per_block}"
    smem = smem_bytes(params, layout)
    if smem > device.max_smem_per_block_optin:
        return f"shared memory: {smem} bytes > {device.max_smem_per_block_optin} opt-in limit"
    regs = fragment_registers(params)
    if regs > FRAGMENT_REGISTER_BUDGET:
        return f"registers: {regs} fragment registers per thread > {FRAGMENT_REGISTER_BUDGET}"
    aligned = alignment(problem)
    limit = TIGHT_LOADS if aligned["a_aligned"] and aligned["b_aligned"] else UNALIGNED_TIGHT_LOADS
    if regs >= TIGHT_FRAGMENTS and loads_per_thread(params) > limit:
        return (f"registers: {regs} fragment registers per thread beside {loads_per_thread(params)} 16-byte "
                f"loads a stage (> {limit})")
    return None


def _wgmma_check(params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
    if device.compute_capability != (9, 0):
        return f"arch: TMA and wgmma need sm_90a, {device.name} is sm_{''.join(map(str, device.compute_capability))}"
    if params["BLOCK_K"] != wgmma_block_k(problem) or params["SMEM_LAYOUT"] != "swizzle":
        return (f"wgmma: BLOCK_K={wgmma_block_k(problem)} for {problem.dtype} on swizzled tiles (one 128-byte "
                f"swizzle atom deep)")
    aligned = alignment(problem)
    if not (aligned["a_aligned"] and aligned["b_aligned"]):
        return "tma: A's and B's rows must start on 16-byte boundaries (leading dimensions a multiple of 8)"
    reason = _swap_check(params, problem)
    if reason:
        return reason
    if params["BLOCK_N"] % 64 and (problem.flag("layout")[1] == "n" or params["C_STORE"] == "tma"):
        return (f"tma: BLOCK_N={params['BLOCK_N']} is not whole 64-column boxes: B K-major (layout ?t) and C "
                f"from registers (C_STORE=direct)")
    reason = pingpong_check(params)
    if reason:
        return reason
    rows = warpgroup_rows(params)
    if rows not in (64, 128):
        return f"wgmma: {rows} rows a consumer warpgroup (64 or 128)"
    for name, dim in (("BLOCK_M", problem.shape[0]), ("BLOCK_N", problem.shape[1])):
        smallest = SWAP_BLOCK_M[0] if name == "BLOCK_M" and params["SWAP_AB"] else SMALLEST_TILE[name]
        fits = max(smallest, _power_of_two(dim))
        if params[name] > fits:
            return f"tile: {name}={params[name]} is wider than the problem needs ({fits})"
    if params["PRODUCER_REGS"] and params["PRODUCER_REGS"] < MIN_LOOPING_PRODUCER_REGS and (
            params["PERSISTENT"] or params["CLUSTER_M"] > 1):
        return (f"registers: a producer looping over units or multicasting to a cluster spills in "
                f"{params['PRODUCER_REGS']} registers (setmaxnreg >= {MIN_LOOPING_PRODUCER_REGS})")
    resident = device.sm_count * blocks_per_sm(params, problem.flag("layout"))
    if params["PERSISTENT"] and units(params, problem) <= resident:
        return f"persistent: {units(params, problem)} work units, a block each of {resident} resident at once"
    if params["CLUSTER_M"] > 1:
        if problem.shape[0] <= params["BLOCK_M"]:
            return f"cluster: M={problem.shape[0]} is one row of {params['BLOCK_M']}-row tiles, none to share B with"
        if problem.flag("layout")[1] == "n" and params["BLOCK_N"] < 128:
            return "cluster: B's N-major stage halves in 64-column boxes (BLOCK_N >= 128)"
    if params["C_STORE"] == "tma" and problem.shape[1] % 8:
        return f"tma: C's rows must start on 16-byte boundaries for C_STORE=tma (N={problem.shape[1]} is not a multiple of 8)"
    if params["SPLIT_K"] > 1 and accumulators(params) > 64 and not params["PRODUCER_REGS"]:
        return (f"registers: split-K's sum beside {accumulators(params)} accumulators a thread spills in "
                f"{consumer_registers(params)} registers (setmaxnreg needed)")
    if params["SPLIT_K"] > 1:
        reason = _split_check(params, problem, device)
        if reason:
            return reason
    if accumulators(params) > MAX_ACCUMULATORS:
        return f"registers: {accumulators(params)} accumulators a consumer thread > {MAX_ACCUMULATORS}"
    if plain_accumulators_spill(params):
        return (f"registers: {accumulators(params)} accumulators a thread spill in {consumer_registers(params)} "
                f"registers (setmaxnreg needed)")
    smem = smem_bytes(params, problem.flag("layout"))
    if smem > device.max_smem_per_block_optin:
        return f"shared memory: {smem} bytes > {device.max_smem_per_block_optin} opt-in limit"
    return None


def pingpong_check(params: Mapping[str, Any]) -> str | None:
    """Ping-pong's own rules, which read no problem (None for every other config)."""
    if not pingpong(params):
        return None
    for name, value in PINGPONG_FIXED.items():
        if params[name] != value:
            return (f"pingpong: PINGPONG=1 takes whole tiles in turn on two consumer warpgroups of a persistent "
                    f"block ({', '.join(f'{n}={v}' for n, v in PINGPONG_FIXED.items())}), not {name}={params[name]}")
    return None


def wgmma_block_k(problem: Problem) -> int:
    """The wgmma path's BLOCK_K: one 128-byte swizzled row of the problem's elements."""
    return FP8_BLOCK_K if is_fp8(problem) else WGMMA_BLOCK_K


def fp8_other_registers(params: Mapping[str, Any]) -> int:
    """e4m3: the registers a consumer thread needs beside its accumulator sets: fewer where
    setmaxnreg gives the consumers their own."""
    return FP8_SETMAXNREG_OTHER_REGS if params["PRODUCER_REGS"] else FP8_OTHER_REGS


def fp8_part_sets(params: Mapping[str, Any]) -> int:
    """e4m3: the sets of a K block's products a consumer thread keeps beside the promoted sums: 2
    (two K blocks a step, the first promoted while the second's products run) where three sets
    and the other registers fit, K whole; else 1."""
    three = 3 * accumulators(params) + fp8_other_registers(params)
    if params["SPLIT_K"] == 1 and three <= consumer_registers(params):
        return 2
    return 1


def _fp8_check(params: Mapping[str, Any], problem: Problem) -> str | None:
    """e4m3's own rules: the wgmma path, room for the two accumulator sets (a K block's products,
    the promoted sums); with block scales one B scale a tile per K block (BLOCK_N 64 or 128) and
    A's row scales on the accumulators' rows (no SWAP_AB)."""
    if not wgmma(params):
        return "e4m3: on the wgmma path only (MMA=wgmma: wgmma's FP8 instructions, sm_90a)"
    if block_scaled(problem) and params["BLOCK_N"] not in FP8_BLOCK_N:
        return (f"e4m3: block scales need BLOCK_N in {list(FP8_BLOCK_N)} (one scale of B a tile per 128-deep "
                f"K block), not {params['BLOCK_N']}")
    if block_scaled(problem) and params["SWAP_AB"]:
        return "e4m3: block scales with SWAP_AB=0 only (A's row scales on the accumulators' rows)"
    if blocks_per_sm(params, problem.flag("layout")) > 1:
        limit, where = FP8_LIGHT_ACCUMULATORS, ""
    elif params["SPLIT_K"] > 1:
        limit, where = FP8_SPLIT_ACCUMULATORS, " with K in parts"
    else:
        limit, where = MAX_PROMOTED_ACCUMULATORS, ""
    if accumulators(params) > limit:
        return (f"registers: e4m3 keeps two sets of {accumulators(params)} accumulators a consumer thread "
                f"(a K block's products and the promoted sums; at most {limit} a set{where})")
    other = fp8_other_registers(params)
    if 2 * accumulators(params) + other > consumer_registers(params):
        return (f"registers: e4m3's two sets of {accumulators(params)} accumulators beside {other} more "
                f"spill in {consumer_registers(params)} registers a consumer thread (setmaxnreg needed)")
    return None


def _swap_check(params: Mapping[str, Any], problem: Problem) -> str | None:
    """SWAP_AB's own rules; without it, BLOCK_M of 64 or more."""
    if not params["SWAP_AB"]:
        if params["BLOCK_M"] < SMALLEST_TILE["BLOCK_M"]:
            return f"tile: BLOCK_M={params['BLOCK_M']} only with SWAP_AB (A's rows as the MMA's N)"
        return None
    if params["BLOCK_M"] not in SWAP_BLOCK_M:
        return f"swap: BLOCK_M={params['BLOCK_M']} with SWAP_AB (A's rows as the MMA's N: {list(SWAP_BLOCK_M)})"
    if problem.shape[0] > SWAP_MAX_M:
        return f"swap: M={problem.shape[0]} > {SWAP_MAX_M} fills the MMA's 64-row side without SWAP_AB"
    if problem.flag("layout")[0] == "t":
        return "swap: A must be row-major (K-major) for SWAP_AB"
    if params["C_STORE"] == "tma" or params["CLUSTER_M"] > 1:
        return "swap: SWAP_AB stores C from registers (C_STORE=direct) without clusters (CLUSTER_M=1)"
    return None


def _split_check(params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
    k_tiles = -(-problem.shape[2] // params["BLOCK_K"])
    if units(params, problem) > MAX_SPLIT_UNITS:
        return f"split-K: {units(params, problem)} work units > the workspace's {MAX_SPLIT_UNITS}"
    if tiles(params, problem) >= device.sm_count:
        return f"split-K: {tiles(params, problem)} tiles already fill {device.sm_count} multiprocessors"
    if params["SPLIT_K"] > k_tiles:
        return f"split-K: {params['SPLIT_K']} parts of {k_tiles} k tiles"
    return None


def candidates() -> Iterator[dict[str, Any]]:
    """The configs ``check`` may accept: on the mma.sync path the whole product of its parameters
    (864 configs, the wgmma path's own at their first values, BLOCK_K 32 or 64); on the wgmma path
    swizzled stages 64 deep (16-bit) or 128 deep (e4m3), ping-pong with its fixed values only."""
    names = [p.name for p in PARAMS]
    choices = {p.name: p.choices for p in PARAMS}
    sync = dict(choices, MMA=("sync",), STAGES=tuple(n for n in choices["STAGES"] if n <= MAX_SYNC_STAGES),
                BLOCK_K=tuple(k for k in choices["BLOCK_K"] if k != FP8_BLOCK_K),
                **{n: choices[n][:1] for n in HOPPER_PARAMS})
    hopper = dict(choices, MMA=("wgmma",), BLOCK_K=(WGMMA_BLOCK_K, FP8_BLOCK_K), SMEM_LAYOUT=("swizzle",),
                  PINGPONG=(0,))
    pingpong_ = dict(hopper, PINGPONG=(1,), **{n: (v,) for n, v in PINGPONG_FIXED.items()})
    for space in (sync, hopper, pingpong_):
        for values in itertools.product(*(space[n] for n in names)):
            yield dict(zip(names, values))


_FIRST = {p.name: p.choices[0] for p in PARAMS}


def _first(name: str) -> Any:
    return _FIRST[name]


def _power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
