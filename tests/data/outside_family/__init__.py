"""A kernel family that is no part of this project: y = a * x over fp32, its CUDA source a Jinja
template beside it and its space a module of its own (a relative import). Tests copy the folder
somewhere off every import path and give it by path (``tuner tune ./outside_family ...``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2
import numpy as np

from templates.family import (
    BufferSpec, DeviceLimits, KernelArg, KernelFamily, Launch, Problem, TemplateError, Validation,
)

from .space import PARAMS, SCALE

_FOLDER = Path(__file__).parent


class OutsideFamily(KernelFamily):
    name = "outside_scale"
    folder = _FOLDER
    params = PARAMS
    dtypes = ("fp32",)

    def parse_problem(self, shape: str | Sequence[int], dtype: str,
                      flags: Mapping[str, Any] | None = None) -> Problem:
        dims = tuple(int(d) for d in (shape.split(",") if isinstance(shape, str) else shape))
        if len(dims) != 1 or dtype != "fp32":
            raise TemplateError("outside_scale takes one dimension and fp32")
        return Problem(dims, dtype, self.problem_flags(flags))

    def flops(self, problem: Problem) -> float:
        return float(problem.shape[0])

    def min_bytes(self, problem: Problem) -> int:
        return 8 * problem.shape[0]

    def check(self, params, problem: Problem, device: DeviceLimits) -> str | None:
        self.validate_params(params)
        return None

    def render(self, params, problem: Problem) -> str:
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(self.folder),
                                 undefined=jinja2.StrictUndefined)
        return env.get_template("kernel.cu.j2").render(block=params["block"])

    def launch(self, params, problem: Problem) -> Launch:
        n, block = problem.shape[0], params["block"]
        return Launch("outside_scale", ((n + block - 1) // block, 1, 1), (block, 1, 1), 0,
                      (KernelArg("buffer", "y"), KernelArg("buffer", "x"), KernelArg("f32", SCALE),
                       KernelArg("i32", n)))

    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        return {"x": np.random.default_rng(seed).uniform(1.0, 2.0, problem.shape).astype(np.float32)}

    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        return (BufferSpec("y", problem.shape, np.dtype(np.float32), 0xFFFF, element="fp32"),)

    def validate(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                 outputs: Mapping[str, np.ndarray], reference=None) -> Validation:
        ref = SCALE * inputs["x"].astype(np.float64)
        out = np.asarray(outputs["y"]).astype(np.float64)
        error = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        return Validation(error < 1e-5, error, float(np.abs(out - ref).max()))


FAMILY = OutsideFamily()
