"""Inputs, reference and tolerances for attention forward, layout (B, H, S, D).

A shape is B,H,S,D, or B,H,S,D,HKV for grouped-query attention: K and V have HKV heads, each
serving H / HKV query heads in order (query head h reads KV head h // (H / HKV)); HKV = 1 is
multi-query attention. HKV = H is written as the four-number shape.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from templates.elements import from_bits, normal_inputs, to_bits  # noqa: F401 - to_bits: for the tests
from templates.family import BufferSpec, Problem, TemplateError, Validation, shown

HEAD_DIMS = (64, 96, 128, 256)
DTYPES = ("fp16", "bf16")
# ||out - ref|| / ||ref|| on the checked rows. P is rounded to the element type before P.V, so
# the bound follows the type's precision: fp16 has 11 significant bits, bf16 8.
TOLERANCE = {"fp16": 4e-3, "bf16": 3e-2}
POISON = {"fp16": 0x7E00, "bf16": 0x7FC0}  # quiet NaN in each type
ROWS_PER_HEAD = 48  # float64 reference rows per checked (b, h)
CHECKED_HEADS = 4


def parse_shape(shape: str | tuple[int, ...] | list[int]) -> tuple[int, int, int, int]:
    if isinstance(shape, str):
        parts = [p.strip() for p in shape.replace("x", ",").split(",")]
        try:
            dims = tuple(int(p) for p in parts)
        except ValueError:
            raise TemplateError(f"malformed shape {shown(shape)}: expected B,H,S,D such as 4,16,4096,128, "
                                "or B,H,S,D,HKV") from None
    else:
        dims = tuple(int(d) for d in shape)
    if len(dims) not in (4, 5) or min(dims) < 1:
        raise TemplateError(f"malformed shape {shown(shape)}: expected four positive integers B,H,S,D "
                            "(or five: B,H,S,D,HKV with HKV key/value heads)")
    b, h, s, d = dims[:4]
    if len(dims) == 5 and h % dims[4]:
        raise TemplateError(f"{dims[4]} key/value heads do not divide {h} query heads (HKV must divide H)")
    if d not in HEAD_DIMS:
        raise TemplateError(f"unsupported head dimension D={d}: attention supports {list(HEAD_DIMS)}")
    if h > 65535 or b > 65535:
        raise TemplateError(f"B and H must each be at most 65535 (got B={b}, H={h})")
    if b * h * s * d * 2 >= 2**31 * 8:
        raise TemplateError(f"shape {dims} is too large for one tensor")
    return dims if len(dims) == 5 and dims[4] != h else (b, h, s, d)


def kv_heads(shape: tuple[int, ...]) -> int:
    """K's and V's heads: HKV of a five-number shape, else H."""
    return shape[4] if len(shape) == 5 else shape[1]


def group(shape: tuple[int, ...]) -> int:
    """Query heads a key/value head serves (1 without grouping)."""
    return shape[1] // kv_heads(shape)


def q_shape(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """Q's and O's (B, H, S, D)."""
    return tuple(shape[:4])


def kv_shape(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """K's and V's (B, HKV, S, D)."""
    b, _, s, d = shape[:4]
    return b, kv_heads(shape), s, d


def flops(problem: Problem) -> float:
    b, h, s, d = problem.shape[:4]
    total = 4.0 * b * h * s * s * d
    return total / 2 if problem.flag("causal") else total


def min_bytes(problem: Problem) -> int:
    b, h, s, d = problem.shape[:4]
    return 2 * (2 * b * h * s * d + 2 * b * kv_heads(problem.shape) * s * d)  # read Q, K, V once, write O


def inputs(problem: Problem, seed: int) -> dict[str, np.ndarray]:
    """Standard normal Q, K and V (``templates.elements.normal_inputs``)."""
    q, kv = q_shape(problem.shape), kv_shape(problem.shape)
    return normal_inputs({"q": q, "k": kv, "v": kv}, problem.dtype, seed)


def outputs(problem: Problem) -> tuple[BufferSpec, ...]:
    return (BufferSpec("o", q_shape(problem.shape), np.dtype(np.uint16), POISON[problem.dtype],
                       element=problem.dtype),)


def checked_rows(seq: int, rng: np.random.Generator) -> np.ndarray:
    """The first and last rows (tails and the causal corner), plus random rows in between."""
    edge = min(seq, 8)
    rows = set(range(edge)) | set(range(seq - edge, seq))
    rows |= set(rng.integers(0, seq, size=min(seq, ROWS_PER_HEAD - 2 * edge)).tolist())
    return np.array(sorted(rows))


def reference_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, rows: np.ndarray, causal: bool) -> np.ndarray:
    """float64 attention for the given query rows of one (b, h)."""
    d = q.shape[-1]
    scores = q[rows] @ k.T / math.sqrt(d)
    if causal:
        cols = np.arange(k.shape[0])
        scores = np.where(cols[None, :] > rows[:, None], -np.inf, scores)
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=1, keepdims=True)
    return weights @ v


def reference(problem: Problem, ins: Mapping[str, np.ndarray]) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """(b, h, rows, float64 output rows) of the checked heads: the first, the last and random ones."""
    b_count, h_count, seq, _ = problem.shape[:4]
    per_kv = group(problem.shape)
    rng = np.random.default_rng(seq * 7919 + b_count * 31 + h_count)
    heads = {(0, 0), (b_count - 1, h_count - 1)}
    while len(heads) < min(CHECKED_HEADS, b_count * h_count):
        heads.add((int(rng.integers(b_count)), int(rng.integers(h_count))))
    checked = []
    for b, h in sorted(heads):
        rows = checked_rows(seq, rng)
        q = from_bits(ins["q"].reshape(q_shape(problem.shape))[b, h], problem.dtype)
        k, v = (from_bits(ins[n].reshape(kv_shape(problem.shape))[b, h // per_kv], problem.dtype) for n in ("k", "v"))
        checked.append((b, h, rows, reference_rows(q, k, v, rows, problem.flag("causal"))))
    return checked


def validate(problem: Problem, ins: Mapping[str, np.ndarray], outs: Mapping[str, np.ndarray],
             expected: list[tuple[int, int, np.ndarray, np.ndarray]] | None = None) -> Validation:
    """The checked rows of a few heads against the float64 reference (``expected``, or computed
    here). NaN, Inf and unwritten elements were counted before (``BufferSpec.element``); only
    those heads are read."""
    diff_sq = ref_sq = max_abs = 0.0
    for b, h, rows, ref in expected if expected is not None else reference(problem, ins):
        diff = from_bits(np.asarray(outs["o"][b, h])[rows], problem.dtype) - ref
        diff_sq += float((diff**2).sum())
        ref_sq += float((ref**2).sum())
        max_abs = max(max_abs, float(np.abs(diff).max()))
    error = math.sqrt(diff_sq / ref_sq)
    limit = TOLERANCE[problem.dtype]
    if not error <= limit:
        return Validation(False, error, max_abs, f"relative error {error:.2e} > {limit:.0e} ({problem.dtype})")
    return Validation(True, error, max_abs)
