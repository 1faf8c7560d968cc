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


@dataclass(frozen=True)
class BufferSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype  # host numpy dtype of the raw elements (bf16 travels as uint16 bits)
    poison: int  # 16-bit pattern that fills an output before each run (a NaN)


class KernelFamily(abc.ABC):
    """A tunable kernel family. Subclasses define the space, the problem and the source."""

    name: str
    folder: Path
    params: tuple[Param, ...]
    dtypes: tuple[str, ...]
    # (shape, dtype, causal) problems that `tuner bench FAMILY` compares against peers
    suite: tuple[tuple[tuple[int, ...], str, bool], ...] = ()

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
        """Hash of every file in the family's folder and of the space: a new one is a new version."""
        digest = hashlib.sha256()
        for path in sorted(self.folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
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

    @abc.abstractmethod
    def validate(
        self, problem: Problem, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
    ) -> Validation:
        """Compare outputs with a float64 reference; any NaN/Inf or unwritten element fails."""


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
