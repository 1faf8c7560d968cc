"""The CUDA source and the launch of one attention config: ``kernel.cu.j2`` for the cp.async
paths, ``hopper.cu.j2`` for the TMA path (LOADS=tma). With those and ``space.py`` this is what
the template hash covers (``AttentionFamily.kernel_files``)."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from templates.attention import problem as _problem
from templates.attention import space as _space
from templates.family import KernelArg, Launch, Params, Problem, TemplateError, TensorMap

KERNEL_NAME = "attention_fwd"
COMPILE_OPTIONS = ("-O3", "-std=c++17")

_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    # PTX operands ({%0,%1}) collide with Jinja's default block syntax.
    block_start_string="/*%",
    block_end_string="%*/",
    comment_start_string="/*#",
    comment_end_string="#*/",
)
_TEMPLATES = {"cp.async": _ENVIRONMENT.get_template("kernel.cu.j2"), "tma": _ENVIRONMENT.get_template("hopper.cu.j2")}
# Rows of one TMA store box of O (one consumer warpgroup's).
STORE_ROWS = 64
TILE_COUNTER = "tile_counter"


def source(params: Params, problem: Problem) -> str:
    """CUDA C++ for ``params`` (already checked to be in the space)."""
    head_dim = problem.shape[3]
    tiles = _space.m_tiles(params)
    if tiles != int(tiles):
        raise TemplateError(f"attention: cannot render {dict(params)}: BLOCK_M not divisible")
    comment = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
    # What the source depends on, and no more: B, H and S are arguments, so problems that share
    # D, dtype and causal share each config's source, and so its compiled cubin (cache key).
    for_problems = f"D={head_dim} {problem.dtype}{' causal' if problem.flag('causal') else ''}, any B, H, S, KV heads"
    return _TEMPLATES[params["LOADS"]].render(
        **params,
        config_comment=f"{for_problems}; {comment}",
        kernel_name=KERNEL_NAME,
        head_dim=head_dim,
        padded_dim=_space.padded_dim(head_dim),
        acc_dim=_space.acc_dim(params, head_dim),
        causal=problem.flag("causal"),
        m_tiles=int(tiles),
        row_stride=_space.row_stride(params, head_dim),
        swizzle=params["SMEM_LAYOUT"] == "swizzle",
        threads=_space.threads(params),
        ptx_type="f16" if problem.dtype == "fp16" else "bf16",
        consumers=_space.consumers(params),
        consumer_regs=_space.consumer_registers(params) if _space.tma(params) else 0,
        wgmma=params["MMA"] == "wgmma",
        # name, N, A from registers, B N-major (transposed)
        wgmma_ops=(("wgmma_s_ss", params["BLOCK_N"], False, 0), ("wgmma_s_rs", params["BLOCK_N"], True, 0),
                   ("wgmma_pv", _space.padded_dim(head_dim), True, 1)),
        ptx_regs=_ptx_regs,
        acc_operands=_acc_operands,
    )


def launch(params: Params, problem: Problem) -> Launch:
    b, h, s, d = problem.shape[:4]
    group = _problem.group(problem.shape)
    m_blocks = (s + params["BLOCK_M"] - 1) // params["BLOCK_M"]
    block, smem = (_space.threads(params), 1, 1), _space.smem_bytes(params, d)
    if not _space.tma(params):
        args = (KernelArg("buffer", "q"), KernelArg("buffer", "k"), KernelArg("buffer", "v"),
                KernelArg("buffer", "o"), KernelArg("i32", s), KernelArg("i32", group),
                KernelArg("f32", _space.scale_log2(d)))
        return Launch(KERNEL_NAME, (m_blocks, h, b), block, smem, args)
    # the TMA path: a 1-D grid over the work tiles (persistent: at most the SMs' blocks)
    maps = tuple(KernelArg("tensormap", tensor_map(name, rows, problem))
                 for name, rows in (("q", params["BLOCK_M"]), ("k", params["BLOCK_N"]),
                                    ("v", params["BLOCK_N"]), ("o", STORE_ROWS)))
    args = maps + (KernelArg("buffer", "o"), KernelArg("i32", s), KernelArg("i32", b * h), KernelArg("i32", group),
                   KernelArg("f32", _space.scale_log2(d)))
    grid = (m_blocks * b * h, 1, 1)
    if not _space.persistent(params):
        return Launch(KERNEL_NAME, grid, block, smem, args)
    # the next tile to take, and how many blocks have taken their last (zeroed when allocated,
    # and zero again after each launch)
    return Launch(KERNEL_NAME, grid, block, smem, args + (KernelArg("buffer", TILE_COUNTER),),
                  workspace=((TILE_COUNTER, 8),), blocks_per_sm_cap=_space.blocks_per_sm(params))


@functools.lru_cache(maxsize=256)  # a study asks for the same few for each config it screens
def tensor_map(buffer: str, rows: int, problem: Problem) -> TensorMap:
    """A (B, H, S, D) tensor as the 3-D map {D, S, B*H} (K and V: {D, S, B*HKV}): a box is 64
    columns of ``rows`` rows of one head, 128-byte swizzled (D/64 boxes a tile, rounded up: the
    second box of D=96 is half past D); rows and columns past the tensor read as zeros and are
    never written."""
    b, h, s, d = problem.shape[:4]
    heads = _problem.kv_heads(problem.shape) if buffer in ("k", "v") else h
    return TensorMap(buffer, 2, (d, s, b * heads), (2 * d, 2 * d * s), (64, rows, 1), swizzle=128)


def _ptx_regs(first: int, count: int) -> str:
    """A PTX vector of asm operands: {%first, ..., %last}."""
    return "{" + ", ".join(f"%{i}" for i in range(first, first + count)) + "}"


def _acc_operands(n: int) -> str:
    """The read-write asm operands of an m64nN f32 accumulator held as d[N/8][4]."""
    return ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(n // 2))
