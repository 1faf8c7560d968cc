"""What the compiled attention kernels are made of: the SASS, read with cuobjdump.

The space's claims (tensor cores through ldmatrix + mma.sync or through wgmma, exp2 on the
multi-function unit, 16-byte cp.async loads, or TMA copies completing on mbarriers with
setmaxnreg moving registers, registers that do not spill) are checked in the machine code, not
assumed. Needs nvcc and cuobjdump (with nvdisasm); skipped where either is missing.
"""

from __future__ import annotations

import collections
import re

import pytest

from sass_tools import needs_sass, opcode_counts, sass_of, sass_of_each
from templates import get_family
from templates.family import H100_LIMITS
from workers.results import CompileRequest

pytestmark = needs_sass

FAMILY = get_family("attention")
PROBLEM = FAMILY.parse_problem("4,16,4096,128", "fp16", {"causal": True})
BASE = dict(FAMILY.default_params(), BLOCK_M=128, BLOCK_N=64, NUM_WARPS=8, STAGES=2, SMEM_LAYOUT="swizzle",
            WARP_SPECIALIZED=0, Q_IN_REGS=0)
# The TMA path (hopper.cu.j2): FA3's D=128 tile, setmaxnreg 24/240, S(j+1) before the softmax of S(j).
TMA = dict(BASE, BLOCK_N=128, MMA="wgmma", WARP_SPECIALIZED=1, LOADS="tma", PRODUCER_REGS=24, INTRA_OVERLAP=1)


def disassemble(params, tmp_path, problem=PROBLEM) -> str:
    request = CompileRequest(FAMILY.render(params, problem), "attention_fwd", FAMILY.compile_options(params, problem))
    return sass_of(request, tmp_path)


def opcodes(params, tmp_path, problem=PROBLEM) -> collections.Counter:
    """Opcode counts of the kernel's SASS, each under its base name and its full name."""
    return opcode_counts(disassemble(params, tmp_path, problem))


def test_mma_sync_path_is_ldmatrix_and_hmma_with_exp2_and_16_byte_copies(tmp_path):
    ops = opcodes(dict(BASE, MMA="sync"), tmp_path)
    # one warp's 16 rows per 64-key step: Q K^T is (D/16) * (64/8) = 64 m16n8k16 mmas, P V is
    # (64/16) * (D/8) = 64; the loop body appears once in the machine code (no masked copy of it).
    assert ops["HMMA.16816.F32"] + ops["HMMA.16816.F32.BF16"] == 128
    assert ops["LDSM"] > 0 and ops["HGMMA"] == 0
    assert ops["MUFU.EX2"] > 0
    assert ops["LDGSTS.E.BYPASS.128"] + ops["LDGSTS.E.BYPASS.LTC128B.128"] > 0
    assert ops["LDL"] == ops["STL"] == 0  # no local memory: nothing spilled


def test_wgmma_path_issues_hgmma_from_shared_memory_and_registers(tmp_path):
    ops = opcodes(dict(BASE, MMA="wgmma"), tmp_path)
    # per 64-key step: D/16 = 8 for S = Q K^T and BLOCK_N/16 = 4 for O += P V
    assert ops["HGMMA"] == 12
    assert ops["HMMA"] == 0 and ops["LDSM"] == 0  # Q and K/V read by the tensor cores themselves
    assert ops["MUFU.EX2"] > 0
    assert ops["LDL"] == ops["STL"] == 0


def test_q_in_registers_feeds_wgmma_from_ldmatrix(tmp_path):
    ops = opcodes(dict(BASE, MMA="wgmma", Q_IN_REGS=1), tmp_path)
    assert ops["HGMMA"] == 12 and ops["LDSM"] == 8  # Q's fragments loaded once: D/16 ldmatrix.x4


def test_q_fragments_stay_live_across_the_kv_loop(tmp_path):
    """Q's registers (A of S = Q K^T) must not be reused for P (A of O += P V): once they were,
    and every K/V step after the first multiplied by the previous step's P."""
    sass = disassemble(dict(BASE, MMA="wgmma", Q_IN_REGS=1, BLOCK_N=128), tmp_path)
    a_regs = collections.defaultdict(set)
    for match in re.finditer(r"HGMMA\.\S+ R\d+, (R\d+), gdesc\[\w+\](\.tnspB)?", sass):
        a_regs["pv" if match.group(2) else "s"].add(match.group(1))
    assert len(a_regs["s"]) == 8 and len(a_regs["pv"]) == 8
    assert not a_regs["s"] & a_regs["pv"]


def test_tma_path_loads_by_tma_waits_on_mbarriers_and_moves_registers(tmp_path):
    ops = opcodes(TMA, tmp_path)
    assert ops["UTMALDG"] > 0 and ops["LDGSTS"] == 0  # Q, K and V by the copy engine alone
    assert sum(n for op, n in ops.items() if op.startswith("SYNCS") and "." not in op) > 0  # mbarrier waits
    assert ops["USETMAXREG"] == 2  # the producer gives registers up, the consumers take them
    # per 128-key step: D/16 = 8 for S = Q K^T and BLOCK_N/16 = 8 for O += P V (the loop body
    # once, its first S and last P V outside it)
    assert ops["HGMMA"] == 32
    assert ops["UTMASTG"] == 0 and ops["LDL"] == ops["STL"] == 0


def test_tma_path_variants_keep_out_of_local_memory(tmp_path):
    d64 = FAMILY.parse_problem("4,16,4096,64", "fp16", {"causal": True})
    variants = ((dict(TMA, PINGPONG=1, EPILOGUE="tma"), PROBLEM),
                (dict(TMA, PRODUCER_REGS=0, BLOCK_N=96, INTRA_OVERLAP=0), PROBLEM),
                (dict(TMA, BLOCK_M=192, NUM_WARPS=12, BLOCK_N=64, INTRA_OVERLAP=0, STAGES=4), PROBLEM),
                (dict(TMA, BLOCK_M=64, NUM_WARPS=4, BLOCK_N=176, PRODUCER_REGS=56), PROBLEM),
                (dict(TMA, PINGPONG=1, SCHEDULE="persistent", EPILOGUE="tma"), PROBLEM),
                (dict(TMA, PINGPONG=1, SCHEDULE="persistent", INTRA_OVERLAP=0, BLOCK_N=64), PROBLEM),
                (dict(TMA, BLOCK_M=64, NUM_WARPS=4, BLOCKS_PER_SM=2, BLOCK_N=64, SCHEDULE="persistent"),
                 PROBLEM),
                (dict(TMA, PRODUCER_REGS=0, BLOCK_N=96, INTRA_OVERLAP=0, SCHEDULE="persistent"), d64))
    for variant, problem in variants:
        assert FAMILY.check(variant, problem, H100_LIMITS) is None, variant
    requests = [CompileRequest(FAMILY.render(v, p), "attention_fwd", FAMILY.compile_options(v, p)) for v, p in variants]
    for (variant, _), sass in zip(variants, sass_of_each(requests, tmp_path)):
        ops = opcode_counts(sass)
        assert ops["LDL"] == ops["STL"] == 0 and ops["LDGSTS"] == 0, variant
        assert ops["UTMALDG"] > 0 and (ops["UTMASTG"] > 0) == (variant["EPILOGUE"] == "tma"), variant
        assert (ops["USETMAXREG"] > 0) == (variant["PRODUCER_REGS"] > 0), variant


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_SKIP = re.compile(r"@!?P\d\s+BRA\s+(?:!?P\d,\s*)?0x([0-9a-f]+)")


def masking_outside_branches(sass: str) -> tuple[int, int]:
    """The masking selects (a score set to -inf) in the SASS, and how many of them no forward
    conditional branch skips: those run on every key block, masked or not. A branch skips a
    run of selects when it jumps over them from close before (64 instructions) to close after
    them: not a role's branch over a whole warpgroup's code, nor a barrier wait's jump to its
    retry code at the function's end."""
    code = [(int(a, 16), text.strip()) for a, text in _INSTRUCTION.findall(sass)]
    masks = {a for a, text in code if re.match(r"(?:@!?P\d\s+)?FSEL\S*\s.*-INF", text)}
    near = 64 * 16  # bytes: 64 instructions
    skippable: set[int] = set()
    for address, text in code:
        jump = _SKIP.match(text)
        target = int(jump.group(1), 16) if jump else -1
        inside = {a for a in masks if address < a < target}
        if inside and min(inside) - address <= near and target - max(inside) <= near:
            skippable |= inside
    return len(masks), len(masks - skippable)


@pytest.mark.parametrize(("params", "problem"), [
    (dict(TMA, BLOCK_N=176, PINGPONG=1, SCHEDULE="persistent", EPILOGUE="tma"), ("16,16,2048,64", False)),
    (dict(TMA, PINGPONG=1, SCHEDULE="persistent", TILE_ORDER="lpt"), ("4,16,4096,128", True)),
    (dict(BASE, MMA="wgmma", Q_IN_REGS=1, BLOCK_N=128, STAGES=3), ("4,16,4096,128", False)),
    (dict(BASE, MMA="sync", NUM_WARPS=4, SMEM_LAYOUT="pad8"), ("4,16,4096,64", True)),
])
def test_the_mask_runs_only_on_the_key_blocks_that_need_it(params, problem, tmp_path):
    """The tail and causal masks sit in a branch the warps skip on every other key block: a
    mask folded into the softmax's maximum was predicated on every block (at D=64, a select, a
    compare and an add per score: about a quarter of the loop's instructions)."""
    shape, causal = problem
    sass = disassemble(dict(FAMILY.default_params(), **params), tmp_path,
                       FAMILY.parse_problem(shape, "fp16", {"causal": causal}))
    selects, unskippable = masking_outside_branches(sass)
    assert selects >= 64  # the mask is there (one select per score of a block)
    assert unskippable == 0


@pytest.mark.parametrize(("d", "block_n", "pv_n"), [(64, 128, 64), (96, 128, 128), (128, 128, 128), (256, 64, 256)])
def test_tma_path_moves_64_column_boxes_and_multiplies_by_whole_swizzle_atoms(d, block_n, pv_n, tmp_path):
    """Per D: Q K^T in D/16 steps of k (D=96: 6, its columns past D never read), P V as one
    m64nNk16 with N = D rounded up to 64 columns (96: 128, its last 32 unused), and the copies a
    tile in D/64 boxes of 64 columns rounded up (96: 2, the second half past D)."""
    problem = FAMILY.parse_problem(f"4,16,4096,{d}", "fp16", {"causal": True})
    params = dict(TMA, BLOCK_N=block_n)
    sass = disassemble(params, tmp_path, problem)
    ops = opcode_counts(sass)
    # the loop body once, its first S and its last P V outside it
    assert ops["HGMMA"] == 2 * (d // 16 + block_n // 16)
    assert f"HGMMA.64x{pv_n}x16" in sass and f"HGMMA.64x{block_n}x16" in sass
    assert not {int(n) for n in re.findall(r"HGMMA\.64x(\d+)x16", sass)} - {pv_n, block_n}
    assert ops["UTMALDG"] == 7 * (-(-d // 64))  # Q, K and V (the producer's two K/V copy sites), a box each
    assert ops["LDL"] == ops["STL"] == 0


@pytest.mark.parametrize("d", [96, 256])
def test_cp_async_paths_at_d96_and_d256(d, tmp_path):
    """wgmma: D/16 + BLOCK_N/16 per 64-key step, P V of N = D in whole atoms; mma.sync: (D/16) *
    (64/8) for S and (64/16) * (D/8) for P V per warp's 16 rows, D itself (96: no padding)."""
    problem = FAMILY.parse_problem(f"4,16,4096,{d}", "fp16", {"causal": True})
    sass = disassemble(dict(BASE, MMA="wgmma"), tmp_path, problem)
    assert opcode_counts(sass)["HGMMA"] == d // 16 + 64 // 16
    assert f"HGMMA.64x{-(-d // 64) * 64}x16" in sass
    sync = dict(BASE, MMA="sync", BLOCK_M=64, NUM_WARPS=4, SMEM_LAYOUT="pad8")
    ops = opcodes(sync, tmp_path, problem)
    assert ops["HMMA.16816.F32"] == 2 * (d // 16) * 8
    assert ops["LDL"] == ops["STL"] == 0


@pytest.mark.parametrize(("d", "loads_in_flight"), [(64, 4), (128, 8), (96, 1)])
def test_a_whole_tiles_16_byte_store_epilogue_loads_before_it_stores(d, loads_in_flight, tmp_path):
    """The staged O rows come back from shared memory 16 bytes a load: at D 64 and 128 (two
    consumer warpgroups) a whole tile issues all of a warp's D/16 loads before its first global
    store; the checked loop (D 96 here) waits for each store's row check, load and store in turn.
    Every global store is one of 16 bytes (the compiler split the C++ form into four of 4 bytes)."""
    problem = FAMILY.parse_problem(f"4,16,4096,{d}", "fp16", {"causal": False})
    sass = disassemble(dict(TMA, PINGPONG=1, EPILOGUE="st16"), tmp_path, problem)
    stores = re.findall(r"\b(STG\S*)\s", sass)
    assert stores and set(stores) == {"STG.E.128"}
    order = "".join("L" if op.startswith("LDS") else "S" for op in re.findall(r"\b(LDS\S*\.128|STG\S*)\s", sass))
    assert max(len(run) for run in order.split("S")) == loads_in_flight
