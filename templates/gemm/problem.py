"""Inputs, reference and tolerances for C = epilogue(A B + bias), fp16 or bf16 in and out, fp32
accumulation. A is M x K and B is K x N; each is stored row-major or transposed (``layout``)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from templates.elements import from_bits, normal_inputs, to_bits
from templates.family import BufferSpec, Problem, TemplateError, Validation, shown

DTYPES = ("fp16", "bf16")
# "nn": A row-major M x K, B row-major K x N; a "t" stores that operand transposed (A as K x M,
# B as N x K), as BLAS's and cuBLAS's op(A), op(B) name them.
LAYOUTS = ("nn", "nt", "tn", "tt")
# "bias_gelu": GELU in its erf form (torch's default); "bias_gelu_tanh": in its tanh approximation
# (cuBLASLt's fused GELU epilogue, F.gelu(approximate="tanh")).
EPILOGUES = ("none", "bias", "bias_relu", "bias_gelu", "bias_gelu_tanh")
# ||out - ref|| / ||ref|| on the checked rows. A kernel that accumulates in fp32 is off by C's
# rounding to the element type (0.3 of an ulp in the norm: 2.8e-4 in fp16, 2.3e-3 in bf16); the
# bound leaves room for a peer that reduces in lower precision, and grows as sqrt(K) past
# K = REFERENCE_DEPTH. A kernel that drops one 32-deep slice of K in 14336 is off by 4.7e-2.
TOLERANCE = {"fp16": 1e-3, "bf16": 8e-3}
REFERENCE_DEPTH = 4096
POISON = {"fp16": 0x7E00, "bf16": 0x7FC0}  # quiet NaN in each type
CHECKED_ROWS = 48  # float64 reference rows of C
EDGE_ROWS = 8  # of which the first and the last
MAX_ELEMENTS = 2**31 - 1  # per operand: the kernel's row offsets are 64-bit, its indices 32-bit


def parse_shape(shape: str | tuple[int, ...] | list[int]) -> tuple[int, int, int]:
    if isinstance(shape, str):
        parts = [p.strip() for p in shape.replace("x", ",").split(",")]
        try:
            dims = tuple(int(p) for p in parts)
        except ValueError:
            raise TemplateError(f"malformed shape {shown(shape)}: expected M,N,K such as 4096,4096,4096") from None
    else:
        dims = tuple(int(d) for d in shape)
    if len(dims) != 3 or min(dims) < 1:
        raise TemplateError(f"malformed shape {shown(shape)}: expected three positive integers M,N,K")
    m, n, k = dims
    if max(m * k, k * n, m * n) > MAX_ELEMENTS:
        raise TemplateError(f"shape {dims} is too large: an operand has more than 2^31 elements")
    return m, n, k


def a_shape(problem: Problem) -> tuple[int, int]:
    m, _, k = problem.shape
    return (k, m) if problem.flag("layout")[0] == "t" else (m, k)


def b_shape(problem: Problem) -> tuple[int, int]:
    _, n, k = problem.shape
    return (n, k) if problem.flag("layout")[1] == "t" else (k, n)


def has_bias(problem: Problem) -> bool:
    return problem.flag("epilogue") != "none"


def alignment(problem: Problem) -> dict[str, bool]:
    """What the source assumes of the problem's sizes: whether A's and B's rows start on 16-byte
    boundaries (their leading dimension a multiple of 8 elements: cp.async) and whether N is even
    (C stored in column pairs). Problems alike in these, dtype and flags share each config's
    source, and so its cubin."""
    m, n, k = problem.shape
    layout = problem.flag("layout")
    return {
        "a_aligned": (m if layout[0] == "t" else k) % 8 == 0,
        "b_aligned": (k if layout[1] == "t" else n) % 8 == 0,
        "c_even": n % 2 == 0,
    }


def flops(problem: Problem) -> float:
    m, n, k = problem.shape
    return 2.0 * m * n * k


def min_bytes(problem: Problem) -> int:
    m, n, k = problem.shape
    return 2 * (m * k + k * n + m * n + (n if has_bias(problem) else 0))


def tolerance(problem: Problem) -> float:
    return TOLERANCE[problem.dtype] * max(1.0, math.sqrt(problem.shape[2] / REFERENCE_DEPTH))


def inputs(problem: Problem, seed: int) -> dict[str, np.ndarray]:
    """Standard normal A and B in their stored layouts and, with a bias epilogue, a bias of
    sqrt(K) times standard normal (the size of C's elements, so that a lost bias shows)
    (``templates.elements.normal_inputs``)."""
    shapes = {"a": a_shape(problem), "b": b_shape(problem)}
    if has_bias(problem):
        shapes["bias"] = (problem.shape[1],)
    return normal_inputs(shapes, problem.dtype, seed, scale={"bias": math.sqrt(problem.shape[2])})


def outputs(problem: Problem) -> tuple[BufferSpec, ...]:
    m, n, _ = problem.shape
    return (BufferSpec("c", (m, n), np.dtype(np.uint16), POISON[problem.dtype], element=problem.dtype),)


def checked_rows(m: int, rng: np.random.Generator) -> np.ndarray:
    """The first and last rows (the tile tails), plus random rows in between."""
    edge = min(m, EDGE_ROWS)
    rows = set(range(edge)) | set(range(m - edge, m))
    rows |= set(rng.integers(0, m, size=min(m, CHECKED_ROWS - 2 * edge)).tolist())
    return np.array(sorted(rows))


def epilogue(values: np.ndarray, bias: np.ndarray | None, kind: str) -> np.ndarray:
    """The epilogue in float64: + bias, then ReLU or GELU (the erf form, torch's default, or the
    tanh form)."""
    if kind == "none":
        return values
    values = values + bias
    if kind == "bias_relu":
        return np.maximum(values, 0.0)
    if kind == "bias_gelu":
        from math import erf

        return 0.5 * values * (1.0 + np.vectorize(erf)(values / math.sqrt(2.0)))
    if kind == "bias_gelu_tanh":
        return gelu_tanh(values)
    return values


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation in float64: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def reference_rows(problem: Problem, ins: Mapping[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """float64 rows of C."""
    a = from_bits(ins["a"], problem.dtype)
    b = from_bits(ins["b"], problem.dtype)
    a_rows = a[:, rows].T if problem.flag("layout")[0] == "t" else a[rows]
    b_full = b.T if problem.flag("layout")[1] == "t" else b
    bias = from_bits(ins["bias"], problem.dtype) if has_bias(problem) else None
    return epilogue(a_rows @ b_full, bias, problem.flag("epilogue"))


def reference(problem: Problem, ins: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(rows, float64 rows of C) of the checked rows: the first, the last and random ones."""
    m, n, k = problem.shape
    rows = checked_rows(m, np.random.default_rng(m * 7919 + n * 31 + k))
    return rows, reference_rows(problem, ins, rows)


def validate(problem: Problem, ins: Mapping[str, np.ndarray], outs: Mapping[str, np.ndarray],
             expected: tuple[np.ndarray, np.ndarray] | None = None) -> Validation:
    """The checked rows against the float64 reference (``expected``, or computed here). NaN, Inf
    and unwritten elements were counted before (``BufferSpec.element``); only those rows are
    read, one at a time (on the GPU each is one copy)."""
    rows, ref = expected if expected is not None else reference(problem, ins)
    got = np.stack([from_bits(np.asarray(outs["c"][int(r)]), problem.dtype) for r in rows])
    diff = got - ref
    ref_norm = math.sqrt(float((ref**2).sum()))
    error = math.sqrt(float((diff**2).sum())) / ref_norm if ref_norm else math.sqrt(float((diff**2).sum()))
    max_abs = float(np.abs(diff).max())
    limit = tolerance(problem)
    if not error <= limit:
        return Validation(False, error, max_abs, f"relative error {error:.2e} > {limit:.1e} ({problem.dtype}, "
                          f"K={problem.shape[2]})")
    return Validation(True, error, max_abs)
