"""The CUDA source and the launch of one GEMM config (``kernel.cu.j2``). With that and
``space.py`` this is what the template hash covers (``GemmFamily.kernel_files``)."""

from __future__ import annotations

from pathlib import Path

import jinja2

from templates.family import KernelArg, Launch, Params, Problem, TemplateError, TensorMap
from templates.gemm import problem as _problem
from templates.gemm import space as _space

KERNEL_NAME = "gemm"
COMPILE_OPTIONS = ("-O3", "-std=c++17")
ACTIVATIONS = {"none": 0, "bias": 0, "bias_relu": 1, "bias_gelu": 2, "bias_gelu_tanh": 3}
SCALES = {"tensor": 1, "block": 2}  # hopper.cu.j2's SCALE (0: 16-bit inputs, no scales)

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
_TEMPLATES = {"sync": _ENVIRONMENT.get_template("kernel.cu.j2"), "wgmma": _ENVIRONMENT.get_template("hopper.cu.j2")}


def source(params: Params, problem: Problem) -> str:
    """CUDA C++ for ``params`` (already checked to be in the space)."""
    layout, epilogue = problem.flag("layout"), problem.flag("epilogue")
    warp_m, warp_n = _space.warp_tile(params)
    if not _space.wgmma(params) and (warp_m % 16 or warp_n % 16):
        raise TemplateError(f"gemm: cannot render {dict(params)}: the warp tile is not whole 16x16 tiles")
    (_, a_cols), (_, b_cols) = _space.operand_tiles(params, layout)
    aligned = _problem.alignment(problem)
    comment = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
    # What the source depends on, and no more: M, N and K are arguments.
    fp8 = _problem.is_fp8(problem)
    types = f"e4m3 out_dtype={_problem.out_dtype(problem)} scale={problem.flag('scale')}" if fp8 else problem.dtype
    for_problems = (f"{types} layout={layout} epilogue={epilogue}, "
                    + ", ".join(f"{name}={int(value)}" for name, value in aligned.items()))
    return _TEMPLATES[params["MMA"]].render(
        **params,
        config_comment=f"{for_problems}; {comment}",
        kernel_name=KERNEL_NAME,
        warps_m=_space.warps_m(params),
        warps_n=_space.warps_n(params),
        warp_m=warp_m,
        warp_n=warp_n,
        threads=_space.threads(params),
        swizzle=params["SMEM_LAYOUT"] == "swizzle",
        a_trans=layout[0] == "t",
        b_trans=layout[1] == "t",
        a_stride=_space.row_stride(params, a_cols),
        b_stride=_space.row_stride(params, b_cols),
        bias=_problem.has_bias(problem),
        bias_ahead=(_problem.has_bias(problem) and _space.wgmma(params)
                    and _space.bias_ahead(params, _space.fp8_part_sets(params) if fp8 else 1)),
        activation=ACTIVATIONS[epilogue],
        ptx_type="f16" if _problem.out_dtype(problem) == "fp16" else "bf16",
        mma_type="e4m3" if fp8 else ("f16" if problem.dtype == "fp16" else "bf16"),
        elem_bytes=_space.operand_bytes(params),
        scale=SCALES[problem.flag("scale")] if fp8 else 0,
        part_sets=_space.fp8_part_sets(params) if fp8 else 1,
        consumers=_space.consumers(params),
        blocks_per_sm=_blocks_per_sm(params, problem),
        consumer_regs=_space.consumer_registers(params) if _space.wgmma(params) else 0,
        ptx_regs=_ptx_regs,
        acc_operands=_acc_operands,
        **aligned,
    )


def grid(params: Params, problem: Problem) -> tuple[int, int, int]:
    """A block a work unit (a persistent launch caps it at one a multiprocessor)."""
    return (_space.units(params, problem), 1, 1)


def launch(params: Params, problem: Problem) -> Launch:
    m, n, k = problem.shape
    buffers = ("a", "b") + (("scale_a", "scale_b") if _problem.is_fp8(problem) else ()) \
        + (("bias", "c") if _problem.has_bias(problem) else ("c",))
    if _space.wgmma(params):  # A and B (and C, where stored by TMA) by TMA: tensor maps in their place
        operands = tuple(KernelArg("tensormap", m_) for m_ in tensor_maps(params, problem))
        buffers = tuple(b for b in buffers[2:] if not (b == "c" and params["C_STORE"] == "tma"))
    else:
        operands = ()
    workspace = _space.workspace(params)
    args = (operands + tuple(KernelArg("buffer", name) for name in buffers + tuple(w for w, _ in workspace))
            + tuple(KernelArg("i32", d) for d in (m, n, k)))
    return Launch(KERNEL_NAME, grid(params, problem), (_space.threads(params), 1, 1),
                  _space.smem_bytes(params, problem.flag("layout")), args, workspace=workspace,
                  blocks_per_sm_cap=_blocks_per_sm(params, problem) if params["PERSISTENT"] else 0)


def tensor_maps(params: Params, problem: Problem) -> tuple[TensorMap, ...]:
    """A's and B's maps as stored (innermost dimension first), 128-byte swizzled: a K-major
    operand moves in boxes of BLOCK_K deep (128 bytes: 64 16-bit or 128 e4m3 elements) x its
    tile's rows (B's in a cluster: half of them), an M- or N-major one in 64 x 64 boxes (the kernel
    issues BLOCK / 64 of them a stage). Past M, N or K the TMA reads zeros. With C_STORE=tma also
    C's, in the 64 x 64 boxes of the epilogue (clipped at M and N)."""
    m, n, k = problem.shape
    layout = problem.flag("layout")
    a_rows, a_cols = _problem.a_shape(problem)
    b_rows, b_cols = _problem.b_shape(problem)
    size, deep = _space.operand_bytes(params), params["BLOCK_K"]
    a_box = (64, 64) if layout[0] == "t" else (deep, params["BLOCK_M"])
    b_box = (deep, params["BLOCK_N"] // params["CLUSTER_M"]) if layout[1] == "t" else (64, 64)  # a block's half
    maps = (TensorMap("a", size, (a_cols, a_rows), (size * a_cols,), a_box, swizzle=128),
            TensorMap("b", size, (b_cols, b_rows), (size * b_cols,), b_box, swizzle=128))
    if params["C_STORE"] == "tma":
        maps += (TensorMap("c", 2, (n, m), (2 * n,), (64, 64), swizzle=128),)
    return maps


def _blocks_per_sm(params: Params, problem: Problem) -> int:
    return _space.blocks_per_sm(params, problem.flag("layout")) if _space.wgmma(params) else 1


def _ptx_regs(first: int, count: int) -> str:
    """A PTX vector of asm operands: {%first, ..., %last}."""
    return "{" + ", ".join(f"%{i}" for i in range(first, first + count)) + "}"


def _acc_operands(n: int) -> str:
    """The read-write asm operands of an m64nN f32 accumulator held as d[N/8][4]."""
    return ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(n // 2))
