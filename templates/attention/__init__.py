"""Flash-attention forward (online softmax, one pass over K/V) as a tunable family.

    from templates import get_family
    family = get_family("attention")
    problem = family.parse_problem("4,16,4096,128", "fp16", causal=True)
    source = family.render(family.default_params(), problem)

Layout (B, H, S, D) contiguous, fp16 or bf16, D in {64, 128}, any S, B and H.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2
import numpy as np

from templates.attention import problem as _problem
from templates.attention import space as _space
from templates.attention import starts as _starts
from templates.family import (
    BufferSpec,
    DeviceLimits,
    KernelArg,
    KernelFamily,
    Launch,
    Params,
    Problem,
    TemplateError,
    Validation,
)

KERNEL_NAME = "attention_fwd"
SUITE_SHAPES = (
    (1, 8, 512, 64), (2, 8, 512, 64), (16, 16, 2048, 64), (8, 16, 2048, 128),
    (4, 16, 4096, 128), (1, 32, 8192, 128), (2, 16, 1000, 64), (1, 16, 4097, 128),
)
_FOLDER = Path(__file__).parent


class AttentionFamily(KernelFamily):
    name = "attention"
    folder = _FOLDER
    params = _space.PARAMS
    dtypes = _problem.DTYPES
    suite = tuple((shape, dtype, causal) for shape in SUITE_SHAPES for dtype in _problem.DTYPES
                  for causal in (False, True))
    # Inputs, reference (problem.py) and starting points (starts.py) are not kernel files.
    kernel_files = ("kernel.cu.j2", "__init__.py", "space.py")

    def __init__(self) -> None:
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_FOLDER),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            # PTX operands ({%0,%1}) collide with Jinja's default block syntax.
            block_start_string="/*%",
            block_end_string="%*/",
            comment_start_string="/*#",
            comment_end_string="#*/",
        )
        self._template = env.get_template("kernel.cu.j2")

    def parse_problem(self, shape: str | Sequence[int], dtype: str, causal: bool = False) -> Problem:
        dims = _problem.parse_shape(shape if isinstance(shape, str) else tuple(shape))
        if dtype not in _problem.DTYPES:
            raise TemplateError(f"unsupported dtype {dtype!r}: attention supports {list(_problem.DTYPES)}")
        return Problem(dims, dtype, bool(causal))

    def flops(self, problem: Problem) -> float:
        return _problem.flops(problem)

    def min_bytes(self, problem: Problem) -> int:
        return _problem.min_bytes(problem)

    def check(self, params: Params, problem: Problem, device: DeviceLimits) -> str | None:
        self.validate_params(params)
        return _space.check(params, problem, device)

    def render(self, params: Params, problem: Problem) -> str:
        self.validate_params(params)
        head_dim = problem.shape[3]
        tiles = _space.m_tiles(params)
        if tiles != int(tiles):
            raise TemplateError(f"attention: cannot render {dict(params)}: BLOCK_M not divisible")
        comment = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
        return self._template.render(
            **params,
            config_comment=f"{problem.key} {comment}",
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

    def launch(self, params: Params, problem: Problem) -> Launch:
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

    def starting_points(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        """See ``starts.py`` (not a kernel file: they may change without a new template version)."""
        points = [dict(self.default_params(), **point) for point in _starts.starting_points(problem.shape[3])]
        return [p for p in points if self.check(p, problem, device) is None]

    def compile_options(self, params: Params, problem: Problem) -> tuple[str, ...]:
        return ("-O3", "-std=c++17")

    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        return _problem.inputs(problem, seed)

    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        return _problem.outputs(problem)

    def validate(
        self, problem: Problem, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
    ) -> Validation:
        return _problem.validate(problem, inputs, outputs)

    def describe(self, params: Params, problem: Problem) -> dict[str, Any]:
        """Derived numbers shown beside a config: threads, shared memory, fragment registers."""
        d = problem.shape[3]
        return {
            "threads": _space.threads(params),
            "smem_bytes": _space.smem_bytes(params, d),
            "fragment_registers": _space.fragment_registers(params, d),
        }


def _ptx_regs(first: int, count: int) -> str:
    """A PTX vector of asm operands: {%first, ..., %last}."""
    return "{" + ", ".join(f"%{i}" for i in range(first, first + count)) + "}"


def _acc_operands(n: int) -> str:
    """The read-write asm operands of an m64nN f32 accumulator held as d[N/8][4]."""
    return ", ".join(f'"+f"(d[{i // 4}][{i % 4}])' for i in range(n // 2))


FAMILY = AttentionFamily()
