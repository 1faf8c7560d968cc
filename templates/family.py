"""The contract every kernel family fulfils.

A family is a folder under ``templates/``: a Jinja CUDA source, a parameter space with
constraints, and a problem description (inputs, reference, FLOPs, launch geometry)::

    from templates import get_family
    from templates.family import Problem, H100_LIMITS

    family = get_family("attention")
    problem = family.parse_problem("4,16,4096,128", dtype="fp16", causal=True)
    params = family.default_params()
    assert family.check(params, problem, H100_LIMITS) is None
    source = family.render(params, problem)          # CUDA C++ text
    launch = family.launch(params, problem)          # grid, block, shared memory, arguments

Nothing here imports CUDA, Ray or a database: families are plain data and numpy.
"""

from __future__ import annotations

import abc
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

Params = Mapping[str, Any]


class TemplateError(ValueError):
    """A problem or a parameter set that a family cannot handle (one clear line)."""


@dataclass(frozen=True)
class Param:
    """One tunable: a name and its ordered, finite choices."""

    name: str
    choices: tuple[Any, ...]
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.choices:
            raise TemplateError(f"parameter {self.name!r} has no choices")


@dataclass(frozen=True)
class Problem:
    """What is computed: a shape, an element type and the causal flag. Hashable, a cache key."""

    shape: tuple[int, ...]
    dtype: str
    causal: bool = False

    @property
    def key(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        return f"{dims}-{self.dtype}" + ("-causal" if self.causal else "")

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "causal": self.causal}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Problem":
        return cls(tuple(int(d) for d in data["shape"]), str(data["dtype"]), bool(data["causal"]))


@dataclass(frozen=True)
class DeviceLimits:
    """The device facts that constraints need; read off the GPU, or a named default."""

    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_smem_per_block_optin: int  # bytes a block may use after raising its dynamic limit
    max_threads_per_block: int = 1024
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255

    def to_json(self) -> dict[str, Any]:
        data = self.__dict__.copy()
        data["compute_capability"] = list(self.compute_capability)
        return data


# What the constraints assume when no GPU is visible (CPU-only compile and render checks).
H100_LIMITS = DeviceLimits(
    name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    sm_count=132,
    max_smem_per_block_optin=232448,
)


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument: a named device buffer, or a 32-bit scalar."""

    kind: str  # "buffer" | "i32" | "f32"
    value: Any

    def __post_init__(self) -> None:
        if self.kind not in ("buffer", "i32", "f32"):
            raise TemplateError(f"unknown kernel argument kind {self.kind!r}")


@dataclass(frozen=True)
class Launch:
    """How to launch one kernel of a compiled module."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    args: tuple[KernelArg, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "grid": list(self.grid),
            "block": list(self.block),
            "dynamic_smem_bytes": self.smem_bytes,
            "args": [{"kind": a.kind, "value": a.value} for a in self.args],
        }


@dataclass(frozen=True)
class Validation:
    """The outcome of comparing a kernel's outputs with the reference."""

    ok: bool
    error: float  # relative error ||out - ref|| / ||ref|| on the checked elements (nan if unknown)
    max_abs_error: float
    reason: str | None = None


# Float formats an output's elements may have: (bytes, exponent bits). An element whose
# exponent bits are all set is NaN or Inf; the poison is a NaN, so it counts as unwritten.
FLOAT_FORMATS: dict[str, tuple[int, int]] = {
    "fp16": (2, 0x7C00),
    "bf16": (2, 0x7F80),
    "fp32": (4, 0x7F800000),
}


@dataclass(frozen=True)
class BufferSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype  # host numpy dtype of the raw elements (bf16 travels as uint16 bits)
    poison: int  # 16-bit pattern that fills an output before each run (a NaN)
    # The elements' float format (a FLOAT_FORMATS key): the worker then counts NaN, Inf and
    # unwritten elements itself (on the GPU, without reading the output back). "" for none:
    # the family's ``validate`` must then look at every element.
    element: str = ""

    def __post_init__(self) -> None:
        if self.element and self.element not in FLOAT_FORMATS:
            raise TemplateError(f"output {self.name!r}: unknown element format {self.element!r} "
                                f"(one of {', '.join(FLOAT_FORMATS)})")
        if self.element and np.dtype(self.dtype).itemsize != FLOAT_FORMATS[self.element][0]:
            raise TemplateError(f"output {self.name!r}: {self.element} elements are "
                                f"{FLOAT_FORMATS[self.element][0]} bytes, {np.dtype(self.dtype)} is not")


def count_nonfinite(values: np.ndarray, element: str) -> int:
    """Elements of ``values`` (raw bits of an ``element``-format array) that are NaN, Inf or the
    poison: what the worker counts on the GPU, here on the host."""
    size, exponent = FLOAT_FORMATS[element]
    bits = np.ascontiguousarray(values).view(np.uint16 if size == 2 else np.uint32)
    return int(np.count_nonzero((bits & exponent) == exponent))


def check_outputs(family: "KernelFamily", problem: Problem, inputs: Mapping[str, np.ndarray],
                  outputs: Mapping[str, np.ndarray]) -> Validation:
    """On the host, what a worker checks of a run: no NaN, Inf or unwritten element in an output
    with a float ``element``, then the family's reference comparison."""
    for spec in family.outputs(problem):
        if spec.element:
            bad = count_nonfinite(outputs[spec.name], spec.element)
            if bad:
                return unwritten(spec.name, bad)
    return family.validate(problem, inputs, outputs, family.reference(problem, inputs))


def unwritten(name: str, count: int) -> Validation:
    """The failed validation of an output with ``count`` NaN, Inf or unwritten elements."""
    return Validation(False, float("nan"), float("nan"),
                      f"{count} element{'s' if count != 1 else ''} of {name!r} "
                      f"{'are' if count != 1 else 'is'} NaN/Inf or unwritten")


class KernelFamily(abc.ABC):
    """A tunable kernel family. Subclasses define the space, the problem and the source."""

    name: str
    folder: Path
    params: tuple[Param, ...]
    dtypes: tuple[str, ...]
    # (shape, dtype, causal) problems that `tuner bench FAMILY` compares against peers
    suite: tuple[tuple[tuple[int, ...], str, bool], ...] = ()
    # The files of the folder that decide the kernels rendered and how they are launched: the
    # template hash covers them and the space. Empty: every file. Inputs, reference and
    # starting points may then change without making a new version of the kernels.
    kernel_files: tuple[str, ...] = ()

    # -- problems ---------------------------------------------------------------------------
    @abc.abstractmethod
    def parse_problem(self, shape: str | Sequence[int], dtype: str, causal: bool = False) -> Problem:
        """Validate a user's shape/dtype and return a Problem, or raise TemplateError."""

    @abc.abstractmethod
    def flops(self, problem: Problem) -> float:
        """Useful floating-point operations of one run (what TFLOPS are quoted from)."""

    def tflops(self, problem: Problem, median_ms: float) -> float:
        """The rate one run of ``median_ms`` milliseconds achieves, in TFLOPS."""
        return self.flops(problem) / median_ms / 1e9

    @abc.abstractmethod
    def min_bytes(self, problem: Problem) -> int:
        """Fewest bytes one run must move through device memory."""

    # -- the space ----------------------------------------------------------------------------
    @abc.abstractmethod
    def check(self, params: Params, problem: Problem, device: DeviceLimits) -> str | None:
        """None if ``params`` can run ``problem`` on ``device``; else the reason it cannot."""

    def default_params(self) -> dict[str, Any]:
        return {p.name: p.choices[0] for p in self.params}

    def configs(self) -> Iterator[dict[str, Any]]:
        """Every point of the space, valid or not, in a fixed order."""
        names = [p.name for p in self.params]
        for values in itertools.product(*(p.choices for p in self.params)):
            yield dict(zip(names, values))

    def valid_configs(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        return [c for c in self.configs() if self.check(c, problem, device) is None]

    def starting_points(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        """Configs a kernel engineer would try first (a study measures them before the sampler's
        proposals, like Triton's config list); only those ``check`` accepts. None by default."""
        return []

    def validate_params(self, params: Params) -> None:
        known = {p.name: p for p in self.params}
        for name, value in params.items():
            if name not in known:
                raise TemplateError(f"{self.name}: unknown parameter {name!r}")
            if value not in known[name].choices:
                raise TemplateError(
                    f"{self.name}: {name}={value!r} is not one of {list(known[name].choices)}"
                )
        missing = [n for n in known if n not in params]
        if missing:
            raise TemplateError(f"{self.name}: missing parameters {missing}")

    # -- code ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def render(self, params: Params, problem: Problem) -> str:
        """CUDA C++ source for ``params`` (StrictUndefined Jinja)."""

    @abc.abstractmethod
    def launch(self, params: Params, problem: Problem) -> Launch:
        """Grid, block, dynamic shared memory and arguments."""

    def compile_options(self, params: Params, problem: Problem) -> tuple[str, ...]:
        return ("-O3",)

    @property
    def template_hash(self) -> str:
        """Hash of the ``kernel_files`` (every file of the folder when none are named) and of the
        space: a new one is a new version of the kernels."""
        digest = hashlib.sha256()
        paths = [self.folder / name for name in self.kernel_files] or [
            p for p in sorted(self.folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
        for path in paths:
            if not path.is_file():
                raise TemplateError(f"{self.name}: kernel file {path.name!r} is not in {self.folder}")
            digest.update(path.relative_to(self.folder).as_posix().encode())
            digest.update(path.read_bytes())
        space = [[p.name, [repr(c) for c in p.choices]] for p in self.params]
        digest.update(json.dumps(space).encode())
        return digest.hexdigest()[:16]

    # -- data ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        """Fresh random host inputs (never zeros), keyed by buffer name."""

    @abc.abstractmethod
    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        """The output buffers, with the poison pattern each is filled with before a run."""

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> Any:
        """What ``validate`` compares outputs with, computed from the inputs: a worker computes
        it once per (problem, seed) and passes it to every trial's ``validate``. None (the
        default): ``validate`` computes its own each time."""
        return None

    @abc.abstractmethod
    def validate(
        self, problem: Problem, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
        reference: Any = None,
    ) -> Validation:
        """Compare outputs with a float64 reference (``reference``'s, when given).

        Before this is called, every output whose BufferSpec names an ``element`` format has
        been checked for NaN, Inf and unwritten elements (``check_outputs`` on the host; on the
        GPU by the worker). On the GPU each output is a view of device memory: indexing it with
        leading integers (``outputs["o"][b, h]``) copies back just that block, ``np.asarray``
        the whole output. Read only the elements compared."""


@dataclass(frozen=True)
class SpaceSummary:
    """Counts shown to users before a study starts."""

    total: int
    valid: int
    reasons: dict[str, int] = field(default_factory=dict)


def summarize_space(family: KernelFamily, problem: Problem, device: DeviceLimits) -> SpaceSummary:
    reasons: dict[str, int] = {}
    valid = total = 0
    for config in family.configs():
        total += 1
        reason = family.check(config, problem, device)
        if reason is None:
            valid += 1
        else:
            key = reason.split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
    return SpaceSummary(total, valid, reasons)
