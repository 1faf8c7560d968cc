"""16-bit elements as families keep them on the host (raw fp16 or bf16 bit patterns in uint16
arrays), and random inputs drawn into them.

    bits = to_bits(values, "bf16")            # float32 values -> raw patterns (round to nearest even)
    values = from_bits(bits, "bf16")          # raw patterns -> float64
    ins = normal_inputs({"q": (2, 8, 1024, 64), "k": ..., "v": ...}, "fp16", seed)
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping

import numpy as np

INPUT_BLOCK = 1 << 22  # elements drawn from one random stream


def to_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> raw 16-bit patterns of `dtype` (round to nearest even)."""
    if dtype == "fp16":
        return values.astype(np.float16).view(np.uint16)
    bits = values.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Raw 16-bit patterns -> float64."""
    if dtype == "fp16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def normal_inputs(shapes: Mapping[str, tuple[int, ...]], dtype: str, seed: int,
                  scale: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """Standard normal buffers of these shapes (times ``scale[name]`` where given) as raw 16-bit
    elements, drawn in blocks of INPUT_BLOCK elements, each from its own stream of ``seed`` (the
    same values whatever the number of threads). numpy draws without the GIL, so the blocks are
    drawn on threads: an 8x16x2048x128 attention problem took 1.9 s on one."""
    sizes = {name: math.prod(shape) for name, shape in shapes.items()}
    jobs = [(name, block) for name, size in sizes.items() for block in range(-(-size // INPUT_BLOCK))]
    streams = np.random.SeedSequence(seed).spawn(len(jobs))
    out = {name: np.empty(size, dtype=np.uint16) for name, size in sizes.items()}
    factor = {name: np.float32((scale or {}).get(name, 1.0)) for name in sizes}

    def draw(job: int) -> None:
        name, block = jobs[job]
        lo, hi = block * INPUT_BLOCK, min(sizes[name], (block + 1) * INPUT_BLOCK)
        values = np.random.default_rng(streams[job]).standard_normal(hi - lo, dtype=np.float32)
        out[name][lo:hi] = to_bits(values * factor[name] if factor[name] != 1 else values, dtype)

    with ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 1))) as pool:
        list(pool.map(draw, range(len(jobs))))
    return {name: values.reshape(shapes[name]) for name, values in out.items()}
