"""What runs beside the GPU workers: the Ray CPU task that compiles one config, and the screen
on its compile report that decides whether the config is worth GPU time at all."""

from __future__ import annotations

from dataclasses import dataclass

from workers.compile import compile_cubin, toolkit_version
from workers.errors import CompileError
from workers.results import Binary, CompileRequest

# Configs that spill more than this are not measured. Over 1,600 trials of the attention suite on
# an H200 (2026-11-22), none that spilled more than 128 bytes came within 10% of its study's best.
SCREEN_SPILL_BYTES = 256


@dataclass(frozen=True)
class CompileFailure:
    reason: str
    log: str


def compile_task(request: CompileRequest, backend: str, cache_dir: str | None,
                 timeout_s: float) -> Binary | CompileFailure:
    """Compile on a CPU; a compiler error comes back as a value (Ray would wrap an exception)."""
    try:
        return compile_cubin(request, backend=backend, cache_dir=cache_dir, timeout_s=timeout_s)
    except CompileError as exc:
        return CompileFailure(str(exc), exc.log)


def warm_compiler(backend: str) -> str:
    """Load the compiler in this worker process (NVRTC's first compile takes about 0.7 s more
    than the next ones): the pool starts one per CPU while its GPU actors start. Its answer,
    the toolkit or why none loads, is not read: a compile says it again."""
    try:
        return toolkit_version(backend)
    except CompileError as exc:
        return str(exc)


def screen(binary: Binary | None, spill_limit: int | None) -> str | None:
    """Why the compile report rules a binary out before any GPU time, or None."""
    resources = binary.resources if binary is not None else None
    if spill_limit is None or resources is None or resources.spill_stores <= spill_limit:
        return None
    return (f"spills {resources.spill_stores} bytes to local memory (more than {spill_limit}): "
            "screened before the GPU")
