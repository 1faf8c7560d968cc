"""Matrix multiply C = A B, with an optional bias and activation epilogue, as a tunable family.

    from templates import get_family
    family = get_family("gemm")
    problem = family.parse_problem("4096,4096,4096", "bf16", {"layout": "nt", "epilogue": "bias_gelu"})
    source = family.render(family.default_params(), problem)

fp16 or bf16 in and out, fp32 accumulation, any M, N and K. A is M x K and B is K x N, each
stored row-major or transposed (``layout``: "nn", "nt", "tn", "tt"); C is M x N row-major.

e4m3 (FP8) in, bf16 or fp16 out (``out_dtype``), on the wgmma path, layout "nt" and K a multiple of 16:
C = epilogue((A scale_a) (B scale_b)^T + bias) with fp32 scales per tensor or, ``scale="block"``,
A's per 1 x 128 and B's per 128 x 128 (promoted into a second fp32 accumulator every 128 of K):

    problem = family.parse_problem("4096,4096,4096", "e4m3", {"layout": "nt", "scale": "block"})
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

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
from templates.gemm import candidates as _candidates
from templates.gemm import problem as _problem
from templates.gemm import render as _render
from templates.gemm import space as _space
from templates.gemm import starts as _starts

KERNEL_NAME = _render.KERNEL_NAME
# Square problems; an LLM's projections (M tokens against N, K of 4096-14336); skinny M (decode).
SQUARE = ((1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192))
PROJECTIONS = ((16, 4096, 4096), (128, 4096, 4096), (1024, 14336, 4096), (4096, 4096, 14336),
               (8192, 4096, 4096), (8192, 14336, 4096), (2048, 6144, 4096), (4096, 12288, 4096))
SKINNY = ((1, 4096, 4096), (16, 14336, 4096), (64, 4096, 14336), (32, 8192, 8192))
_FOLDER = Path(__file__).parent
# torch.nn.Linear: x [tokens, in] row-major (A, M x K: "n") times W [out, in] (B stored N x K: "t")
LINEAR_LAYOUT = "nt"


class GemmFamily(KernelFamily):
    name = "gemm"
    folder = _FOLDER
    params = _space.PARAMS
    dtypes = _problem.DTYPES
    flags = (
        Flag("epilogue", _problem.EPILOGUES, "after A B: + bias (a length-N vector of the input type), then "
             "optionally ReLU, GELU (erf) or GELU (tanh approximation)"),
        Flag("layout", _problem.LAYOUTS, "A then B: n row-major (A as M x K, B as K x N), t transposed "
             "(A stored K x M, B stored N x K); e4m3: nt only"),
        Flag("out_dtype", _problem.OUT_TYPES, "e4m3 only: C's (and the bias's) element type"),
        Flag("scale", _problem.SCALES, "e4m3 only: fp32 scales of A and B, one a tensor, or A's per 1 x 128 "
             "and B's per 128 x 128 (block FP8, as DeepSeek-V3's and vLLM's layers)"),
    )
    suite = (tuple((shape, dtype, {"layout": "nn"}) for shape in SQUARE for dtype in _problem.HALF_DTYPES)
             + tuple((shape, "bf16", {"layout": "nt"}) for shape in PROJECTIONS + SKINNY)
             + (((4096, 4096, 4096), "bf16", {"layout": "nt", "epilogue": "bias_gelu"}),
                ((4096, 4096, 4096), "fp16", {"layout": "tn", "epilogue": "bias_relu"})))
    # What renders and launches the kernels; inputs and reference (problem.py), starting points
    # (starts.py), peers and this file may change without a new template version.
    kernel_files = ("kernel.cu.j2", "hopper.cu.j2", "render.py", "space.py")
    # Its C++ for `tuner export-dispatch`; a config's source depends on the alignment of the
    # operands' rows and on N's parity too (dispatch_variant).
    dispatch_file = "dispatch.h.j2"
    # Its torch op for `tuner export-torch`.
    torch_op_file = "torch_op.py.j2"

    def parse_problem(self, shape: str | Sequence[int], dtype: str,
                      flags: Mapping[str, Any] | None = None) -> Problem:
        dims = _problem.parse_shape(shape if isinstance(shape, str) else tuple(shape))
        if dtype not in _problem.DTYPES:
            raise TemplateError(f"unsupported dtype {dtype!r}: gemm supports {list(_problem.DTYPES)}")
        if dtype == "e4m3" and "layout" not in (flags or {}):  # e4m3's one layout, where none is given
            flags = {**(flags or {}), "layout": _problem.FP8_LAYOUT}
        problem = Problem(dims, dtype, self._own_flags(dtype, self.problem_flags(flags)))
        if _problem.is_fp8(problem) and _problem.fp8_refusal(problem):
            raise TemplateError(_problem.fp8_refusal(problem))
        return problem

    def _own_flags(self, dtype: str, flags: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
        """The flags a problem of ``dtype`` carries: e4m3's own (out_dtype, scale) on e4m3 problems only,
        so that 16-bit problems keep their keys; given a value other than its default on a 16-bit
        problem, one of them is refused."""
        if dtype == "e4m3":
            return flags
        defaults = {f.name: f.choices[0] for f in self.flags}
        for name, value in flags:
            if name in _problem.FP8_FLAGS and value != defaults[name]:
                raise TemplateError(f"gemm: flag {name}={value!r} applies to dtype e4m3 only, not {dtype}")
        return tuple((name, value) for name, value in flags if name not in _problem.FP8_FLAGS)

    def distance(self, a: Problem, b: Problem) -> float:
        """The same dtype and flags, then the log2 distances of M, N and K summed."""
        if a.dtype != b.dtype or a.flags != b.flags or len(a.shape) != len(b.shape):
            return math.inf
        return sum(abs(math.log2(x / y)) for x, y in zip(a.shape, b.shape))

    def flops(self, problem: Problem) -> float:
        return _problem.flops(problem)

    def min_bytes(self, problem: Problem) -> int:
        return _problem.min_bytes(problem)

    def check(self, params: Params, problem: Problem, device: DeviceLimits) -> str | None:
        self.validate_params(params)
        return _space.check(params, problem, device)

    def valid_configs(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        """What ``check`` accepts, checked among ``space.candidates`` (those that fit the
        device, listed once: ``candidates.device_candidates``)."""
        return [dict(c) for c in _candidates.device_candidates(device) if _space.check(c, problem, device) is None]

    def render(self, params: Params, problem: Problem) -> str:
        self.validate_params(params)
        return _render.source(params, problem)

    def launch(self, params: Params, problem: Problem) -> Launch:
        return _render.launch(params, problem)

    def starting_points(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        """See ``starts.py`` (not a kernel file: they may change without a new template version)."""
        points = [dict(self.default_params(), **point) for point in _starts.starting_points(problem.dtype)]
        return [p for p in points if self.check(p, problem, device) is None]

    def layer_problems(self, model: ModelShape, tokens: Sequence[int]) -> list[LayerProblem]:
        """A layer's linear projections, as torch's ``Linear`` computes them: activations
        [tokens, in] row-major times the weight [out, in] transposed (layout ``nt``), a problem
        M x N x K = tokens x out x in for each token count; bias epilogues as the config says."""
        return [self._linear(role, m, n, k, model.dtype, bias)
                for role, n, k, bias in _linears(model) for m in tokens]

    def _linear(self, role: str, m: int, n: int, k: int, dtype: str, bias: bool) -> LayerProblem:
        flags = {"layout": LINEAR_LAYOUT, "epilogue": "bias" if bias else "none"}
        try:
            return LayerProblem(role, m, self.parse_problem((m, n, k), dtype, flags))
        except TemplateError as error:
            what = Problem((m, n, k), dtype, tuple(sorted(flags.items()))).key
            return LayerProblem(role, m, what=what, skipped=str(error).splitlines()[0])

    def peers(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, PeerCall]:
        """cuBLAS through torch.matmul and our Triton matmul tuned by Triton's autotuner (e4m3:
        cuBLASLt's torch._scaled_mm and our block-scaled Triton kernel, ``peers.fp8_peer_calls``)."""
        from templates.gemm import peers

        return peers.peer_calls(problem, inputs)

    def prepare_peers(self, problems: Sequence[Problem]) -> None:
        from templates.gemm import peers

        peers.prepare(problems)

    def compile_options(self, params: Params, problem: Problem) -> tuple[str, ...]:
        return _render.COMPILE_OPTIONS

    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        return _problem.inputs(problem, seed)

    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        return _problem.outputs(problem)

    def input_shapes(self, problem: Problem) -> dict[str, tuple[tuple[int, ...], str]]:
        shapes = {"a": _problem.a_shape(problem), "b": _problem.b_shape(problem)}
        kinds = dict.fromkeys(shapes, problem.dtype)
        if _problem.is_fp8(problem):
            shapes.update(_problem.scale_shapes(problem))
            kinds.update(scale_a="fp32", scale_b="fp32")
        if _problem.has_bias(problem):
            shapes["bias"] = (problem.shape[1],)
            kinds["bias"] = _problem.out_dtype(problem)
        return {name: (tuple(shape), kinds[name]) for name, shape in shapes.items()}

    def export_refusal(self, problem: Problem) -> str | None:
        """e4m3: neither the C++ dispatch nor the torch op takes its scales (16-bit only)."""
        if _problem.is_fp8(problem):
            return "gemm: the C++ dispatch and the torch op take fp16 and bf16 problems only, not e4m3"
        return None

    def dispatch_variant(self, problem: Problem) -> int:
        """The source's alignment assumptions (``problem.alignment``) as bits: A's rows 16-byte
        aligned 4, B's 2, N even 1 (dispatch.h.j2's ``variant`` computes the same)."""
        aligned = _problem.alignment(problem)
        return 4 * aligned["a_aligned"] + 2 * aligned["b_aligned"] + aligned["c_even"]

    def dispatch_variants(self, problem: Problem) -> dict[int, Problem]:
        """A problem for each alignment any M, N, K of ``problem``'s flags can have: its own
        shape moved by 0-7 in each dimension covers every residue mod 8."""
        found: dict[int, Problem] = {}
        m, n, k = problem.shape
        for dm, dn, dk in itertools.product(range(8), repeat=3):
            near = Problem((m + dm, n + dn, k + dk), problem.dtype, problem.flags)
            found.setdefault(self.dispatch_variant(near), near)
        return dict(sorted(found.items()))

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> Any:
        return _problem.reference(problem, inputs)

    def validate(
        self, problem: Problem, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
        reference: Any = None,
    ) -> Validation:
        return _problem.validate(problem, inputs, outputs, reference)

    def describe(self, params: Params, problem: Problem) -> dict[str, Any]:
        """Derived numbers shown beside a config: threads, warp tile or consumer warpgroups, shared
        memory, registers."""
        smem = _space.smem_bytes(params, problem.flag("layout"))
        if _space.wgmma(params):
            return {"threads": _space.threads(params), "consumer_warpgroups": _space.consumers(params),
                    "smem_bytes": smem, "accumulator_registers": _space.accumulators(params),
                    "consumer_registers": _space.consumer_registers(params)}
        return {
            "threads": _space.threads(params),
            "warp_tile": "x".join(map(str, _space.warp_tile(params))),
            "smem_bytes": smem,
            "fragment_registers": _space.fragment_registers(params),
        }


def _linears(model: ModelShape) -> list[tuple[str, int, int, bool]]:
    """(role, out, in, bias) of each linear layer of one transformer layer, in its order."""
    q_width = model.heads * model.head_dim
    up = [("gate_up", 2 * model.intermediate, model.hidden, model.mlp_bias)] if model.gate_up == "fused" \
        else [("gate/up", model.intermediate, model.hidden, model.mlp_bias)]  # up: the same shape
    return [("qkv", (model.heads + 2 * model.kv_heads) * model.head_dim, model.hidden, model.attention_bias),
            ("o", model.hidden, q_width, model.attention_bias),
            *up,
            ("down", model.hidden, model.intermediate, model.mlp_bias),
            *([("lm_head", model.vocab, model.hidden, False)] if model.vocab else [])]


FAMILY = GemmFamily()
