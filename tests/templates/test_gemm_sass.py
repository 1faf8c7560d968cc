"""What the gemm family's compiled kernels are made of: the SASS of the wgmma path, read with
cuobjdump (TMA copies completing on mbarriers, wgmma from shared memory, setmaxnreg, no local
memory), beside the mma.sync path's. Needs nvcc and cuobjdump; skipped where either is missing."""

from __future__ import annotations

import re

import pytest

from sass_tools import needs_sass, opcode_counts, sass_of
from templates import get_family
from templates.family import H100_LIMITS
from templates.gemm import space
from workers.compile import compile_cubin, ptxas_advisories
from workers.results import CompileRequest

pytestmark = needs_sass

FAMILY = get_family("gemm")
WGMMA = dict(FAMILY.default_params(), MMA="wgmma", BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, NUM_WARPS=8, STAGES=4,
             PRODUCER_REGS=40)


def opcodes(params, problem, tmp_path):
    assert FAMILY.check(params, problem, H100_LIMITS) is None, params
    request = CompileRequest(FAMILY.render(params, problem), "gemm", FAMILY.compile_options(params, problem))
    return opcode_counts(sass_of(request, tmp_path))


def test_the_mma_sync_path_copies_by_cp_async_into_hmma(tmp_path):
    ops = opcodes(FAMILY.default_params(), FAMILY.parse_problem("4096,4096,4096", "fp16"), tmp_path)
    assert ops["HMMA"] > 0 and ops["LDGSTS"] > 0 and ops["HGMMA"] == ops["UTMALDG"] == 0
    assert ops["LDL"] == ops["STL"] == 0


@pytest.mark.parametrize("layout,dtype,epilogue", [("nn", "fp16", "none"), ("tt", "bf16", "bias_gelu"),
                                                   ("tn", "fp16", "bias_relu"), ("nt", "bf16", "none"),
                                                   ("nt", "bf16", "bias_gelu_tanh")])
def test_the_wgmma_path_loads_by_tma_and_multiplies_from_shared_memory(layout, dtype, epilogue, tmp_path):
    problem = FAMILY.parse_problem("4096,4096,4096", dtype, {"layout": layout, "epilogue": epilogue})
    ops = opcodes(WGMMA, problem, tmp_path)
    # a 64-deep stage: 4 k steps of one m64n256k16 a consumer warpgroup
    assert ops["HGMMA"] == 4 and ops["HMMA"] == 0 and ops["LDSM"] == 0
    assert ops["UTMALDG"] > 0 and ops["LDGSTS"] == 0  # A and B by the copy engine alone
    assert sum(n for op, n in ops.items() if op.startswith("SYNCS") and "." not in op) > 0  # mbarrier waits
    assert ops["USETMAXREG"] == 2  # the producer gives registers up, the consumers take them
    assert ops["LDL"] == ops["STL"] == 0


@pytest.mark.parametrize("tile", [(128, 128, 4, 4, 40), (256, 128, 8, 3, 24), (64, 128, 4, 2, 0), (64, 64, 4, 4, 0)])
def test_wgmma_variants_keep_out_of_local_memory(tile, tmp_path):
    bm, bn, warps, stages, regs = tile
    params = dict(WGMMA, BLOCK_M=bm, BLOCK_N=bn, NUM_WARPS=warps, STAGES=stages, PRODUCER_REGS=regs)
    ops = opcodes(params, FAMILY.parse_problem("1000,1000,1000", "bf16", {"layout": "nt", "epilogue": "bias"}),
                  tmp_path)
    # rows of a consumer warpgroup / 64 m64 wgmmas a k step, 4 k steps a stage (the compiler
    # may unroll the loop over the stages: a multiple of that)
    per_stage = 4 * (bm // (warps // 4) // 64)
    assert ops["HGMMA"] > 0 and ops["HGMMA"] % per_stage == 0
    assert ops["LDL"] == ops["STL"] == 0 and ops["LDGSTS"] == 0
    assert (ops["USETMAXREG"] > 0) == (regs > 0)


def test_split_k_counts_with_one_atomic_and_reads_the_parts_through_l2(tmp_path):
    params = dict(WGMMA, BLOCK_M=64, BLOCK_N=128, NUM_WARPS=4, PRODUCER_REGS=0, SPLIT_K=4)
    ops = opcodes(params, FAMILY.parse_problem("64,4096,14336", "bf16", {"layout": "nt"}), tmp_path)
    assert ops["ATOMG.E.ADD.STRONG.GPU"] == 1  # the tile's counter
    assert ops["LDG.E.128.STRONG.GPU"] > 0 and ops["STG.E.128"] > 0  # parts out and back as float4s
    assert ops["LDL"] == ops["STL"] == 0


def test_a_cluster_multicasts_b_and_plain_tiles_do_not(tmp_path):
    problem = FAMILY.parse_problem("4096,4096,4096", "bf16", {"layout": "nt"})
    ops = opcodes(dict(WGMMA, CLUSTER_M=2, PERSISTENT=1), problem, tmp_path)
    assert ops["UTMALDG.2D.MULTICAST"] > 0 and ops["UTMALDG.2D"] > 0  # B's half to both, A to its own
    assert ops["UCGABAR_WAIT"] > 0  # the cluster's barriers at the start and the end
    assert ops["LDL"] == ops["STL"] == 0
    plain = opcodes(WGMMA, problem, tmp_path)
    assert plain["UTMALDG.2D.MULTICAST"] == 0 and plain["ATOMG.E.ADD.STRONG.GPU"] == 0


@pytest.mark.parametrize("params", [FAMILY.default_params(), WGMMA], ids=["sync", "wgmma"])
def test_gelu_tanh_is_one_tanh_an_element(params, tmp_path):
    """GELU's tanh form by tanh.approx: MUFU.TANH, one an element, no exponential, no erf
    polynomial and no call to a division routine; without the epilogue, no MUFU.TANH."""
    def problem(epilogue):
        return FAMILY.parse_problem("4096,4096,4096", "bf16", {"layout": "nt", "epilogue": epilogue})

    tanh = opcodes(params, problem("bias_gelu_tanh"), tmp_path)
    (tmp_path / "plain").mkdir()
    plain = opcodes(params, problem("bias"), tmp_path / "plain")
    assert plain["MUFU.TANH"] == 0 and tanh["MUFU.TANH"] > 0
    assert tanh["MUFU.EX2"] == plain["MUFU.EX2"] and tanh["MUFU.RCP"] == plain["MUFU.RCP"]
    assert tanh["CALL"] == 0 and tanh["LDL"] == tanh["STL"] == 0


@pytest.mark.parametrize("scale", ["tensor", "block"])
def test_e4m3_multiplies_by_the_fp8_wgmma_from_shared_memory(scale, tmp_path):
    """e4m3: QGMMA ... E4M3.E4M3 (wgmma's m64nNk32 FP8 form, Hopper's SASS name for it; 16-bit
    wgmma is HGMMA), 4 k steps of 32 a 128-deep stage, A
    and B by TMA, no 16-bit HGMMA; block scales read their scales from global memory each stage."""
    problem = FAMILY.parse_problem("4096,4096,4096", "e4m3", {"layout": "nt", "scale": scale, "epilogue": "bias"})
    params = dict(WGMMA, BLOCK_N=128, BLOCK_K=128)
    assert FAMILY.check(params, problem, H100_LIMITS) is None
    request = CompileRequest(FAMILY.render(params, problem), "gemm", FAMILY.compile_options(params, problem))
    sass = sass_of(request, tmp_path)
    ops = opcode_counts(sass)
    # the compiler may unroll the loop over the stages: a multiple of 4
    assert ops["QGMMA"] > 0 and ops["QGMMA"] % 4 == 0 and sass.count("QGMMA.64x128x32.F32.E4M3.E4M3") == ops["QGMMA"]
    assert ops["HGMMA"] == 0 and ops["HMMA"] == 0 and ops["UTMALDG"] > 0 and ops["LDGSTS"] == 0
    assert ops["LDL"] == ops["STL"] == 0
    plain = FAMILY.parse_problem("4096,4096,4096", "e4m3", {"layout": "nt", "epilogue": "bias"})
    (tmp_path / "plain").mkdir()
    tensor = opcode_counts(sass_of(CompileRequest(FAMILY.render(params, plain), "gemm",
                                                  FAMILY.compile_options(params, plain)), tmp_path / "plain"))
    if scale == "block":  # the row and column scales, loaded in the k loop
        assert ops["LDG"] > tensor["LDG"]


@pytest.mark.parametrize("scale", ["tensor", "block"])
def test_e4m3_issues_a_second_k_block_before_promoting_the_first(scale, tmp_path):
    """128 x 128 on two consumer warpgroups keeps two sets of a K block's products: the second
    block's QGMMAs are issued before the first's are promoted (a wait for all groups but the last,
    ``WARPGROUP.DEPBAR.LE gsb0, 0x1``), and ptxas neither serializes the wgmmas (C7514) nor injects
    waits of its own (C7517). 128 x 192 keeps one set: every wait is for all groups."""
    problem = FAMILY.parse_problem("4096,4096,4096", "e4m3", {"layout": "nt", "scale": scale})
    two = dict(WGMMA, BLOCK_N=128, BLOCK_K=128, PERSISTENT=1, C_STORE="tma")
    assert space.fp8_part_sets(two) == 2 and FAMILY.check(two, problem, H100_LIMITS) is None
    request = CompileRequest(FAMILY.render(two, problem), "gemm", FAMILY.compile_options(two, problem))
    assert ptxas_advisories(compile_cubin(request, cache_dir=tmp_path).log) == ()
    sass = sass_of(request, tmp_path)
    # four k steps a block: two blocks a step of the loop, an odd count's last block after it
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in sass and opcode_counts(sass)["QGMMA"] == 12
    if scale == "tensor":
        one = dict(two, BLOCK_N=192)
        assert space.fp8_part_sets(one) == 1
        (tmp_path / "one").mkdir()
        sass = sass_of(CompileRequest(FAMILY.render(one, problem), "gemm", FAMILY.compile_options(one, problem)),
                       tmp_path / "one")
        assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" not in sass and "WARPGROUP.DEPBAR.LE gsb0, 0x0" in sass


def test_pingpong_warpgroups_pass_turns_on_named_barriers(tmp_path):
    problem = FAMILY.parse_problem("8192,3072,768", "fp16", {"layout": "nt", "epilogue": "bias_gelu_tanh"})
    params = dict(WGMMA, BLOCK_N=128, STAGES=6, PERSISTENT=1, C_STORE="tma", PINGPONG=1)
    ops = opcodes(params, problem, tmp_path)
    # one warpgroup a whole 128-row tile: two m64n128k16 a k step, four k steps a stage
    assert ops["HGMMA"] > 0 and ops["HGMMA"] % 8 == 0
    turns = {op: n for op, n in ops.items() if op.startswith(("BAR.SYNC", "BAR.ARV"))}
    assert any(op.startswith("BAR.ARV") for op in turns), ops  # a warpgroup passes its turn
    assert ops["LDL"] == ops["STL"] == 0
    shared = opcodes(dict(params, PINGPONG=0), problem, tmp_path)
    assert not any(op.startswith("BAR.ARV") for op in shared)


@pytest.mark.parametrize("pingpong,block_m", [(0, 128), (1, 64)], ids=["cooperative", "pingpong"])
def test_c_by_tma_loads_the_tiles_bias_before_its_first_box(pingpong, block_m, tmp_path):
    """With C stored by TMA, a thread's bias columns of the whole tile (BLOCK_N/8 pairs) are loaded
    before the epilogue's first stmatrix: no load waits behind a box's barrier (loaded box by box,
    the bias cost these kernels 5-20% at K=768)."""
    problem = FAMILY.parse_problem("8192,3072,768", "bf16", {"layout": "nt", "epilogue": "bias"})
    params = dict(WGMMA, BLOCK_M=block_m, PERSISTENT=1, C_STORE="tma", PINGPONG=pingpong, GROUP_M=16)
    assert FAMILY.check(params, problem, H100_LIMITS) is None
    request = CompileRequest(FAMILY.render(params, problem), "gemm", FAMILY.compile_options(params, problem))
    order = "".join("L" if op.startswith("LDG") else "S"
                    for op in re.findall(r"\b(LDG\S*|STSM\S*)\s", sass_of(request, tmp_path)))
    # two 16-bit loads a column pair, a pair an 8-column n-tile: all of them, then every box's stores
    assert order == "L" * (2 * 256 // 8) + "S" * order.count("S") and order.count("S") > 0
