"""An example kernel family kept outside the package: a row softmax (docs/FAMILIES.md).

    tuner tune docs/examples/row_softmax --shape 4096,1000 --dtype fp16 --trials 30

Problem: x of R rows and C columns (fp16 or bf16), y = softmax over each row, fp32 inside.
Space: threads a block, rows a block (the threads of a row: THREADS / ROWS), elements a load.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2
import numpy as np

from templates.family import (
    BufferSpec, DeviceLimits, KernelArg, KernelFamily, Launch, Param, PeerCall, Problem, TemplateError,
    Validation,
)

FOLDER = Path(__file__).resolve().parent
TOLERANCE = {"fp16": 2e-3, "bf16": 1.6e-2}  # relative error of the checked rows: a few output roundings
POISON = {"fp16": 0x7E00, "bf16": 0x7FC0}  # NaN in each type
CHECKED_ROWS = 64

_TEMPLATE = jinja2.Environment(
    loader=jinja2.FileSystemLoader(FOLDER), undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
    block_start_string="/*%", block_end_string="%*/", comment_start_string="/*#", comment_end_string="#*/",
).get_template("softmax.cu.j2")


def to_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float values as the raw 16-bit elements of ``dtype`` (round to nearest even)."""
    if dtype == "fp16":
        return values.astype(np.float16).view(np.uint16)
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "fp16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


class RowSoftmax(KernelFamily):
    name = "row_softmax"
    folder = FOLDER
    dtypes = ("fp16", "bf16")
    params = (
        Param("THREADS", (256, 128, 512, 1024, 64), "threads a block"),
        Param("ROWS", (1, 2, 4, 8), "rows a block: each has THREADS / ROWS threads"),
        Param("VEC", (8, 4, 2, 1), "16-bit elements a load (16, 8, 4 or 2 bytes)"),
    )
    kernel_files = ("softmax.cu.j2", "__init__.py")
    suite = (((4096, 1000), "fp16", {}), ((8192, 4096), "bf16", {}), ((64, 32768), "fp16", {}))

    def parse_problem(self, shape: str | Sequence[int], dtype: str,
                      flags: Mapping[str, Any] | None = None) -> Problem:
        try:
            dims = tuple(int(d) for d in (shape.split(",") if isinstance(shape, str) else shape))
        except ValueError:
            raise TemplateError(f"malformed shape {shape!r}: expected R,C (rows, columns)") from None
        if len(dims) != 2 or min(dims) < 1:
            raise TemplateError(f"malformed shape {shape!r}: expected two positive numbers R,C")
        if dtype not in self.dtypes:
            raise TemplateError(f"unsupported dtype {dtype!r}: row_softmax takes fp16 or bf16")
        return Problem(dims, dtype, self.problem_flags(flags))

    def flops(self, problem: Problem) -> float:
        return 5.0 * math.prod(problem.shape)  # max, subtract, exponential, sum, scale

    def min_bytes(self, problem: Problem) -> int:
        return 2 * 2 * math.prod(problem.shape)  # x read, y written

    def check(self, params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
        self.validate_params(params)
        cols = problem.shape[1]
        if cols % params["VEC"]:
            return f"divisibility: {params['VEC']} elements a load do not divide {cols} columns"
        if params["THREADS"] // params["ROWS"] < 8:
            return "threads: fewer than 8 threads a row"
        if params["THREADS"] > device.max_threads_per_block:
            return f"threads: {params['THREADS']} > {device.max_threads_per_block}"
        return None

    def starting_points(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        points = [dict(THREADS=256, ROWS=1, VEC=8), dict(THREADS=128, ROWS=1, VEC=8), dict(THREADS=1024, ROWS=1, VEC=8),
                  dict(THREADS=256, ROWS=8, VEC=8), dict(THREADS=256, ROWS=1, VEC=1)]
        return [p for p in points if self.check(p, problem, device) is None]

    def render(self, params: Mapping[str, Any], problem: Problem) -> str:
        self.validate_params(params)
        comment = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
        return _TEMPLATE.render(**params, dtype=problem.dtype, config_comment=f"{problem.dtype}, any R, C; {comment}")

    def launch(self, params: Mapping[str, Any], problem: Problem) -> Launch:
        rows, cols = problem.shape
        return Launch("row_softmax", ((rows + params["ROWS"] - 1) // params["ROWS"], 1, 1), (params["THREADS"], 1, 1), 0,
                      (KernelArg("buffer", "y"), KernelArg("buffer", "x"), KernelArg("i32", rows),
                       KernelArg("i32", cols)))

    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {"x": to_bits(rng.normal(0.0, 3.0, problem.shape), problem.dtype)}

    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        return (BufferSpec("y", problem.shape, np.dtype(np.uint16), POISON[problem.dtype], element=problem.dtype),)

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> Any:
        rows = checked_rows(problem.shape[0])
        x = from_bits(np.asarray(inputs["x"])[rows], problem.dtype)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return rows, e / e.sum(axis=1, keepdims=True)

    def validate(self, problem: Problem, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
                 reference: Any = None) -> Validation:
        rows, expected = reference if reference is not None else self.reference(problem, inputs)
        got = from_bits(np.stack([np.asarray(outputs["y"][r]) for r in rows]), problem.dtype)
        diff = got - expected
        error = float(np.linalg.norm(diff) / np.linalg.norm(expected))
        max_abs = float(np.abs(diff).max())
        if not error <= TOLERANCE[problem.dtype]:
            return Validation(False, error, max_abs, f"relative error {error:.2e} > {TOLERANCE[problem.dtype]:.0e}")
        return Validation(True, error, max_abs)

    def peers(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, PeerCall]:
        """torch.softmax on the same input (fp32 inside, as ours)."""
        import torch

        dtype = torch.float16 if problem.dtype == "fp16" else torch.bfloat16
        x = torch.from_numpy(np.asarray(inputs["x"]).view(np.int16)).view(dtype).cuda()
        return {"torch": PeerCall(lambda: torch.softmax(x, dim=-1))}


def checked_rows(count: int) -> np.ndarray:
    """The first and last rows and random ones between (fixed: the same rows every call)."""
    rng = np.random.default_rng(count)
    middle = rng.choice(np.arange(1, max(count - 1, 1)), size=min(CHECKED_ROWS, max(count - 2, 0)), replace=False)
    return np.unique(np.concatenate([[0, count - 1], middle]))


FAMILY = RowSoftmax()
