"""The contract every kernel family fulfils.

A family is a folder under ``templates/``: a Jinja CUDA source, a parameter space with
constraints, and a problem description (inputs, reference, FLOPs, launch geometry)::

    from templates import get_family
    from templates.family import Problem, H100_LIMITS

    family = get_family("attention")
    problem = family.parse_problem("4,16,4096,128", "fp16", {"causal": True})
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
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from templates.versions import versioned_bytes

Params = Mapping[str, Any]


class TemplateError(ValueError):
    """A problem or a parameter set that a family cannot handle (one clear line)."""


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for an error line, cut to ``limit`` characters where longer (a shape of
    thousands of numbers): ``'1,2,3,4,...'``."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 4]}...{text[-1]}"


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
class Flag:
    """A switch or a choice of a family's problems beyond shape and element type (attention's
    causal mask, a GEMM's layouts): its name, its values (the first is the default), what it does.
    The command line offers each as ``--NAME`` (a switch: choices ``(False, True)``) or
    ``--NAME VALUE``."""

    name: str
    choices: tuple[Any, ...] = (False, True)
    doc: str = ""

    @property
    def switch(self) -> bool:
        return self.choices == (False, True)


def _switch(value: Any) -> Any:
    """A switch's value as a bool where it plainly is one (True, 1, "yes", "false", ...)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        return value.lower() in ("1", "true", "yes", "on")
    return value


@dataclass(frozen=True)
class Problem:
    """What is computed: a shape, an element type and the family's flags (every declared flag,
    sorted by name, defaults included). Hashable: a cache key. A family makes them
    (``KernelFamily.parse_problem``); the rest of the service reads only ``key`` and ``spec``.
    """

    shape: tuple[int, ...]
    dtype: str
    flags: tuple[tuple[str, Any], ...] = ()

    def flag(self, name: str) -> Any:
        """A flag's value (KeyError for a flag the family does not declare)."""
        for flag, value in self.flags:
            if flag == name:
                return value
        raise KeyError(f"problem {self.key} has no flag {name!r}")

    @property
    def key(self) -> str:
        """``4x16x4096x128-fp16-causal``: the dims, the type, then each switch that is on by name
        and each other flag as ``name=value``."""
        dims = "x".join(str(d) for d in self.shape)
        flags = "".join(f"-{name}" if value is True else f"-{name}={value}"
                        for name, value in self.flags if value is not False)
        return f"{dims}-{self.dtype}{flags}"

    @property
    def spec(self) -> dict[str, Any]:
        """The canonical description stored and exported: shape, dtype and flags."""
        return {"shape": list(self.shape), "dtype": self.dtype, "flags": dict(self.flags)}

    def to_json(self) -> dict[str, Any]:
        return self.spec

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Problem":
        """From ``spec`` (or a file written before flags, whose one flag was attention's ``causal``
        beside shape and dtype)."""
        flags = data.get("flags")
        if flags is None:
            flags = {"causal": bool(data["causal"])} if "causal" in data else {}
        return cls(tuple(int(d) for d in data["shape"]), str(data["dtype"]), tuple(sorted(dict(flags).items())))


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


@dataclass(frozen=True)
class ModelShape:
    """One transformer layer's sizes (a Hugging Face ``config.json``'s, read by
    ``tuner.study.model``) and what to list of it: ``gate_up`` "fused" (one [2 x intermediate,
    hidden] weight) or "separate" (two of [intermediate, hidden]); ``vocab`` set: the output
    head too. ``dtype`` is a family's name for it (fp16, bf16)."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    vocab: int | None = None
    gate_up: str = "fused"
    attention_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, dtype: str | None = None, lm_head: bool = False,
                    gate_up: str = "fused") -> "ModelShape":
        """The sizes of a parsed ``config.json`` (a multimodal one's ``text_config``), or a
        TemplateError naming the field that is missing or wrong. ``num_key_value_heads`` defaults
        to the heads, ``head_dim`` to hidden / heads; ``dtype`` (fp16, bf16) replaces
        ``torch_dtype``; ``lm_head`` needs ``vocab_size``."""
        if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
            config = {**config, **config["text_config"]}
        if gate_up not in GATE_UP:
            raise TemplateError(f"gate_up must be one of {', '.join(GATE_UP)}, not {gate_up!r}")
        hidden = _config_count(config, "hidden_size")
        heads = _config_count(config, "num_attention_heads")
        kv_heads = _config_count(config, "num_key_value_heads", default=heads)
        if heads % kv_heads:
            raise TemplateError(f"num_key_value_heads ({kv_heads}) does not divide num_attention_heads ({heads})")
        if config.get("head_dim") is None and hidden % heads:
            raise TemplateError(f"no head_dim, and hidden_size ({hidden}) is not a multiple of "
                                f"num_attention_heads ({heads})")
        return cls(hidden=hidden, intermediate=_config_count(config, "intermediate_size"), heads=heads,
                   kv_heads=kv_heads, head_dim=_config_count(config, "head_dim", default=hidden // heads),
                   dtype=_config_dtype(config, dtype),
                   vocab=_config_count(config, "vocab_size") if lm_head else None, gate_up=gate_up,
                   attention_bias=_config_switch(config, "attention_bias"),
                   mlp_bias=_config_switch(config, "mlp_bias"))


# a config's torch_dtype (or dtype) -> the families' name for it
MODEL_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16"}
GATE_UP = ("fused", "separate")


def _config_count(config: Mapping[str, Any], field: str, default: int | None = None) -> int:
    value = config.get(field)
    if value is None:
        if default is None:
            raise TemplateError(f"no {field}")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise TemplateError(f"{field} must be a whole number, not {value!r}")
    if value < 1:
        raise TemplateError(f"{field} must be at least 1, not {value}")
    return value


def _config_switch(config: Mapping[str, Any], field: str) -> bool:
    value = config.get(field, False)
    if not isinstance(value, bool):
        raise TemplateError(f"{field} must be true or false, not {value!r}")
    return value


def _config_dtype(config: Mapping[str, Any], given: str | None) -> str:
    if given is not None:
        if given not in MODEL_DTYPES.values():
            raise TemplateError(f"unknown dtype {given!r} (choose from {', '.join(sorted(set(MODEL_DTYPES.values())))})")
        return given
    field = "torch_dtype" if "torch_dtype" in config else "dtype"
    value = config.get(field)
    if value is None:
        raise TemplateError("no torch_dtype (or give the dtype: --dtype bf16)")
    name = str(value).removeprefix("torch.")
    if name not in MODEL_DTYPES:
        raise TemplateError(f"{field} {value!r} is not one the kernels take (bfloat16, float16; --dtype tunes another)")
    return MODEL_DTYPES[name]


@dataclass(frozen=True)
class LayerProblem:
    """A problem of a transformer layer that a family computes: ``role`` (what it computes, as
    ``qkv`` or ``down``) at ``tokens`` tokens, and ``problem``; or, where the family cannot take
    it, ``problem`` None, ``what`` it would be and ``skipped`` saying why in one line."""

    role: str
    tokens: int
    problem: Problem | None = None
    what: str = ""
    skipped: str = ""


# What the constraints assume when no GPU is visible (CPU-only compile and render checks).
H100_LIMITS = DeviceLimits(
    name="NVIDIA H100 80GB HBM3",
    compute_capability=(9, 0),
    sm_count=132,
    max_smem_per_block_optin=232448,
)


@dataclass(frozen=True)
class TensorMap:
    """A TMA tensor map over one buffer, as ``cuTensorMapEncodeTiled`` takes it: what a
    ``const __grid_constant__ CUtensorMap`` kernel parameter is made from on the host.

    ``dims`` run innermost first; ``strides`` are the byte strides of ``dims[1:]``; ``box`` is
    the tile one copy moves (elements per dimension). Elements outside ``dims`` read as zeros
    and are not written by stores. ``swizzle`` is 0, 32, 64 or 128 (bytes), ``l2_promotion``
    0, 64, 128 or 256 (bytes). Plain data: ``workers.tensormap`` encodes it over a pointer.
    """

    buffer: str
    element_bytes: int  # 1, 2, 4 or 8
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 128
    l2_promotion: int = 128

    def __post_init__(self) -> None:
        rank = len(self.dims)
        if not 1 <= rank <= 5 or len(self.strides) != rank - 1 or len(self.box) != rank:
            raise TemplateError(f"tensor map over {self.buffer!r}: {rank} dims need {rank - 1} "
                                f"strides and {rank} box sizes")
        if self.element_bytes not in (1, 2, 4, 8):
            raise TemplateError(f"tensor map over {self.buffer!r}: {self.element_bytes}-byte elements")
        if any(not 1 <= d <= 2**32 for d in self.dims) or any(s % 16 or s <= 0 for s in self.strides):
            raise TemplateError(f"tensor map over {self.buffer!r}: dims {self.dims} or byte strides "
                                f"{self.strides} out of range (strides must be multiples of 16)")
        if any(not 1 <= b <= 256 for b in self.box) or self.box[0] * self.element_bytes % 16:
            raise TemplateError(f"tensor map over {self.buffer!r}: box {self.box} out of range")
        if self.swizzle not in (0, 32, 64, 128) or self.l2_promotion not in (0, 64, 128, 256):
            raise TemplateError(f"tensor map over {self.buffer!r}: swizzle {self.swizzle} or L2 "
                                f"promotion {self.l2_promotion} not one of the encodable sizes")
        if self.swizzle and self.box[0] * self.element_bytes > self.swizzle:
            raise TemplateError(f"tensor map over {self.buffer!r}: a {self.swizzle}-byte swizzle "
                                f"takes at most {self.swizzle} bytes of the inner dimension per box")

    def to_json(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "element_bytes": self.element_bytes, "dims": list(self.dims),
                "strides": list(self.strides), "box": list(self.box), "swizzle": self.swizzle,
                "l2_promotion": self.l2_promotion}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TensorMap":
        return cls(str(data["buffer"]), int(data["element_bytes"]), tuple(int(d) for d in data["dims"]),
                   tuple(int(s) for s in data["strides"]), tuple(int(b) for b in data["box"]),
                   int(data.get("swizzle", 128)), int(data.get("l2_promotion", 128)))


ARG_KINDS = ("buffer", "i32", "f32", "tensormap")


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument: a named device buffer, a 32-bit scalar, or a TMA tensor map over a
    named buffer (``value`` a :class:`TensorMap`; passed by value, 128 bytes)."""

    kind: str  # one of ARG_KINDS
    value: Any

    def __post_init__(self) -> None:
        if self.kind not in ARG_KINDS:
            raise TemplateError(f"unknown kernel argument kind {self.kind!r}")
        if self.kind == "tensormap" and not isinstance(self.value, TensorMap):
            object.__setattr__(self, "value", TensorMap.from_json(self.value))

    def to_json(self) -> dict[str, Any]:
        value = self.value.to_json() if isinstance(self.value, TensorMap) else self.value
        return {"kind": self.kind, "value": value}


@dataclass(frozen=True)
class Launch:
    """How to launch a compiled module: one kernel, or several queued one after another on the
    same stream (a split-K reduction after the products, a combine step), timed as one run.

    ``then``: the kernels after this one, each a Launch of its own (grid, block, shared memory,
    arguments; their ``then`` and ``workspace`` unused). ``workspace``: device buffers the kernels
    share beside the inputs and outputs, (name, bytes) each, allocated for the trial and zeroed
    once (a kernel writes what a later one reads; a kernel that counts in one, a persistent
    kernel's tile counter, leaves it zero again for the next launch); a ``"buffer"`` argument
    names one.
    """

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    args: tuple[KernelArg, ...]
    then: tuple["Launch", ...] = ()
    workspace: tuple[tuple[str, int], ...] = ()
    # A persistent kernel: grid.x counts its work tiles, and the launch takes at most this many
    # blocks per multiprocessor of them (each block loops over tiles; any grid computes the same
    # outputs). 0: the grid as it is.
    blocks_per_sm_cap: int = 0

    def __post_init__(self) -> None:
        if any(step.then or step.workspace for step in self.then):
            raise TemplateError(f"launch of {self.kernel!r}: a later kernel has its own later kernels or workspace")
        if any(int(nbytes) <= 0 for _, nbytes in self.workspace):
            raise TemplateError(f"launch of {self.kernel!r}: a workspace buffer of no bytes")
        if self.blocks_per_sm_cap < 0:
            raise TemplateError(f"launch of {self.kernel!r}: a negative blocks-per-SM cap")

    def grid_on(self, sm_count: int) -> tuple[int, int, int]:
        """The grid to launch on a device of ``sm_count`` multiprocessors."""
        if not self.blocks_per_sm_cap:
            return self.grid
        return (max(1, min(self.grid[0], self.blocks_per_sm_cap * sm_count)), *self.grid[1:])

    @property
    def kernels(self) -> tuple["Launch", ...]:
        """This kernel and those after it, in launch order."""
        return (self, *self.then)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kernel": self.kernel,
            "grid": list(self.grid),
            "block": list(self.block),
            "dynamic_smem_bytes": self.smem_bytes,
            "args": [a.to_json() for a in self.args],
        }
        if self.then:
            data["then"] = [step.to_json() for step in self.then]
        if self.workspace:
            data["workspace"] = [{"buffer": name, "bytes": int(nbytes)} for name, nbytes in self.workspace]
        if self.blocks_per_sm_cap:
            data["grid_x_max_blocks_per_sm"] = self.blocks_per_sm_cap
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Launch":
        return cls(str(data["kernel"]), tuple(data["grid"]), tuple(data["block"]), int(data["dynamic_smem_bytes"]),
                   tuple(KernelArg(a["kind"], a["value"]) for a in data["args"]),
                   tuple(cls.from_json(step) for step in data.get("then", ())),
                   tuple((w["buffer"], int(w["bytes"])) for w in data.get("workspace", ())),
                   int(data.get("grid_x_max_blocks_per_sm", 0)))


@dataclass(frozen=True)
class PeerCall:
    """Another implementation of a family's problem, ready to time beside ours: ``run()`` queues
    it on torch's current stream and returns its output tensor (the family's first output).
    ``run`` None: it cannot run here, and ``note`` says why; otherwise ``note`` says what to know
    of it (a tuned config) and ``tune_seconds`` what its own tuning took."""

    run: Callable[[], Any] | None
    note: str = ""
    tune_seconds: float | None = None


def autotuned_peer(available: bool, tune: Callable[[], Any], run: Callable[[], Any], what: str = "") -> PeerCall:
    """A Triton peer that Triton's autotuner tunes before it is timed: ``tune()`` returns its
    choice (``config``, ``seconds``); where Triton is not installed, the reason instead."""
    if not available:
        return PeerCall(None, "Triton is not installed")
    tuned = tune()
    return PeerCall(run, f"{what}autotuned to {tuned.config}", tuned.seconds)


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
        if spec.element and spec.name in outputs:  # a peer's check gives only the first output
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
    # The problems' flags beyond shape and dtype (see Flag); a Problem carries each of them.
    flags: tuple[Flag, ...] = ()
    # (shape, dtype, flags) problems that `tuner bench FAMILY` compares against peers
    suite: tuple[tuple[tuple[int, ...], str, Mapping[str, Any]], ...] = ()
    # The files of the folder that decide the kernels rendered and how they are launched: the
    # template hash covers them and the space. Empty: every file. Inputs, reference and
    # starting points may then change without making a new version of the kernels.
    kernel_files: tuple[str, ...] = ()

    # -- problems ---------------------------------------------------------------------------
    @abc.abstractmethod
    def parse_problem(self, shape: str | Sequence[int], dtype: str,
                      flags: Mapping[str, Any] | None = None) -> Problem:
        """Validate a user's shape, dtype and flags and return a Problem, or raise TemplateError
        (``problem_flags`` checks the flags)."""

    def problem_flags(self, flags: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
        """``flags`` checked against the declared ones, every declared flag present (its default
        where not given), sorted by name: a Problem's ``flags``."""
        given = dict(flags or {})
        declared = {f.name: f for f in self.flags}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            known = ", ".join(declared) or "none"
            raise TemplateError(f"{self.name}: unknown problem flag {unknown[0]!r} (flags: {known})")
        values = {}
        for name, flag in declared.items():
            value = given.get(name, flag.choices[0])
            if flag.switch:
                value = _switch(value)
            match = [c for c in flag.choices if c == value and type(c) is type(value)] or \
                [c for c in flag.choices if not flag.switch and str(c) == str(value)]
            if not match:
                raise TemplateError(f"{self.name}: flag {name}={value!r} is not one of {list(flag.choices)}")
            values[name] = match[0]
        return tuple(sorted(values.items()))

    def problem_from_spec(self, spec: Mapping[str, Any]) -> Problem:
        """The Problem a stored or exported ``spec`` describes (checked like a user's)."""
        old = Problem.from_json(spec)
        return self.parse_problem(old.shape, old.dtype, dict(old.flags))

    def distance(self, a: Problem, b: Problem) -> float:
        """How far apart two problems are for warm start (the winner of the nearest is tried
        first); inf where one's winners say nothing of the other's. By default: the same dtype,
        flags and last dimension, then log2 distance in the second to last dimension plus in the
        product of the others."""
        if a.dtype != b.dtype or a.flags != b.flags or len(a.shape) != len(b.shape) or len(a.shape) < 2:
            return math.inf
        if a.shape[-1] != b.shape[-1]:
            return math.inf
        lead_a, lead_b = math.prod(a.shape[:-2]) or 1, math.prod(b.shape[:-2]) or 1
        return abs(math.log2(a.shape[-2] / b.shape[-2])) + abs(math.log2(lead_a / lead_b))

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

    def complete(self, params: Params) -> dict[str, Any]:
        """``params`` of an older version of the space (a landscape or a stored winner recorded
        before parameters were added) with each missing parameter at its first choice: a new
        parameter's first choice is what the kernels did before it existed. Unknown names stay
        (``validate_params`` refuses them)."""
        return {**{p.name: p.choices[0] for p in self.params if p.name not in params}, **params}

    def recorded_space(self, configs: Sequence[Params]) -> tuple[Param, ...]:
        """The space that ``configs`` (completed) span: each parameter with the choices they use, in
        the space's order. A replayed landscape, recorded before the space grew, is searched in
        it, so that every config the search proposes was recorded."""
        used: dict[str, set[str]] = {p.name: set() for p in self.params}
        for config in configs:
            for name, value in self.complete(config).items():
                if name in used:
                    used[name].add(repr(value))
        return tuple(Param(p.name, tuple(c for c in p.choices if repr(c) in used[p.name]) or p.choices[:1], p.doc)
                     for p in self.params)

    def valid_configs(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        return [c for c in self.configs() if self.check(c, problem, device) is None]

    def peers(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, PeerCall]:
        """Other implementations `tuner bench` times beside ours (a library's, a compiler's), on
        torch tensors made from ``inputs`` (the family's own). None by default."""
        return {}

    def prepare_peers(self, problems: Sequence[Problem]) -> None:
        """Work the peers would do on first use of each problem, done for all at once before
        `tuner bench` times them (compiling, say). Nothing by default."""

    def layer_problems(self, model: ModelShape, tokens: Sequence[int]) -> list[LayerProblem]:
        """The problems of one transformer layer of ``model`` this family computes, for each
        token count (`tuner tune-model`); a problem it cannot take listed as skipped, with why.
        None by default."""
        return []

    def starting_points(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        """Configs a kernel engineer would try first (a study measures them before the sampler's
        proposals, like Triton's config list); only those ``check`` accepts. None by default."""
        return []

    def validate_params(self, params: Params) -> None:
        known = self._choices()
        for name, value in params.items():
            choices = known.get(name)
            if choices is None:
                raise TemplateError(f"{self.name}: unknown parameter {name!r}")
            if value not in choices:
                raise TemplateError(f"{self.name}: {name}={value!r} is not one of {list(choices)}")
        if len(params) != len(known):  # every name given is known: some are missing
            raise TemplateError(f"{self.name}: missing parameters {[n for n in known if n not in params]}")

    def _choices(self) -> dict[str, tuple[Any, ...]]:
        """Each parameter's choices by name, made once for the family's ``params`` (``check``
        reads them for every config of a whole product: millions)."""
        cached = self.__dict__.get("_choices_of")
        if cached is None or cached[0] is not self.params:
            cached = (self.params, {p.name: p.choices for p in self.params})
            self.__dict__["_choices_of"] = cached
        return cached[1]

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
        """Hash of the ``kernel_files`` (every file of the folder when none are named; of a Python
        file its code, not its comments or docstrings: ``templates.versions``) and of the space: a
        new one is a new version of the kernels."""
        digest = hashlib.sha256()
        paths = [self.folder / name for name in self.kernel_files] or [
            p for p in sorted(self.folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
        for path in paths:
            if not path.is_file():
                raise TemplateError(f"{self.name}: kernel file {path.name!r} is not in {self.folder}")
            digest.update(path.relative_to(self.folder).as_posix().encode())
            digest.update(versioned_bytes(path))
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

    def input_shapes(self, problem: Problem) -> dict[str, tuple[tuple[int, ...], str]]:
        """Each input buffer's shape and element type (a FLOAT_FORMATS key, or a numpy dtype's
        name), in the order the kernel takes them: what a deployed kernel checks its callers'
        tensors against. By default read off ``inputs`` (which fills them: override it where that
        is costly); 16-bit raw bits count as the problem's dtype."""
        found = {}
        for name, values in self.inputs(problem, 0).items():
            element = np.dtype(values.dtype)
            kind = problem.dtype if element == np.uint16 else \
                {"float16": "fp16", "float32": "fp32"}.get(element.name, element.name)
            found[name] = (tuple(int(n) for n in values.shape), kind)
        return found

    # -- deployment (C++ dispatch header) ---------------------------------------------------------
    # The family's C++ for `tuner export-dispatch`: a Jinja file of its folder (see
    # tuner/answers/dispatch.py for what it defines). Empty: the family has no C++ dispatch.
    dispatch_file: str = ""
    # The family's torch op for `tuner export-torch`: a Jinja file of its folder, rendered with
    # ``name`` (the package's, its ops' namespace) and ``family``, and placed in the package's
    # __init__.py (tuner/answers/torch_package.py.j2, whose names it uses: choose, kernel_for,
    # Choice, ...). It defines the op (torch.library.custom_op with a fake), OPS and OP_NAMES, and
    # sets ``usage``, the example the package's docstring shows. Empty: no torch op.
    torch_op_file: str = ""

    def dispatch_variant(self, problem: Problem) -> int:
        """Which source variant of a config ``problem`` needs, among the problems of its dtype and
        flags: what the source depends on beyond them (the family's C++ ``variant`` says the same
        at run time). 0 by default: the source depends on dtype and flags only."""
        return 0

    def dispatch_variants(self, problem: Problem) -> dict[int, Problem]:
        """A problem for each variant (``dispatch_variant``) that the problems at a finite
        ``distance`` of ``problem`` need: a dispatch table renders its winner once for each, since
        that winner serves those problems. By default ``problem``'s own."""
        return {self.dispatch_variant(problem): problem}

    def export_refusal(self, problem: Problem) -> str | None:
        """Why neither the C++ dispatch nor the torch op can take ``problem`` (one line), or None:
        by default every problem is exported."""
        return None

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
