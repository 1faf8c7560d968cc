"""What runs beside the GPU workers: the Ray CPU task that renders and compiles one config, and
the screen on its compile report (spills, registers and shared memory against the SM) that
decides whether the config is worth GPU time at all."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from templates import get_family
from templates.family import DeviceLimits, Launch, Problem, TemplateError
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


def compile_task(request: CompileRequest, backend: str, cache_dir: str | None, timeout_s: float,
                 family: Any = None, problem: Problem | None = None,
                 params: Mapping[str, Any] | None = None) -> Binary | CompileFailure:
    """Compile on a CPU; a compiler error comes back as a value (Ray would wrap an exception).
    Given ``family`` (a reference or a family: ``templates.get_family``), ``problem`` and
    ``params``, the source is rendered here first (the coordinator leaves it to the CPUs that
    compile); a template that fails to render is a CompileFailure "render: ..."."""
    if family is not None:
        try:
            request = replace(request, source=get_family(family).render(dict(params or {}), problem))
        except TemplateError as exc:
            return CompileFailure(f"render: {exc}", "")
        except Exception as exc:  # noqa: BLE001 - a family's bug fails its config, not the study
            return CompileFailure(f"render: {type(exc).__name__}: {exc}"[:300], "")
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


def block_registers(registers: int, threads: int) -> int:
    """The registers a block of ``threads`` takes on an SM: ``registers`` a thread, allocated
    256 a warp."""
    return -(-registers * 32 // 256) * 256 * -(-threads // 32)


def screen(binary: Binary | None, spill_limit: int | None, launch: Launch | None = None,
           device: DeviceLimits | None = None) -> str | None:
    """Why the compile report rules a binary out before any GPU time, or None: it spills more
    than ``spill_limit`` bytes, or (given its launch and the device) not one block can be
    resident on an SM: its registers (allocated 256 a warp) or its shared memory (static from
    the report, plus the launch's dynamic) exceed what the SM gives a block. The GPU would load
    the module only to refuse the launch."""
    resources = binary.resources if binary is not None else None
    if resources is None:
        return None
    if spill_limit is not None and resources.spill_stores > spill_limit:
        return (f"spills {resources.spill_stores} bytes to local memory (more than {spill_limit}): "
                "screened before the GPU")
    if launch is None or device is None:
        return None
    threads = launch.block[0] * launch.block[1] * launch.block[2]
    registers = block_registers(resources.registers, threads)
    if registers > device.regs_per_sm:
        return (f"needs {registers} registers a block ({resources.registers} a thread, {threads} "
                f"threads), an SM has {device.regs_per_sm}: screened before the GPU")
    smem = resources.smem_static + launch.smem_bytes
    if smem > device.max_smem_per_block_optin:
        return (f"needs {smem} bytes of shared memory a block ({resources.smem_static} static + "
                f"{launch.smem_bytes} dynamic), the device allows {device.max_smem_per_block_optin}: "
                "screened before the GPU")
    return None
