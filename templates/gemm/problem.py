"""Inputs, reference and tolerances for C = epilogue(A B + bias), fp32 accumulation: fp16 or bf16
in and out, or e4m3 in (with fp32 scales, per tensor or per block) and bf16 or fp16 out
(``out_dtype``). A is M x K and B is K x N; each is stored row-major or transposed (``layout``); e4m3's only as
"nt" (A M x K, B N x K, both K-major, as wgmma reads FP8 operands)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from templates.elements import from_bits, normal_inputs, to_bits
from templates.family import BufferSpec, Problem, TemplateError, Validation, shown
from templates.gemm import fp8

HALF_DTYPES = ("fp16", "bf16")
DTYPES = HALF_DTYPES + ("e4m3",)
# e4m3's own flags (absent from 16-bit problems, whose keys they would change): out_dtype, C's
# element type, and scale: one fp32 a tensor, or A's per 1 x 128 and B's per 128 x 128 blocks
# (DeepSeek-V3's and vLLM's block FP8: A's M x ceil(K/128), B's ceil(N/128) x ceil(K/128)).
OUT_TYPES = ("bf16", "fp16")
SCALES = ("tensor", "block")
FP8_FLAGS = ("out_dtype", "scale")
FP8_LAYOUT = "nt"
SCALE_BLOCK = 128
A_SCALE_BLOCK = (1, SCALE_BLOCK)
B_SCALE_BLOCK = (SCALE_BLOCK, SCALE_BLOCK)
FP8_K_MULTIPLE = 16  # 1-byte elements: TMA's rows of A and B start on 16-byte boundaries
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
# e4m3 (by C's type): the products of e4m3 values are exact in fp32, but wgmma's FP8 accumulation
# keeps fewer bits than fp32 (DeepSeek-V3's report: about 14), so the kernels add each 128-deep K
# block's products into fp32 accumulators (as cuBLASLt and CUTLASS do by default); the bound
# leaves room for that block's own sum beside C's rounding. A 32-deep slice of K lost in 4096 is
# off by 8.8e-2.
FP8_TOLERANCE = {"bf16": 8e-3, "fp16": 2e-3}
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


def is_fp8(problem: Problem) -> bool:
    return problem.dtype == "e4m3"


def out_dtype(problem: Problem) -> str:
    """C's (and the bias's) element type: the input type, or e4m3's ``out_dtype`` flag."""
    return problem.flag("out_dtype") if is_fp8(problem) else problem.dtype


def block_scaled(problem: Problem) -> bool:
    return is_fp8(problem) and problem.flag("scale") == "block"


def fp8_refusal(problem: Problem) -> str | None:
    """Why an e4m3 problem cannot be computed (None where it can): layout "nt" only, K a multiple
    of 16."""
    if problem.flag("layout") != FP8_LAYOUT:
        return (f"e4m3: layout {FP8_LAYOUT} only (wgmma reads FP8 operands K-major: A M x K and B N x K "
                f"row-major), not {problem.flag('layout')}")
    if problem.shape[2] % FP8_K_MULTIPLE:
        return (f"e4m3: K={problem.shape[2]} is not a multiple of {FP8_K_MULTIPLE} (TMA needs A's and B's "
                f"rows of 1-byte elements on 16-byte boundaries)")
    return None


def scale_shapes(problem: Problem) -> dict[str, tuple[int, int]]:
    """e4m3: the shapes of scale_a and scale_b (one element each per tensor)."""
    m, n, k = problem.shape
    if not block_scaled(problem):
        return {"scale_a": (1,), "scale_b": (1,)}
    kb = -(-k // SCALE_BLOCK)
    return {"scale_a": (m, kb), "scale_b": (-(-n // SCALE_BLOCK), kb)}


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
    if is_fp8(problem):  # rows of K 1-byte elements, K a multiple of 16 (fp8_refusal)
        return {"a_aligned": k % FP8_K_MULTIPLE == 0, "b_aligned": k % FP8_K_MULTIPLE == 0, "c_even": n % 2 == 0}
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
    if is_fp8(problem):
        scales = sum(math.prod(s) for s in scale_shapes(problem).values())
        return m * k + k * n + 2 * (m * n + (n if has_bias(problem) else 0)) + 4 * scales
    return 2 * (m * k + k * n + m * n + (n if has_bias(problem) else 0))


def tolerance(problem: Problem) -> float:
    base = FP8_TOLERANCE[out_dtype(problem)] if is_fp8(problem) else TOLERANCE[problem.dtype]
    return base * max(1.0, math.sqrt(problem.shape[2] / REFERENCE_DEPTH))


def inputs(problem: Problem, seed: int) -> dict[str, np.ndarray]:
    """Standard normal A and B in their stored layouts and, with a bias epilogue, a bias of
    sqrt(K) times standard normal (the size of C's elements, so that a lost bias shows)
    (``templates.elements.normal_inputs``). e4m3: ``fp8_inputs``."""
    if is_fp8(problem):
        return fp8_inputs(problem, seed)
    shapes = {"a": a_shape(problem), "b": b_shape(problem)}
    if has_bias(problem):
        shapes["bias"] = (problem.shape[1],)
    return normal_inputs(shapes, problem.dtype, seed, scale={"bias": math.sqrt(problem.shape[2])})


def fp8_inputs(problem: Problem, seed: int) -> dict[str, np.ndarray]:
    """e4m3: A and B quantized as FP8 layers quantize them (``fp8.quantize``: each scale's block
    brought to a largest magnitude of 448, so that the bytes cover E4M3's range) from standard
    normal values times a factor of 2^-2 to 2^2 drawn per block of A's and of B's scales (a scale
    read from the wrong block shows), with their fp32 scales; a bias (C's type) as for 16-bit."""
    m, n, k = problem.shape
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape, block in (("a", (m, k), A_SCALE_BLOCK), ("b", (n, k), B_SCALE_BLOCK)):
        values = rng.standard_normal(shape, dtype=np.float32)
        if block_scaled(problem):
            factors = np.exp2(rng.uniform(-2.0, 2.0, size=(-(-shape[0] // block[0]), -(-k // block[1]))))
            values *= fp8.expand(factors, block, shape).astype(np.float32)
        out[name], out[f"scale_{name}"] = fp8.quantize(values, block if block_scaled(problem) else None)
    if has_bias(problem):
        out.update(normal_inputs({"bias": (n,)}, out_dtype(problem), seed + 1, scale={"bias": math.sqrt(k)}))
    return out


def dequantized(problem: Problem, ins: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """e4m3: A (M x K) or B (N x K) in float64, each element times its scale."""
    values = fp8.from_e4m3(ins[name])
    scales = ins[f"scale_{name}"]
    if not block_scaled(problem):
        return values * float(scales[0])
    return values * fp8.expand(scales, A_SCALE_BLOCK if name == "a" else B_SCALE_BLOCK, values.shape)


def outputs(problem: Problem) -> tuple[BufferSpec, ...]:
    m, n, _ = problem.shape
    out = out_dtype(problem)
    return (BufferSpec("c", (m, n), np.dtype(np.uint16), POISON[out], element=out),)


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
    """float64 rows of C (e4m3: from the dequantized inputs)."""
    if is_fp8(problem):
        a_rows = dequantized(problem, {"a": ins["a"][rows], "scale_a": _rows_of_scale(problem, ins, rows)}, "a")
        bias = from_bits(ins["bias"], out_dtype(problem)) if has_bias(problem) else None
        return epilogue(a_rows @ dequantized(problem, ins, "b").T, bias, problem.flag("epilogue"))
    a = from_bits(ins["a"], problem.dtype)
    b = from_bits(ins["b"], problem.dtype)
    a_rows = a[:, rows].T if problem.flag("layout")[0] == "t" else a[rows]
    b_full = b.T if problem.flag("layout")[1] == "t" else b
    bias = from_bits(ins["bias"], problem.dtype) if has_bias(problem) else None
    return epilogue(a_rows @ b_full, bias, problem.flag("epilogue"))


def _rows_of_scale(problem: Problem, ins: Mapping[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    return ins["scale_a"][rows] if block_scaled(problem) else ins["scale_a"]


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
    got = np.stack([from_bits(np.asarray(outs["c"][int(r)]), out_dtype(problem)) for r in rows])
    diff = got - ref
    ref_norm = math.sqrt(float((ref**2).sum()))
    error = math.sqrt(float((diff**2).sum())) / ref_norm if ref_norm else math.sqrt(float((diff**2).sum()))
    max_abs = float(np.abs(diff).max())
    limit = tolerance(problem)
    if not error <= limit:
        return Validation(False, error, max_abs, f"relative error {error:.2e} > {limit:.1e} ({_types(problem)}, "
                          f"K={problem.shape[2]})")
    return Validation(True, error, max_abs)


def _types(problem: Problem) -> str:
    return f"e4m3 to {out_dtype(problem)}" if is_fp8(problem) else problem.dtype
