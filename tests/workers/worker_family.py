"""A tiny kernel family for the workers' tests: y = a * x, with misbehaving variants.

``variant`` picks the kernel: ok, hole (one element unwritten), oob (illegal address),
loop (never ends), smem_ok (100 KiB dynamic shared memory), smem_big (more than any GPU has),
scribble (writes into its input once the checks are over), clobber (a wrong output, and
its input overwritten).
Resolved in Ray workers as ``"worker_family:FAMILY"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from templates.family import (
    BufferSpec, DeviceLimits, KernelArg, KernelFamily, Launch, Param, Problem, TemplateError,
    Validation,
)

NAME = "worker_family:FAMILY"

_BODY = {
    "ok": "y[i] = a * x[i];",
    "hole": "if (i != n / 2) y[i] = a * x[i];",
    "oob": "y[i + (1ull << 40)] = a * x[i];",
    "loop": "while (((volatile const float*)x)[0] > 0.f) { __nanosleep(1000); }\n    y[i] = a * x[i];",
    "smem_ok": "s[threadIdx.x] = a * x[i]; __syncthreads(); y[i] = s[threadIdx.x];",
    "smem_big": "s[threadIdx.x] = a * x[i]; __syncthreads(); y[i] = s[threadIdx.x];",
    # right output, but its 6th launch (in the timing, after the checks) changes an input
    "scribble": "y[i] = a * x[i];\n    if (i == 0 && atomicAdd(&launches, 1u) == 5) ((float*)x)[n - 1] = 7.f;",
    # wrong output, and its input overwritten on the first run
    "clobber": "y[i] = 2.f * a;\n    ((float*)x)[i] = -1.f;",
}
_SMEM = {"smem_ok": 100 * 1024, "smem_big": 400 * 1024}
SCALE = 2.5


class ScaleFamily(KernelFamily):
    name = "worker_scale"
    folder = Path(__file__).parent
    params = (Param("variant", tuple(_BODY)), Param("tag", (0, 1, 2, 3, 4, 5, 6, 7)))
    dtypes = ("fp32",)

    def parse_problem(self, shape: str | Sequence[int], dtype: str,
                      flags: Mapping[str, Any] | None = None) -> Problem:
        dims = tuple(int(d) for d in (shape.split(",") if isinstance(shape, str) else shape))
        if len(dims) != 1 or dtype != "fp32":
            raise TemplateError("worker_scale takes one dimension and fp32")
        return Problem(dims, dtype, self.problem_flags(flags))

    def flops(self, problem: Problem) -> float:
        return float(problem.shape[0])

    def min_bytes(self, problem: Problem) -> int:
        return 8 * problem.shape[0]

    def check(self, params, problem: Problem, device: DeviceLimits) -> str | None:
        return None

    def render(self, params, problem: Problem) -> str:
        body = _BODY[params["variant"]]
        return (
            f"#define TAG {int(params.get('tag', 0))}\n"
            "__device__ unsigned launches;\n"
            'extern "C" __global__ void scale(float* y, const float* x, float a, int n) {\n'
            "  extern __shared__ float s[];\n"
            "  int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
            f"  if (n == -1 - TAG) return;  // never true: a tag changes the cubin, not the result\n"
            f"  if (i < n) {{\n    {body}\n  }}\n}}\n"
        )

    def launch(self, params, problem: Problem) -> Launch:
        n = problem.shape[0]
        return Launch(
            kernel="scale",
            grid=((n + 255) // 256, 1, 1),
            block=(256, 1, 1),
            smem_bytes=_SMEM.get(params["variant"], 0),
            args=(KernelArg("buffer", "y"), KernelArg("buffer", "x"), KernelArg("f32", SCALE),
                  KernelArg("i32", n)),
        )

    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {"x": rng.uniform(1.0, 2.0, problem.shape).astype(np.float32)}

    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        return (BufferSpec("y", problem.shape, np.dtype(np.float32), 0xFFFF, element="fp32"),)

    def validate(self, problem: Problem, inputs: Mapping[str, np.ndarray],
                 outputs: Mapping[str, np.ndarray], reference=None) -> Validation:
        ref = SCALE * inputs["x"].astype(np.float64)
        out = outputs["y"].astype(np.float64)
        bad = ~np.isfinite(out)
        if bad.any():
            return Validation(False, float("nan"), float("nan"),
                              f"{int(bad.sum())} elements unwritten or not finite")
        diff = np.abs(out - ref)
        error = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        ok = error < 1e-5
        return Validation(ok, error, float(diff.max()), None if ok else f"relative error {error:.3g}")


FAMILY = ScaleFamily()
