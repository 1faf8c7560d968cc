"""The CUDA source and the launch of one attention config. With ``kernel.cu.j2`` and
``space.py`` this is what the template hash covers (``AttentionFamily.kernel_files``)."""

from __future__ import annotations

from pathlib import Path

import jinja2

from templates.attention import space as _space
from templates.family import KernelArg, Launch, Params, Problem, TemplateError

KERNEL_NAME = "attention_fwd"
COMPILE_OPTIONS = ("-O3", "-std=c++17")

_TEMPLATE = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    # PTX operands ({%0,%1}) collide with Jinja's default block syntax.
    block_start_string="/*%",
    block_end_string="%*/",
    comment_start_string="/*#",
    comment_end_string="#*/",
).get_template("kernel.cu.j2")


def source(params: Params, problem: Problem) -> str:
    """CUDA C++ for ``params`` (already checked to be in the space)."""
    head_dim = problem.shape[3]
    tiles = _space.m_tiles(params)
    if tiles != int(tiles):
        raise TemplateError(f"attention: cannot render {dict(params)}: BLOCK_M not divisible")
    comment = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
    # What the source depends on, and no more: B, H and S are arguments, so problems that share
    # D, dtype and causal share each config's source, and so its compiled cubin (cache key).
    for_problems = f"D={head_dim} {problem.dtype}{' causal' if problem.causal else ''}, any B, H, S"
    return _TEMPLATE.render(
        **params,
        config_comment=f"{for_problems}; {comment}",
        kernel_name=KERNEL_NAME,
        head_dim=head_dim,
        causal=problem.causal,
        m_tiles=int(tiles),
        row_stride=_space.row_stride(params, head_dim),
        swizzle=params["SMEM_LAYOUT"] == "swizzle",
        threads=_space.threads(params),
        ptx_type="f16" if problem.dtype == "fp16" else "bf16",
        wgmma=params["MMA"] == "wgmma",
        # name, N, A from registers, B N-major (transposed)
        wgmma_ops=(("wgmma_s_ss", params["BLOCK_N"], False, 0), ("wgmma_s_rs", params["BLOCK_N"], True, 0),
                   ("wgmma_pv", head_dim, True, 1)),
        ptx_regs=_ptx_regs,
        acc_operands=_acc_operands,
    )


def launch(params: Params, problem: Problem) -> Launch:
    b, h, s, d = problem.shape
    grid = ((s + params["BLOCK_M"] - 1) // params["BLOCK_M"], h, b)
    args = (
        KernelArg("buffer", "q"),
        KernelArg("buffer", "k"),
        KernelArg("buffer", "v"),
        KernelArg("buffer", "o"),
        KernelArg("i32", s),
        KernelArg("f32", _space.scale_log2(d)),
    )
    return Launch(KERNEL_NAME, grid, (_space.threads(params), 1, 1), _space.smem_bytes(params, d), args)


def _ptx_regs(first: int, count: int) -> str:
    """A PTX vector of asm operands: {%first, ..., %last}."""
    return "{" + ", ".join(f"%{i}" for i in range(first, first + count)) + "}"


def _acc_operands(n: int) -> str:
    """The read-write asm operands of an m64nN f32 accumulator held as d[N/8][4]."""
    return ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(n // 2))
