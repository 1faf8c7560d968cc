"""The attention family's parameter space and its constraints."""

from __future__ import annotations

import itertools
import math
from typing import Any, Iterator, Mapping

from templates.family import DeviceLimits, Param, Problem

PARAMS: tuple[Param, ...] = (
    Param("BLOCK_M", (64, 128, 32, 192), "query rows per thread block (32: more blocks for small problems; "
          "192: three consumer warpgroups, TMA path)"),
    Param("BLOCK_N", (32, 64, 128, 96, 160, 176, 192, 80), "keys per step of the K/V loop (96, 160 and up: "
          "TMA path; 80: TMA path at D=256)"),
    Param("NUM_WARPS", (4, 8, 2, 12), "warps that compute (16 or 32 rows each; 12: TMA path)"),
    Param("STAGES", (1, 2, 3, 4), "K/V stages in shared memory (1: no overlap; 4: TMA path)"),
    Param("SMEM_LAYOUT", ("pad8", "swizzle", "pad0", "pad16"), "row padding in halves, or XOR swizzle"),
    Param("WARP_SPECIALIZED", (0, 1), "the compute warps only compute: a producer warp (cp.async) or "
          "warpgroup (TMA) loads"),
    Param("Q_IN_REGS", (1, 0), "keep Q's mma fragments in registers across the K/V loop"),
    Param("MMA", ("sync", "wgmma"), "tensor-core path: warp mma.sync, or warpgroup wgmma (sm_90a)"),
    # The Hopper pipeline (hopper.cu.j2). Each new parameter's first choice is what the kernels
    # before it did, so older configs keep their meaning with these at their first choice.
    Param("LOADS", ("cp.async", "tma"), "how tiles arrive: cp.async from the compute warps or a producer "
          "warp, or TMA (cp.async.bulk.tensor) issued by one thread of a producer warpgroup into "
          "mbarrier-tracked stages"),
    Param("PRODUCER_REGS", (0, 24, 40, 56), "TMA path: setmaxnreg gives the producer warpgroup this many "
          "registers a thread and the consumers the rest (0: no setmaxnreg)"),
    Param("INTRA_OVERLAP", (0, 1), "TMA path: issue S(j+1) = Q K(j+1)^T and O += P(j) V(j) together, "
          "the softmax of S(j+1) under O's product"),
    Param("PINGPONG", (0, 1), "TMA path, two consumer warpgroups: they take turns issuing their "
          "products (named barriers), one's softmax under the other's products"),
    Param("EPILOGUE", ("st16", "tma"), "O staged in shared memory, then 16-byte stores with a row check, "
          "or a TMA store (TMA path)"),
    Param("SCHEDULE", ("grid", "persistent"), "TMA path: a block a work tile (BLOCK_M rows of one head), or "
          "as many blocks as the SMs hold, each taking the next tile from a counter while its producer "
          "loads that tile's Q and K (O staged apart from Q)"),
    Param("TILE_ORDER", ("head", "lpt"), "TMA path, causal: the tiles head by head (a head's longest "
          "first), or the longest of all first, head by head in sections whose K and V fit the L2"),
    Param("BLOCKS_PER_SM", (1, 2), "TMA path: blocks an SM holds at once (the launch bound): two "
          "halve each thread's registers and need both blocks' shared memory to fit"),
)

HOPPER_ONLY = {"BLOCK_M": (192,), "BLOCK_N": (96, 160, 176, 192, 80), "NUM_WARPS": (12,), "STAGES": (4,)}
# FA3's key block at D=256: two stages of 80 keys beside Q's 64 KB fill shared memory, where 96 do
# not fit; 1.03-1.06x the 64-key block at D=256 (H200, docs/BENCHMARKS.md). Not offered at
# narrower heads, where 96 keys and more fit.
KEYS_AT_D256_ONLY = 80
HOPPER_PARAMS = ("PRODUCER_REGS", "INTRA_OVERLAP", "PINGPONG", "EPILOGUE", "SCHEDULE", "TILE_ORDER",
                 "BLOCKS_PER_SM")
# Registers of a thread that the launch bound (BLOCKS_PER_SM blocks an SM) leaves each warpgroup count.
REGISTER_FILE = 65536
# Hopper's shared memory per SM (228 KiB), and what the hardware keeps of it for each block.
SMEM_PER_SM = 233472
SMEM_RESERVED_PER_BLOCK = 1024
MAX_CONSUMER_REGS = 240
# TMA path: registers a consumer thread keeps free beside its fragments (fragment_registers).
# ptxas' reports of 1,570 configs (D 64 and 128, causal bf16, every setmaxnreg, overlap,
# ping-pong and epilogue choice): at 224-255 registers none spilled with its fragments within
# the budget, at 128-168 some did with up to 16 registers to spare, none with 24; ping-pong
# without the overlap (two turns a step) spilled with up to 24 to spare, never with 32.
TIGHT_BUDGET = 224
TIGHT_RESERVE = 24
PINGPONG_RESERVE = 32
# Two blocks an SM, from ptxas' reports of every such config of D 64 and 128: at 104
# and 128 registers they spilled with 24 and 32 to spare, not with 48; at 200-232 none spilled.
TWO_BLOCK_LOW_BUDGET = 128
TWO_BLOCK_LOW_RESERVE = 48
# An O accumulator of 256 columns (D=256: 128 registers a thread), from ptxas' reports of every
# TMA config of D=256 (bf16 causal and fp16 without the mask, sm_90a, nvcc 13.0): with the
# overlap, configs spilled with up to 32 registers to spare, none with 40 or more; with the
# overlap, the persistent schedule and the TMA store, with up to 63 to spare.
# Of 80 keys (KEYS_AT_D256_ONLY; every such config, the same two problems, nvcc 13.0): with the
# overlap, spilled with 16 and 24 registers to spare, none with 32 (but the persistent ones with
# the TMA store, up to 47).
WIDE_ACC = 256
WIDE_OVERLAP_RESERVE = 40
WIDE_OVERLAP_RESERVE_AT_80_KEYS = 32
WIDE_PERSISTENT_STORE_RESERVE = 64
# The cp.async paths at D=256 and D=96, from ptxas' reports of every config (same two problems):
# mma.sync on the XOR-swizzled tiles spilled in 52 of 64 at D=256 (its addresses beside the
# accumulators) and 55 of 144 at D=96 (rows padded to 128 elements); the others kept out of local
# memory with 48 registers free under the launch bound, which ptxas takes for whole groups of four
# warps (nine warps: 168 registers, not 224), except at D=96 mma.sync with two 16-row tiles a
# warp, Q from shared memory and 64 keys in two stages or three (12 of 24, fp16).
WIDE_RESERVE = 48
ALLOCATION_WARPS = 4
# D=96 on the TMA path (tiles and accumulator of D=128's width), from ptxas' reports of every
# config (fp16 without the mask, bf16 causal, sm_90a, nvcc 13.0): 59 of 1,824 spilled, all
# within these reserves: the overlap with the TMA store with up to 15 registers to spare (and
# persistent, under 224 registers, 40); three consumer warpgroups with the overlap, 32;
# ping-pong without the overlap, 32. (D=128's configs of the same tiles spilled alike under
# nvcc 13.0; its reserves above stay those measured with the toolchain of its landscapes.)
PADDED_OVERLAP_STORE_RESERVE = 24
PADDED_OVERLAP_PERSISTENT_STORE_RESERVE = 48
PADDED_THREE_CONSUMERS_OVERLAP_RESERVE = 40
PADDED_PINGPONG_RESERVE = 40

REGISTER_LIMIT = 255
# Fragment registers a compute thread may hold before the compiler must spill; the rest of the
# 255 go to addresses, indices, softmax state and the mma operands in flight.
FRAGMENT_REGISTER_BUDGET = 200


def m_tiles(params: Mapping[str, Any]) -> float:
    """16-row mma tiles per compute warp."""
    return params["BLOCK_M"] / (16 * params["NUM_WARPS"])


def padded_dim(head_dim: int) -> int:
    """D rounded up to whole 64-column swizzle atoms (128 bytes of 16-bit elements): the width of
    a swizzled tile in shared memory and of wgmma's O accumulator (its N for P V). D=96 is kept
    as 128 columns whose last 32 are never read for S nor stored from O (the TMA fills them with
    zeros, the columns past D of the tensor); 64, 128 and 256 are their own."""
    return -(-head_dim // 64) * 64


def row_stride(params: Mapping[str, Any], head_dim: int) -> int:
    layout = params["SMEM_LAYOUT"]
    if layout == "swizzle":
        return padded_dim(head_dim)
    return head_dim + (int(layout[3:]) if layout.startswith("pad") else 0)


def acc_dim(params: Mapping[str, Any], head_dim: int) -> int:
    """Columns of O's accumulator a 16-row tile holds: D with mma.sync (8 columns an mma),
    the padded D with wgmma (P V's N covers whole swizzle atoms)."""
    return padded_dim(head_dim) if params["MMA"] == "wgmma" else head_dim


def tma(params: Mapping[str, Any]) -> bool:
    return params["LOADS"] == "tma"


def consumers(params: Mapping[str, Any]) -> int:
    """TMA path: consumer warpgroups (64 query rows each)."""
    return params["NUM_WARPS"] // 4


def threads(params: Mapping[str, Any]) -> int:
    if tma(params):  # a producer warpgroup beside the consumers
        return 32 * params["NUM_WARPS"] + 128
    return 32 * (params["NUM_WARPS"] + params["WARP_SPECIALIZED"])


def blocks_per_sm(params: Mapping[str, Any]) -> int:
    """The launch bound's blocks per SM (one on the cp.async paths)."""
    return params["BLOCKS_PER_SM"] if tma(params) else 1


def persistent(params: Mapping[str, Any]) -> bool:
    return tma(params) and params["SCHEDULE"] == "persistent"


def launch_registers(params: Mapping[str, Any]) -> int:
    """The register cap a thread gets from __launch_bounds__(threads, blocks_per_sm)."""
    return min(255, REGISTER_FILE // (threads(params) * blocks_per_sm(params)) // 8 * 8)


def allocated_registers(params: Mapping[str, Any]) -> int:
    """The cap ptxas gives a thread under the launch bound, the block's warps counted in whole
    groups of ALLOCATION_WARPS (nine warps take twelve warps' share)."""
    warps = -(-threads(params) // 32 // ALLOCATION_WARPS) * ALLOCATION_WARPS
    return min(255, REGISTER_FILE // (32 * warps * blocks_per_sm(params)) // 8 * 8)


def consumer_registers(params: Mapping[str, Any]) -> int:
    """TMA path: the registers a consumer thread may use (after setmaxnreg, when it is on): what
    the producer gives up, shared among the consumer warpgroups, at most MAX_CONSUMER_REGS."""
    cap = launch_registers(params)
    if not params["PRODUCER_REGS"]:
        return cap
    pool = (1 + consumers(params)) * min(256, (cap + 7) // 8 * 8)
    return min(MAX_CONSUMER_REGS, (pool - params["PRODUCER_REGS"]) // consumers(params) // 8 * 8)


def scale_log2(head_dim: int) -> float:
    """The kernel's softmax scale argument: log2(e) / sqrt(D) (it exponentiates with exp2)."""
    return math.log2(math.e) / math.sqrt(head_dim)


def smem_bytes(params: Mapping[str, Any], head_dim: int) -> int:
    if tma(params):  # Q (and O apart when persistent), K/V stages, 1024 bytes to align the base, the
        # mbarriers (8 bytes each) and the tile's slot
        q_tiles = 2 if persistent(params) else 1
        rows = q_tiles * params["BLOCK_M"] + 2 * params["STAGES"] * params["BLOCK_N"]
        return 2 * padded_dim(head_dim) * rows + 1024 + 8 * (3 + 4 * params["STAGES"])
    rows = params["BLOCK_M"] + 2 * params["STAGES"] * params["BLOCK_N"]
    # wgmma's swizzle atoms must start on 1024-byte boundaries: room to align the base.
    slack = 1024 if params["MMA"] == "wgmma" else 0
    return 2 * rows * row_stride(params, head_dim) + slack


def fragment_registers(params: Mapping[str, Any], head_dim: int) -> int:
    """Registers per compute thread held across the K/V loop: the S and O accumulators and
    (optionally) Q's fragments. With mma.sync P is packed from S one 16-key step at a time, so it
    adds little; wgmma takes all of P's fragments at once."""
    tiles = int(m_tiles(params))
    per_tile = params["BLOCK_N"] // 2 + acc_dim(params, head_dim) // 2
    if params["Q_IN_REGS"]:
        per_tile += head_dim // 4
    if params["MMA"] == "wgmma":
        per_tile += params["BLOCK_N"] // 4
    if tma(params) and params["INTRA_OVERLAP"]:
        per_tile += params["BLOCK_N"] // 4  # P(j) in flight while S(j+1) becomes P(j+1)
    return tiles * per_tile


def check(params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
    """None when the config can run; otherwise the first reason it cannot."""
    head_dim = problem.shape[3]
    reason = _path_check(params)
    if reason:
        return reason
    if tma(params):
        return _hopper_check(params, problem, device)
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
    if threads(params) > device.max_threads_per_block:
        return f"threads: {threads(params)} > {device.max_threads_per_block}"
    smem = smem_bytes(params, head_dim)
    if smem > device.max_smem_per_block_optin:
        return f"shared memory: {smem} bytes > {device.max_smem_per_block_optin} opt-in limit"
    regs = fragment_registers(params, head_dim)
    if regs > FRAGMENT_REGISTER_BUDGET:
        return f"registers: {regs} fragment registers per thread > {FRAGMENT_REGISTER_BUDGET}"
    padded = padded_dim(head_dim) != head_dim
    if acc_dim(params, head_dim) >= WIDE_ACC or padded:
        if params["MMA"] == "sync" and params["SMEM_LAYOUT"] == "swizzle":
            return f"registers: mma.sync on XOR-swizzled tiles spills at D={head_dim} (ptxas): a padded layout, " \
                   "or wgmma"
        cap = allocated_registers(params)
        if regs + WIDE_RESERVE > cap:
            return f"registers: {regs} fragment registers (+{WIDE_RESERVE} kept free) per thread > {cap}, " \
                   f"what {threads(params)} threads leave each (D={head_dim})"
    if padded and params["MMA"] == "sync" and tiles == 2 and not params["Q_IN_REGS"] and params["BLOCK_N"] >= 64 \
            and params["STAGES"] >= 2 and not params["WARP_SPECIALIZED"]:
        return f"registers: two 16-row tiles a warp, Q from shared memory and {params['BLOCK_N']} keys a stage " \
               f"spill at D={head_dim} (ptxas)"
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


def _path_check(params: Mapping[str, Any]) -> str | None:
    """Each parameter's choices that belong to one path only: elsewhere the first choice, so no
    two configs render the same kernel."""
    if tma(params):
        return None
    for name, values in HOPPER_ONLY.items():
        if params[name] in values:
            return f"path: {name}={params[name]} only on the TMA path (LOADS=tma)"
    for name in HOPPER_PARAMS:
        if params[name] != _first(name):
            return f"irrelevant: {name} applies to the TMA path only (LOADS=tma)"
    return None


def candidates() -> Iterator[dict[str, Any]]:
    """The configs that the path rules of ``check`` leave, the valid ones among them: about a
    hundredth of the space's product (every config is a million; enumerating and checking them
    took a study 10 s before its first trial). On the cp.async paths none of the TMA path's
    choices; on the TMA path wgmma on swizzled tiles with a producer warpgroup, Q from shared
    memory, one consumer warpgroup per 64 rows, 64 keys or more, two stages or more."""
    names = [p.name for p in PARAMS]
    choices = {p.name: p.choices for p in PARAMS}
    cp_async = dict(choices, LOADS=("cp.async",), **{n: choices[n][:1] for n in HOPPER_PARAMS},
                    **{n: tuple(v for v in choices[n] if v not in HOPPER_ONLY[n]) for n in HOPPER_ONLY})
    hopper = dict(choices, LOADS=("tma",), MMA=("wgmma",), SMEM_LAYOUT=("swizzle",), WARP_SPECIALIZED=(1,),
                  Q_IN_REGS=(0,), NUM_WARPS=(None,), BLOCK_M=tuple(m for m in choices["BLOCK_M"] if m % 64 == 0),
                  BLOCK_N=tuple(n for n in choices["BLOCK_N"] if n >= 64),
                  STAGES=tuple(s for s in choices["STAGES"] if s >= 2))
    for values in itertools.product(*(cp_async[n] for n in names)):
        yield dict(zip(names, values))
    for values in itertools.product(*(hopper[n] for n in names)):
        config = dict(zip(names, values))
        config["NUM_WARPS"] = config["BLOCK_M"] // 16
        yield config


def _first(name: str) -> Any:
    return next(p.choices[0] for p in PARAMS if p.name == name)


def _hopper_check(params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
    head_dim = problem.shape[3]
    if device.compute_capability != (9, 0):
        return f"arch: TMA and wgmma need sm_90a, {device.name} is sm_{''.join(map(str, device.compute_capability))}"
    if params["MMA"] != "wgmma" or params["SMEM_LAYOUT"] != "swizzle" or params["WARP_SPECIALIZED"] != 1:
        return "irrelevant: the TMA path is wgmma on swizzled tiles with a producer warpgroup " \
               "(MMA=wgmma, SMEM_LAYOUT=swizzle, WARP_SPECIALIZED=1)"
    if params["Q_IN_REGS"]:
        # Q as wgmma's A from registers gave wrong outputs on the H200 in two configs without the
        # overlap (later K/V steps multiplied by a stale Q); FA3 reads Q from shared memory too.
        return "irrelevant: the TMA path reads Q from shared memory (Q_IN_REGS=0)"
    if params["BLOCK_M"] not in (64, 128, 192) or params["BLOCK_M"] != 16 * params["NUM_WARPS"]:
        return "divisibility: the TMA path has one consumer warpgroup per 64 rows (BLOCK_M 64, 128 " \
               "or 192 = 16*NUM_WARPS)"
    if params["BLOCK_N"] < 64:
        return "tile: the TMA path takes BLOCK_N of 64 and more"
    if params["BLOCK_N"] == KEYS_AT_D256_ONLY and head_dim != 256:
        return f"tile: {KEYS_AT_D256_ONLY} keys a step are D=256's (two stages of them fit beside its Q, as FA3 " \
               "takes them there; narrower heads fit 96 and more)"
    if params["STAGES"] < 2:
        return "stages: the TMA path keeps two K/V stages or more"
    if params["TILE_ORDER"] != "head" and not problem.flag("causal"):
        return "irrelevant: without the causal mask every tile is as long (TILE_ORDER=head)"
    if params["PINGPONG"] and consumers(params) != 2:
        return "irrelevant: ping-pong takes turns between two consumer warpgroups (BLOCK_M=128)"
    smem = smem_bytes(params, head_dim)
    if smem > device.max_smem_per_block_optin:
        return f"shared memory: {smem} bytes > {device.max_smem_per_block_optin} opt-in limit"
    blocks = blocks_per_sm(params)
    if blocks > 1 and blocks * (smem + SMEM_RESERVED_PER_BLOCK) > SMEM_PER_SM:
        return f"shared memory: {blocks} blocks of {smem} bytes do not fit an SM's {SMEM_PER_SM}"
    regs = fragment_registers(params, head_dim)
    budget = consumer_registers(params)
    reserve = TIGHT_RESERVE if budget < TIGHT_BUDGET else 0
    if params["PINGPONG"] and not params["INTRA_OVERLAP"]:
        reserve = PINGPONG_RESERVE
    if blocks > 1 and budget <= TWO_BLOCK_LOW_BUDGET:
        reserve = TWO_BLOCK_LOW_RESERVE
    if acc_dim(params, head_dim) >= WIDE_ACC and params["INTRA_OVERLAP"]:
        if persistent(params) and params["EPILOGUE"] == "tma":
            wide = WIDE_PERSISTENT_STORE_RESERVE
        else:
            wide = WIDE_OVERLAP_RESERVE_AT_80_KEYS if params["BLOCK_N"] == KEYS_AT_D256_ONLY else WIDE_OVERLAP_RESERVE
        reserve = max(reserve, wide)
    if padded_dim(head_dim) != head_dim:
        reserve = max(reserve, _padded_reserve(params, budget))
    if regs + reserve > budget:
        return f"registers: {regs} fragment registers (+{reserve} kept free) per consumer thread > {budget}"
    return None


def _padded_reserve(params: Mapping[str, Any], budget: int) -> int:
    """TMA path, D below its padded width (96): the registers kept free beside the fragments
    where ptxas spilled with fewer (PADDED_* above)."""
    overlap, store = params["INTRA_OVERLAP"], params["EPILOGUE"] == "tma"
    reserve = 0
    if overlap and store:
        reserve = PADDED_OVERLAP_PERSISTENT_STORE_RESERVE if persistent(params) and budget < TIGHT_BUDGET \
            else PADDED_OVERLAP_STORE_RESERVE
    if overlap and consumers(params) == 3:
        reserve = max(reserve, PADDED_THREE_CONSUMERS_OVERLAP_RESERVE)
    if params["PINGPONG"] and not overlap:
        reserve = max(reserve, PADDED_PINGPONG_RESERVE)
    return reserve
