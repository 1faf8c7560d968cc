"""A kernel family whose configs fail on purpose, one way each (FAULT), beside healthy ones.

    tuner tune docs/examples/faults --shape 1048576 --dtype fp32 --trials 17 --measure-timeout 10

The kernel is y = a * x (fp32). FAULT picks what goes wrong, and ``EXPECTED`` the failure kind
the tuner must end that trial in (``workers.results.FAILURE_KINDS``), while the study goes on:

    none            healthy
    compile_error   an #error in the source                        -> compile
    smem_overflow   a launch asking 1 MiB of dynamic shared memory -> screened (before the GPU)
    nan_output      a NaN every 1000 elements                      -> wrong
    writes_inputs   an input written from the third launch on      -> wrong (the inputs' checksum)
    oob_write       a write 4 TiB past the output                  -> crash (the worker is replaced)
    trap            __trap()                                       -> crash (the worker is replaced)
    worker_killed   the worker process gets SIGKILL mid-trial      -> worker (it is replaced)
    infinite_loop   a thread that never ends                       -> timeout (the worker is replaced)

BLOCK and ITEMS are ordinary tunables, so that a study has healthy configs too. The starting
points put each fault between two healthy configs (17 in all): a study of 17 trials measures
every fault once, and healthy configs after each. A study past them samples FAULT like any
parameter (most proposals then fail; an infinite loop costs ``--measure-timeout`` each).

How ``worker_killed`` kills mid-trial: the kernel writes ``KILL_MARKER`` into y[0], and this
family's ``validate`` (which a GPU worker runs in its own process, during the trial's checks)
sends SIGKILL to the process it runs in when it reads it, as the kernel OOM killer would.
Kept outside the package, next to the row softmax example: it is run by path, by the tests
(``tests/gpu/test_faults_gpu.py``) and by ``docs/scripts/fault_table.py``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Mapping, Sequence

import jinja2
import numpy as np

from templates.family import (
    BufferSpec, DeviceLimits, KernelArg, KernelFamily, Launch, Param, Problem, TemplateError, Validation,
)

FOLDER = Path(__file__).resolve().parent
SCALE = 2.5
KILL_MARKER = -4242.0  # a*x is in [2.5, 5): never this
OVERFLOW_SMEM = 1 << 20  # bytes of dynamic shared memory: more than any GPU gives a block
TOLERANCE = 1e-6

# each fault and the failure kind its trial must end in
EXPECTED = {
    "compile_error": "compile",
    "smem_overflow": "screened",
    "nan_output": "wrong",
    "writes_inputs": "wrong",
    "oob_write": "crash",
    "trap": "crash",
    "worker_killed": "worker",
    "infinite_loop": "timeout",
}
FAULTS = ("none", *EXPECTED)

_TEMPLATE = jinja2.Environment(
    loader=jinja2.FileSystemLoader(FOLDER), undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
    block_start_string="/*%", block_end_string="%*/", comment_start_string="/*#", comment_end_string="#*/",
).get_template("faults.cu.j2")

# healthy (BLOCK, ITEMS) around the faults of the starting points
_HEALTHY = ((256, 1), (128, 1), (512, 1), (1024, 1), (256, 2), (128, 2), (512, 2), (1024, 2), (256, 4))


class Faults(KernelFamily):
    name = "faults"
    folder = FOLDER
    dtypes = ("fp32",)
    params = (
        Param("FAULT", FAULTS, "what goes wrong (none: nothing)"),
        Param("BLOCK", (256, 128, 512, 1024), "threads a block"),
        Param("ITEMS", (1, 2, 4), "elements a thread"),
    )
    kernel_files = ("faults.cu.j2", "__init__.py")

    def parse_problem(self, shape: str | Sequence[int], dtype: str,
                      flags: Mapping[str, Any] | None = None) -> Problem:
        try:
            dims = tuple(int(d) for d in (shape.split(",") if isinstance(shape, str) else shape))
        except ValueError:
            raise TemplateError(f"malformed shape {shape!r}: expected N (elements)") from None
        if len(dims) != 1 or dims[0] < 1:
            raise TemplateError(f"malformed shape {shape!r}: expected one positive number N")
        if dtype not in self.dtypes:
            raise TemplateError(f"unsupported dtype {dtype!r}: faults takes fp32")
        return Problem(dims, dtype, self.problem_flags(flags))

    def flops(self, problem: Problem) -> float:
        return float(problem.shape[0])

    def min_bytes(self, problem: Problem) -> int:
        return 8 * problem.shape[0]

    def check(self, params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
        self.validate_params(params)
        if params["BLOCK"] > device.max_threads_per_block:
            return f"threads: {params['BLOCK']} > {device.max_threads_per_block}"
        return None  # every fault is a valid config: it must fail on the way, not here

    def starting_points(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        """Healthy, fault, healthy, fault, ..., healthy: every fault once, a healthy config after each."""
        healthy = [dict(FAULT="none", BLOCK=b, ITEMS=i) for b, i in _HEALTHY]
        points = [healthy[0]]
        for fault, after in zip(EXPECTED, healthy[1:]):
            points += [dict(FAULT=fault, BLOCK=256, ITEMS=1), after]
        return [p for p in points if self.check(p, problem, device) is None]

    def render(self, params: Mapping[str, Any], problem: Problem) -> str:
        self.validate_params(params)
        comment = ", ".join(f"{k}={v}" for k, v in sorted(params.items()))
        return _TEMPLATE.render(**params, KILL_MARKER=f"{KILL_MARKER!r}f", config_comment=comment)

    def launch(self, params: Mapping[str, Any], problem: Problem) -> Launch:
        n = problem.shape[0]
        per_block = params["BLOCK"] * params["ITEMS"]
        smem = OVERFLOW_SMEM if params["FAULT"] == "smem_overflow" else 0
        return Launch("faults", ((n + per_block - 1) // per_block, 1, 1), (params["BLOCK"], 1, 1), smem,
                      (KernelArg("buffer", "y"), KernelArg("buffer", "x"), KernelArg("f32", SCALE),
                       KernelArg("i32", n)))

    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {"x": rng.uniform(1.0, 2.0, problem.shape).astype(np.float32)}

    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        return (BufferSpec("y", problem.shape, np.dtype(np.float32), 0xFFFF, element="fp32"),)

    def validate(self, problem: Problem, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
                 reference: Any = None) -> Validation:
        if float(np.asarray(outputs["y"][0])) == KILL_MARKER:  # FAULT=worker_killed
            os.kill(os.getpid(), signal.SIGKILL)
        expected = SCALE * np.asarray(inputs["x"], dtype=np.float64)
        got = np.asarray(outputs["y"], dtype=np.float64)
        if not np.isfinite(got).all():
            return Validation(False, float("nan"), float("nan"),
                              f"{int((~np.isfinite(got)).sum())} elements NaN/Inf or unwritten")
        diff = got - expected
        error = float(np.linalg.norm(diff) / np.linalg.norm(expected))
        max_abs = float(np.abs(diff).max())
        if not error <= TOLERANCE:
            return Validation(False, error, max_abs, f"relative error {error:.2e} > {TOLERANCE:.0e}")
        return Validation(True, error, max_abs)


FAMILY = Faults()
