"""Flash-attention forward (online softmax, one pass over K/V) as a tunable family.

    from templates import get_family
    family = get_family("attention")
    problem = family.parse_problem("4,16,4096,128", "fp16", {"causal": True})
    source = family.render(family.default_params(), problem)

Layout (B, H, S, D) contiguous, fp16 or bf16, D in {64, 96, 128, 256}, any S, B and H; grouped-query
attention as the shape B,H,S,D,HKV (K and V of (B, HKV, S, D), HKV dividing H).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import math

import numpy as np

from templates.attention import problem as _problem
from templates.attention import render as _render
from templates.attention import space as _space
from templates.attention import starts as _starts
from templates.family import (
    BufferSpec,
    DeviceLimits,
    Flag,
    KernelFamily,
    LayerProblem,
    Launch,
    ModelShape,
    Params,
    PeerCall,
    Problem,
    TemplateError,
    Validation,
)

KERNEL_NAME = _render.KERNEL_NAME
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
    flags = (Flag("causal", (False, True), "causal masking: query i sees keys j <= i (top-left aligned)"),)
    suite = tuple((shape, dtype, {"causal": causal}) for shape in SUITE_SHAPES for dtype in _problem.DTYPES
                  for causal in (False, True))
    # What renders and launches the kernels (hopper.cu.j2: the TMA path); inputs and reference
    # (problem.py), starting points (starts.py) and this file may change without a new template
    # version.
    kernel_files = ("kernel.cu.j2", "hopper.cu.j2", "render.py", "space.py")
    # Its C++ for `tuner export-dispatch`: the source depends on D, dtype and causal only, which a
    # winner shares with the problems it serves (those at a finite distance).
    dispatch_file = "dispatch.h.j2"
    # Its torch op for `tuner export-torch`.
    torch_op_file = "torch_op.py.j2"

    def parse_problem(self, shape: str | Sequence[int], dtype: str,
                      flags: Mapping[str, Any] | None = None) -> Problem:
        dims = _problem.parse_shape(shape if isinstance(shape, str) else tuple(shape))
        if dtype not in _problem.DTYPES:
            raise TemplateError(f"unsupported dtype {dtype!r}: attention supports {list(_problem.DTYPES)}")
        return Problem(dims, dtype, self.problem_flags(flags))

    def flops(self, problem: Problem) -> float:
        return _problem.flops(problem)

    def min_bytes(self, problem: Problem) -> int:
        return _problem.min_bytes(problem)

    def check(self, params: Params, problem: Problem, device: DeviceLimits) -> str | None:
        self.validate_params(params)
        return _space.check(params, problem, device)

    def valid_configs(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        """What ``check`` accepts, checked among ``space.candidates`` rather than the whole product."""
        return [c for c in _space.candidates() if _space.check(c, problem, device) is None]

    def render(self, params: Params, problem: Problem) -> str:
        self.validate_params(params)
        return _render.source(params, problem)

    def launch(self, params: Params, problem: Problem) -> Launch:
        return _render.launch(params, problem)

    def starting_points(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        """See ``starts.py`` (not a kernel file: they may change without a new template version)."""
        b, h, s, d = problem.shape[:4]
        few_tiles = b * h * -(-s // 128) < device.sm_count
        points = [dict(self.default_params(), **point) for point in _starts.starting_points(d, few_tiles)]
        return [p for p in points if self.check(p, problem, device) is None]

    def layer_problems(self, model: ModelShape, tokens: Sequence[int]) -> list[LayerProblem]:
        """Causal prefill of one sequence of each token count: B=1, H query heads, S tokens, D,
        and the model's KV heads (grouped-query attention where fewer)."""
        found = []
        for s in tokens:
            shape = (1, model.heads, s, model.head_dim) + ((model.kv_heads,) if model.kv_heads != model.heads else ())
            what = f"{'x'.join(map(str, shape))}-{model.dtype}-causal"
            try:
                found.append(LayerProblem("attention", s, self.parse_problem(shape, model.dtype, {"causal": True})))
            except TemplateError as error:
                found.append(LayerProblem("attention", s, what=what, skipped=str(error).splitlines()[0]))
        return found

    def peers(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, PeerCall]:
        """torch SDPA's flash, cuDNN and efficient backends and the autotuned Triton kernel."""
        from templates.attention import peers

        return peers.peer_calls(problem, inputs)

    def prepare_peers(self, problems: Sequence[Problem]) -> None:
        from templates.attention import peers

        peers.prepare(problems)

    def compile_options(self, params: Params, problem: Problem) -> tuple[str, ...]:
        return _render.COMPILE_OPTIONS

    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        return _problem.inputs(problem, seed)

    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        return _problem.outputs(problem)

    def input_shapes(self, problem: Problem) -> dict[str, tuple[tuple[int, ...], str]]:
        q, kv = _problem.q_shape(problem.shape), _problem.kv_shape(problem.shape)
        return {"q": (q, problem.dtype), "k": (kv, problem.dtype), "v": (kv, problem.dtype)}

    def distance(self, a: Problem, b: Problem) -> float:
        """The same dtype, flags and D; then |log2| of the ratios of S, of B*H and of the query
        heads a KV head serves (the source is the same for every group: it is a kernel argument)."""
        if a.dtype != b.dtype or a.flags != b.flags or a.shape[3] != b.shape[3]:
            return math.inf
        lead_a, lead_b = a.shape[0] * a.shape[1], b.shape[0] * b.shape[1]
        return (abs(math.log2(a.shape[2] / b.shape[2])) + abs(math.log2(lead_a / lead_b))
                + abs(math.log2(_problem.group(a.shape) / _problem.group(b.shape))))

    def dispatch_variant(self, problem: Problem) -> int:
        """D: the source's one dependence on the shape (dispatch.h.j2's ``variant`` says the same)."""
        return problem.shape[3]

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> Any:
        return _problem.reference(problem, inputs)

    def validate(
        self, problem: Problem, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
        reference: Any = None,
    ) -> Validation:
        return _problem.validate(problem, inputs, outputs, reference)

    def describe(self, params: Params, problem: Problem) -> dict[str, Any]:
        """Derived numbers shown beside a config: threads, shared memory, fragment registers."""
        d = problem.shape[3]
        return {
            "threads": _space.threads(params),
            "smem_bytes": _space.smem_bytes(params, d),
            "fragment_registers": _space.fragment_registers(params, d),
        }


FAMILY = AttentionFamily()
