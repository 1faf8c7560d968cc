"""A family checked without a GPU, before any study spends GPU time on it::

    from tuner.reports.lint import lint_family

    report = lint_family("docs/examples/rmsnorm")    # a name, a folder or a .py file
    report.spaces[0].valid, report.compiled[0].registers, report.reference

What it does: the space's size and valid share for each problem of the family's suite; every
valid config of one problem rendered and its launch checked against the device's limits (sm_90:
H100 and H200, when no GPU is asked about); a sample of them compiled for sm_90a the way the
workers compile (registers, spills, seconds, and ptxas' notes where it cut a wgmma pipeline:
waits it injected, wgmmas it serialized); the reference run on the CPU on a small problem
(short-form families; it needs torch). A broken family raises :class:`LintError`, one line that
names the file and the field: a template that does not render, a constraint that raises, empty
choices, a missing reference, an output the launch does not pass.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from templates.family import H100_LIMITS, DeviceLimits, KernelFamily, Launch, Problem, TemplateError
from tuner.errors import UsageError

logger = logging.getLogger("tuner")

GRID_MAX = (2**31 - 1, 65535, 65535)
BLOCK_MAX = (1024, 1024, 64)
SMALL_DIM = 64  # the reference's CPU run: each dimension cut to at most this
REASONS_UP_TO = 200_000  # configs: a larger space is counted by the family's own enumeration


class LintError(UsageError):
    """A family that cannot be tuned as written: ``file: field: what``."""


@dataclass(frozen=True)
class SpaceCount:
    problem: Problem
    total: int
    valid: int
    reasons: dict[str, int] = field(default_factory=dict)  # refusals by reason (small spaces)


@dataclass(frozen=True)
class Compiled:
    params: dict[str, Any]
    seconds: float
    registers: int | None
    spill_bytes: int | None
    smem_static: int | None
    screened: str | None  # why the workers would not measure it (spills, registers a block), or None
    advisories: tuple[str, ...] = ()  # ptxas' notes of a cut wgmma pipeline (workers.compile.ptxas_advisories)


@dataclass(frozen=True)
class LintReport:
    family: str
    file: Path
    spaces: tuple[SpaceCount, ...]
    problem: Problem  # the one whose valid configs were rendered and compiled
    rendered: int
    render_seconds: float
    toolkit: str
    compiled: tuple[Compiled, ...]
    reference: str  # what the CPU run of the reference found, one line


def lint_family(ref: str | KernelFamily, *, shape: str | None = None, dtype: str | None = None,
                flags: Mapping[str, Any] | None = None, sample: int = 8, backend: str = "auto",
                device: DeviceLimits = H100_LIMITS, render_limit: int = 20_000) -> LintReport:
    """Check ``ref`` as described above; ``shape``/``dtype``: the problem to render and compile
    (default: the suite's first). Raises LintError (a broken family) or UsageError (bad input)."""
    from tuner import lookup

    try:
        from templates import get_family

        family = get_family(ref)
    except TemplateError as exc:
        raise LintError(str(exc).splitlines()[0]) from None
    file = family_file(family)
    problems = _problems(family, file, shape, dtype, flags)
    if shape is not None and dtype is not None:
        given = lookup.problem(family, shape, dtype, flags)
        problems = [given, *(p for p in problems if p != given)]
    spaces = tuple(_count(family, file, p, device) for p in problems)
    problem = problems[0]
    if not spaces[0].valid:
        raise LintError(f"{file}: constraints: no config is valid for {problem.key}")
    valid = _guard(file, "check", lambda: family.valid_configs(problem, device))
    start = time.perf_counter()
    outputs = {spec.name for spec in family.outputs(problem)}
    for params in valid[:render_limit]:
        _guard(file, "render", lambda: family.render(params, problem))
        launch = _guard(file, "launch", lambda: family.launch(params, problem))
        _check_launch(file, launch, outputs, params, device)
    render_seconds = time.perf_counter() - start
    toolkit, compiled = _compile_sample(family, file, problem, valid, sample, backend, device)
    return LintReport(family.name, file, spaces, problem, min(len(valid), render_limit), render_seconds,
                      toolkit, tuple(compiled), _reference(family, problem))


def family_file(family: KernelFamily) -> Path:
    """The file that defines ``family``: a short form's module, or its class's."""
    found = getattr(family, "file", None)
    return Path(found) if found else Path(inspect.getfile(type(family)))


def _guard(file: Path, what: str, call: Any) -> Any:
    """``call()``; what it raises as a LintError naming the file and ``what``."""
    try:
        return call()
    except TemplateError as exc:
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LintError(line if line.startswith(("/", str(file))) else f"{file}: {what}: {line}") from None
    except Exception as exc:  # noqa: BLE001 - the family's own bug, told in one line
        raise LintError(f"{file}: {what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") \
            from None


def _problems(family: KernelFamily, file: Path, shape: str | None, dtype: str | None,
              flags: Mapping[str, Any] | None) -> list[Problem]:
    if (shape is None) != (dtype is None):
        raise UsageError("give both --shape and --dtype, or neither (the family's suite)")
    found = [_guard(file, "suite", lambda e=entry: family.parse_problem(e[0], e[1], e[2] if len(e) > 2 else None))
             for entry in family.suite]
    if not found and shape is None:
        raise LintError(f"{file}: suite: empty: give a problem with --shape and --dtype")
    return found


def _count(family: KernelFamily, file: Path, problem: Problem, device: DeviceLimits) -> SpaceCount:
    if not family.params:
        raise LintError(f"{file}: params: none")
    for param in family.params:
        if not param.choices:
            raise LintError(f"{file}: params: {param.name!r} has no choices")
    total = math.prod(len(p.choices) for p in family.params)
    if total > REASONS_UP_TO:
        valid = _guard(file, "check", lambda: family.valid_configs(problem, device))
        return SpaceCount(problem, total, len(valid))
    reasons: dict[str, int] = {}
    valid_count = 0
    for config in family.configs():
        reason = _guard(file, "constraints", lambda: family.check(config, problem, device))
        if reason is None:
            valid_count += 1
        else:
            key = str(reason).split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
    return SpaceCount(problem, total, valid_count, reasons)


def _check_launch(file: Path, launch: Launch, outputs: set[str], params: Mapping[str, Any],
                  device: DeviceLimits) -> None:
    """Every output among the kernels' arguments (a buffer, or a tensor map's: a TMA store), and
    each kernel's grid, block and dynamic shared memory within ``device``'s limits."""
    args = [a for step in launch.kernels for a in step.args]
    passed = {a.value for a in args if a.kind == "buffer"} | {a.value.buffer for a in args if a.kind == "tensormap"}
    missing = sorted(outputs - passed)
    if missing:
        raise LintError(f"{file}: launch: output {missing[0]!r} is not among the kernel's arguments")
    for step in launch.kernels:
        threads = math.prod(step.block)
        where = f"{file}: launch: {dict(params)}"
        if threads > device.max_threads_per_block or any(b > m for b, m in zip(step.block, BLOCK_MAX)) \
                or min(step.block) < 1:
            raise LintError(f"{where}: a block of {step.block} threads (at most {device.max_threads_per_block})")
        if min(step.grid) < 1 or any(g > m for g, m in zip(step.grid, GRID_MAX)):
            raise LintError(f"{where}: a grid of {step.grid} blocks (at most {GRID_MAX})")
        if step.smem_bytes > device.max_smem_per_block_optin:
            raise LintError(f"{where}: {step.smem_bytes} bytes of dynamic shared memory "
                            f"(at most {device.max_smem_per_block_optin})")


def spread(configs: Sequence[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` configs spread evenly over ``configs`` (the first among them)."""
    if len(configs) <= count:
        return list(configs)
    return [configs[round(i * (len(configs) - 1) / max(count - 1, 1))] for i in range(count)]


def _compile_sample(family: KernelFamily, file: Path, problem: Problem, valid: Sequence[dict[str, Any]],
                    sample: int, backend: str, device: DeviceLimits) -> tuple[str, list[Compiled]]:
    from workers.compile import compile_cubin, ptxas_advisories, toolkit_version
    from workers.compile_task import SCREEN_SPILL_BYTES, screen
    from workers.errors import CompileError
    from workers.results import CompileRequest

    chosen = spread(valid, sample)
    if not chosen:
        return "", []
    try:
        toolkit = toolkit_version(backend)
    except CompileError as exc:
        raise UsageError(f"cannot compile: {str(exc).splitlines()[0]}") from None
    compiled = []
    for number, params in enumerate(chosen, start=1):
        logger.info("lint: compiling %d/%d for sm_90a: %s", number, len(chosen),
                    " ".join(f"{k}={v}" for k, v in params.items()))
        launch = family.launch(params, problem)
        request = CompileRequest(family.render(params, problem), launch.kernel,
                                 tuple(family.compile_options(params, problem)), arch="sm_90a")
        try:
            binary = compile_cubin(request, backend=backend)
        except CompileError as exc:
            first = next((line for line in str(exc).splitlines() if "error" in line), str(exc).splitlines()[0])
            raise LintError(f"{file}: template: {dict(params)} does not compile: {first.strip()}") from None
        res = binary.resources
        compiled.append(Compiled(dict(params), binary.compile_seconds, res and res.registers,
                                 res and res.spill_stores, res and res.smem_static,
                                 screen(binary, SCREEN_SPILL_BYTES, launch, device), ptxas_advisories(binary.log)))
    return toolkit, compiled


def small_problem(family: KernelFamily, problem: Problem) -> Problem:
    """``problem`` with each dimension cut to SMALL_DIM: the reference's CPU run."""
    return family.parse_problem([min(d, SMALL_DIM) for d in problem.shape], problem.dtype, dict(problem.flags))


def _reference(family: KernelFamily, problem: Problem) -> str:
    """The reference run on the CPU on a small problem, and its own outputs (rounded to the
    outputs' types) put through the family's check: one line of what it found."""
    from templates.simple import SimpleFamily

    if not isinstance(family, SimpleFamily):
        return "not run: a KernelFamily subclass computes its reference in its own way"
    from templates import tensors

    try:
        tensors.torch_module()
    except TemplateError:
        return f"not run: {tensors.TORCH_MISSING}"
    file = family.file
    small = small_problem(family, problem)
    start = time.perf_counter()
    inputs = _guard(file, "inputs", lambda: family.inputs(small, 0))
    expected = _guard(file, "reference", lambda: tensors.run_reference(family, small, inputs, "cpu"))
    seconds = time.perf_counter() - start
    torch = tensors.torch_module()
    for name, values in expected.items():
        if not bool(torch.isfinite(values).all()):
            raise LintError(f"{file}: reference: output {name!r} has NaN or Inf on {small.key}")
    rounded = {name: tensors.to_host(values.to(getattr(torch, tensors.TORCH_DTYPES[family.buffer_dtype(name, small)])))
               for name, values in expected.items()}
    check = tensors.validate(family, small, inputs, rounded)
    if not check.ok:
        raise LintError(f"{file}: tolerance: the reference rounded to its outputs' types fails its own "
                        f"check on {small.key}: {check.reason}")
    precision = "float64" if next(iter(expected.values())).dtype == torch.float64 else "float32"
    return (f"ran on the CPU on {small.key} in {seconds:.2f} s ({precision}); rounded to the outputs' "
            f"types it passes its own check (relative error {check.error:.1e})")
