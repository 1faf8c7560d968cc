"""FP8 E4M3 elements as the gemm family keeps them on the host (raw bytes in uint8 arrays), and the
quantization its e4m3 inputs are drawn with.

E4M3 "fn" (torch.float8_e4m3fn, OCP FP8): 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
infinities; 0x7F and 0xFF are NaN; the largest finite value is 448, the smallest subnormal 2^-9.

    bits = to_e4m3(values)           # float -> raw bytes (round to nearest even, saturating at 448)
    values = from_e4m3(bits)         # raw bytes -> float64
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
E4M3_BIAS = 7
MIN_NORMAL_EXPONENT = -6  # 2^-6: the smallest normal; below it steps of 2^-9
NAN_BITS = 0x7F
MAX_BITS = 0x7E  # 448
CHUNK = 1 << 22


def _decode_table() -> np.ndarray:
    bits = np.arange(256)
    exponent = (bits >> 3) & 0xF
    mantissa = (bits & 7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa * 2.0**-9,
                         (1.0 + mantissa / 8.0) * np.exp2(exponent.astype(np.float64) - E4M3_BIAS))
    values = np.where(bits & 0x80, -magnitude, magnitude)
    values[(bits & 0x7F) == NAN_BITS] = np.nan
    return values


DECODE = _decode_table()


def from_e4m3(bits: np.ndarray) -> np.ndarray:
    """Raw E4M3 bytes -> float64 (NaN for 0x7F and 0xFF)."""
    return DECODE[np.asarray(bits, dtype=np.uint8)]


def to_e4m3(values: np.ndarray) -> np.ndarray:
    """Values -> raw E4M3 bytes, rounded to nearest even as torch's ``.to(torch.float8_e4m3fn)``
    rounds a float32 (torch 2.x on the CPU): subnormals in steps of 2^-9; magnitudes past 448 and
    +-Inf saturate to +-448; NaN to NaN (0x7F, 0xFF with the sign bit). In runs of CHUNK
    elements (its float64 temporaries stay small)."""
    values = np.asarray(values)
    flat = values.reshape(-1)
    out = np.empty(flat.size, dtype=np.uint8)
    for start in range(0, flat.size, CHUNK):
        out[start:start + CHUNK] = _encode(flat[start:start + CHUNK])
    return out.reshape(values.shape)


def _encode(values: np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    sign = np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    a = np.abs(x)
    finite = np.isfinite(a)
    safe = np.where(finite, a, 0.0)
    _, e = np.frexp(safe)  # safe = m 2^e with m in [0.5, 1): its binade is 2^(e - 1)
    exponent = np.maximum(e - 1, MIN_NORMAL_EXPONENT)
    quantum = np.exp2(exponent - 3.0)
    rounded = np.rint(safe / quantum) * quantum  # rint: halves to even
    _, e2 = np.frexp(rounded)
    r_exp = np.maximum(e2 - 1, MIN_NORMAL_EXPONENT)
    normal = rounded >= 2.0**MIN_NORMAL_EXPONENT
    mantissa = np.where(normal, rounded / np.exp2(r_exp - 3.0) - 8.0, rounded / 2.0**-9)
    field = np.where(normal, r_exp + E4M3_BIAS, 0)
    bits = (field.astype(np.int64) << 3) | mantissa.astype(np.int64)
    bits = np.where(rounded > E4M3_MAX, MAX_BITS, bits)
    bits = np.where(np.isnan(a), NAN_BITS, np.where(np.isinf(a), MAX_BITS, bits))
    return (bits.astype(np.uint8) | sign).astype(np.uint8)


def quantize(values: np.ndarray, block: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray]:
    """(E4M3 bytes, fp32 scales) of ``values`` (2-D) as FP8 layers quantize them: each block's
    largest magnitude to 448, scale = amax / 448. ``block`` (rows, columns) per scale, the edge
    blocks clipped; None: one scale for the whole tensor (a 1-element array)."""
    values = np.asarray(values, dtype=np.float32)
    if block is None:
        scale = np.array([_scale_of(np.abs(values).max())], dtype=np.float32)
        return to_e4m3(values / scale[0]), scale
    rows, cols = block
    amax = _block_amax(np.abs(values), rows, cols)
    scales = np.vectorize(_scale_of, otypes=[np.float32])(amax).astype(np.float32)
    expanded = np.repeat(np.repeat(scales, rows, axis=0), cols, axis=1)[:values.shape[0], :values.shape[1]]
    return to_e4m3(values / expanded), scales


def expand(scales: np.ndarray, block: tuple[int, int], shape: tuple[int, int]) -> np.ndarray:
    """Block scales repeated to one an element of a ``shape`` tensor (float64)."""
    rows, cols = block
    return np.repeat(np.repeat(np.asarray(scales, np.float64), rows, axis=0), cols, axis=1)[:shape[0], :shape[1]]


def _scale_of(amax: float) -> np.float32:
    return np.float32(amax / E4M3_MAX) if amax > 0 else np.float32(1.0)


def _block_amax(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Each (rows x cols) block's largest element, the edge blocks clipped."""
    m, k = a.shape
    pm, pk = -(-m // rows) * rows, -(-k // cols) * cols
    padded = np.zeros((pm, pk), dtype=a.dtype)
    padded[:m, :k] = a
    return padded.reshape(pm // rows, rows, pk // cols, cols).max(axis=(1, 3))
