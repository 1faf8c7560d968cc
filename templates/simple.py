"""A kernel family in a few lines: a decorator over its reference function::

    from templates.simple import kernel_family, torch

    @kernel_family("softmax.cu.j2", shape="R, C", dtypes=("fp16", "bf16"),
                   params=dict(THREADS=(256, 128, 512, 1024), VEC=(8, 4, 2, 1)),
                   constraints=lambda p, s, device: None if s.C % p.VEC == 0 else "divisibility",
                   inputs=dict(x="R, C"), outputs=dict(y="R, C"), args="y, x, R, C",
                   grid=lambda p, s: s.R, block=lambda p, s: p.THREADS)
    def row_softmax(x):
        return torch.softmax(x, dim=-1)

The result is a :class:`SimpleFamily`, a :class:`~templates.family.KernelFamily` like any other:
``tuner tune docs/examples/row_softmax --shape 4096,1000 --dtype fp16`` finds it by its folder.
What every family would otherwise write by hand comes with it: the problem parsed from named
dimensions, inputs drawn by torch from their shapes (standard normal, never zeros), outputs
poisoned with NaN and their unwritten or non-finite elements counted, the relative error against
the reference with a tolerance per dtype, peers run on the same inputs, and the launch checked
against the device's limits. torch is imported only where tensors are made (``templates.tensors``).
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import jinja2
import numpy as np

from templates.family import (
    BufferSpec, DeviceLimits, Flag, KernelArg, KernelFamily, Launch, Param, PeerCall, Problem, TemplateError,
    Validation,
)

ELEMENTS = {"fp16": (np.uint16, 0x7E00, "__half"), "bf16": (np.uint16, 0x7FC0, "__nv_bfloat16"),
            "fp32": (np.float32, 0x7FC0, "float")}  # host dtype, NaN poison (16 bits), C type
TOLERANCE = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-5}  # relative error: a few output roundings
GRID_MAX = (2**31 - 1, 65535, 65535)
BLOCK_MAX = (1024, 1024, 64)


class FamilyError(TemplateError):
    """A family defined wrongly: ``file: field: what``, one line."""


class LazyModule:
    """A module imported on first attribute access: ``torch.softmax`` in a family's reference
    imports torch in the process that runs it, never in one that only searches."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self._name), attr)


torch = LazyModule("torch")


class Values(Mapping[str, Any]):
    """A config or a problem read by attribute: ``p.VEC``, ``s.C``, ``s.dtype`` (and as a mapping)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.__dict__["_data"] = dict(data)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(f"no {name!r} (there are {', '.join(self._data)})") from None

    def __getitem__(self, name: str) -> Any:
        return self._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._data.items())


@dataclass(frozen=True)
class Buffer:
    """An input or output: its shape as expressions of the dimensions (``"T, 2 * N"``), its
    element type (None: the problem's), and for an input ``init``, a function from a standard
    normal float32 tensor of that shape to its values (``lambda t: t.abs() + 0.5``)."""

    shape: str
    dtype: str | None = None
    init: Callable[[Any], Any] | None = None


class SimpleFamily(KernelFamily):
    """A family given as data and small functions (see the module's docstring and
    docs/FAMILIES.md); made by :func:`kernel_family`."""

    def __init__(self, template: str, *, reference: Callable[..., Any], shape: str,
                 params: Mapping[str, Sequence[Any]], inputs: Mapping[str, str | Buffer],
                 outputs: Mapping[str, str | Buffer], args: str | Sequence[Any],
                 grid: Callable[[Values, Values], Any], block: Callable[[Values, Values], Any],
                 smem: Callable[[Values, Values], int] | int = 0, dtypes: Sequence[str] = ("fp16", "bf16"),
                 flags: Mapping[str, Sequence[Any]] | None = None,
                 constraints: Callable[[Values, Values, DeviceLimits], str | None] | None = None,
                 flops: Callable[[Values], float] | None = None, bytes: Callable[[Values], int] | None = None,
                 peers: Mapping[str, Callable[..., Any]] | None = None,
                 tolerance: Mapping[str, float] | None = None, suite: Sequence[Sequence[Any]] = (),
                 starting_points: Sequence[Mapping[str, Any]] = (), options: Sequence[str] = ("-O3",),
                 kernel: str | None = None, name: str | None = None,
                 kernel_files: Sequence[str] = ()) -> None:
        if not callable(reference):
            raise FamilyError("<family>: reference: missing (decorate the reference function)")
        self.file = Path(inspect.getfile(reference)).resolve()
        self.folder = self.file.parent
        self.name = name or reference.__name__
        self.template = template
        self.reference_fn = reference
        self.dims = tuple(d.strip() for d in shape.split(",") if d.strip())
        self.dtypes = tuple(dtypes)
        self.flags = tuple(Flag(n, tuple(c)) for n, c in (flags or {}).items())
        self.params = tuple(self._param(n, c) for n, c in params.items())
        self.kernel = kernel or self.name
        self.geometry = {"grid": grid, "block": block, "smem": smem}
        self.constraints, self.flops_fn, self.bytes_fn = constraints, flops, bytes
        self.peer_fns = dict(peers or {})
        self.tolerance = {**TOLERANCE, **(tolerance or {})}
        self.options, self.kernel_files = tuple(options), tuple(kernel_files)
        self.inputs_, self.outputs_ = self._buffers("inputs", inputs), self._buffers("outputs", outputs)
        self.args = self._args(args)
        self.suite = tuple(self._suite_entry(entry) for entry in suite)
        self.starts = [dict(p) for p in starting_points]
        self._environment: jinja2.Environment | None = None
        for field, value in (("dtypes", self.dtypes), ("shape", self.dims)):
            if not value:
                raise self.error(field, "none given")
        unknown = [d for d in self.dtypes if d not in ELEMENTS]
        if unknown:
            raise self.error("dtypes", f"{unknown[0]!r} is not one of {', '.join(ELEMENTS)}")

    # -- definition checks ----------------------------------------------------------------------
    def error(self, field: str, what: str) -> FamilyError:
        """The one-line error of a field of this family's definition."""
        return FamilyError(f"{self.file}: {field}: {what}")

    def _param(self, name: str, choices: Sequence[Any]) -> Param:
        if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not choices:
            raise self.error("params", f"{name!r} has no choices (give a non-empty tuple, the default first)")
        return Param(name, tuple(choices))

    def _names(self, field: str, expression: str, known: Sequence[str]) -> Any:
        try:
            code = compile(expression, f"<{field}>", "eval")
        except SyntaxError:
            raise self.error(field, f"{expression!r} is not an expression") from None
        stray = [n for n in code.co_names if n not in known]
        if stray:
            raise self.error(field, f"{expression!r} names {stray[0]!r}, not one of {', '.join(known)}")
        return code

    def _buffers(self, field: str, given: Mapping[str, str | Buffer]) -> dict[str, tuple[Buffer, list[Any]]]:
        found = {}
        for name, buffer in given.items():
            buffer = Buffer(buffer) if isinstance(buffer, str) else buffer
            if buffer.dtype is not None and buffer.dtype not in ELEMENTS:
                raise self.error(field, f"{name!r}: dtype {buffer.dtype!r} is not one of {', '.join(ELEMENTS)}")
            known = [*self.dims, *(f.name for f in self.flags)]
            found[name] = (buffer, [self._names(field, e.strip(), known) for e in buffer.shape.split(",")])
        if not found:
            raise self.error(field, "none given")
        return found

    def _args(self, args: str | Sequence[Any]) -> list[tuple[str, Any]]:
        items = [a.strip() for a in args.split(",")] if isinstance(args, str) else list(args)
        buffers = {**self.inputs_, **self.outputs_}
        known = [*self.dims, *(f.name for f in self.flags), *(p.name for p in self.params)]
        parsed: list[tuple[str, Any]] = []
        for item in items:
            if isinstance(item, str) and item in buffers:
                parsed.append(("buffer", item))
            elif isinstance(item, str):
                parsed.append(("value", self._names("args", item, known)))
            elif isinstance(item, (int, float)):
                parsed.append(("const", item))
            else:
                raise self.error("args", f"{item!r} is not a buffer name, an expression or a number")
        used = {value for kind, value in parsed if kind == "buffer"}
        for field, names in (("outputs", self.outputs_), ("inputs", self.inputs_)):
            missing = [n for n in names if n not in used]
            if missing:
                raise self.error("args", f"{field[:-1]} {missing[0]!r} is not among the kernel's arguments")
        return parsed

    def _suite_entry(self, entry: Sequence[Any]) -> tuple[tuple[int, ...], str, Mapping[str, Any]]:
        try:
            shape, dtype, *flags = entry
            problem = self.parse_problem(shape, dtype, flags[0] if flags else None)
        except (TemplateError, ValueError, TypeError) as exc:
            raise self.error("suite", f"{entry!r}: {exc}") from None
        return problem.shape, problem.dtype, dict(problem.flags)

    # -- problems -------------------------------------------------------------------------------
    def parse_problem(self, shape: str | Sequence[int], dtype: str,
                      flags: Mapping[str, Any] | None = None) -> Problem:
        expected = ",".join(self.dims)
        try:
            dims = tuple(int(d) for d in (shape.split(",") if isinstance(shape, str) else shape))
        except (ValueError, TypeError):
            raise TemplateError(f"malformed shape {shape!r}: expected {expected}") from None
        if len(dims) != len(self.dims) or min(dims) < 1:
            raise TemplateError(f"malformed shape {shape!r}: expected {len(self.dims)} positive numbers {expected}")
        if dtype not in self.dtypes:
            raise TemplateError(f"unsupported dtype {dtype!r}: {self.name} takes {', '.join(self.dtypes)}")
        return Problem(dims, dtype, self.problem_flags(flags))

    def sizes(self, problem: Problem) -> Values:
        """The problem by name: its dimensions, its flags and ``dtype``."""
        return Values({**dict(zip(self.dims, problem.shape)), **dict(problem.flags), "dtype": problem.dtype})

    def buffer_shape(self, name: str, problem: Problem) -> tuple[int, ...]:
        _, codes = {**self.inputs_, **self.outputs_}[name]
        scope = dict(self.sizes(problem))
        return tuple(int(eval(code, {"__builtins__": {}}, scope)) for code in codes)

    def buffer_dtype(self, name: str, problem: Problem) -> str:
        return {**self.inputs_, **self.outputs_}[name][0].dtype or problem.dtype

    def _nbytes(self, name: str, problem: Problem) -> int:
        return math.prod(self.buffer_shape(name, problem)) * np.dtype(ELEMENTS[self.buffer_dtype(name, problem)][0]).itemsize

    def flops(self, problem: Problem) -> float:
        return float(self.flops_fn(self.sizes(problem))) if self.flops_fn else 0.0

    def min_bytes(self, problem: Problem) -> int:
        if self.bytes_fn:
            return int(self.bytes_fn(self.sizes(problem)))
        return sum(self._nbytes(n, problem) for n in (*self.inputs_, *self.outputs_))

    # -- the space ------------------------------------------------------------------------------
    def _call(self, field: str, fn: Any, *args: Any) -> Any:
        """A function of the definition called; what it raises is one line naming the field."""
        try:
            return fn(*args) if callable(fn) else fn
        except Exception as exc:  # noqa: BLE001 - the family's own bug, told as one line
            raise self.error(field, f"{type(exc).__name__}: {exc}") from None

    def check(self, params: Mapping[str, Any], problem: Problem, device: DeviceLimits) -> str | None:
        self.validate_params(params)
        p, s = Values(params), self.sizes(problem)
        if self.constraints is not None:
            reason = self._call("constraints", self.constraints, p, s, device)
            if reason:
                return str(reason)
        launch = self.launch(params, problem)
        threads = math.prod(launch.block)
        if threads > device.max_threads_per_block or any(b > m for b, m in zip(launch.block, BLOCK_MAX)):
            return f"threads: a block of {'x'.join(map(str, launch.block))} > {device.max_threads_per_block}"
        if min(launch.block) < 1 or min(launch.grid) < 1 or any(g > m for g, m in zip(launch.grid, GRID_MAX)):
            return f"grid: {launch.grid} blocks of {launch.block} threads is outside the device's limits"
        if launch.smem_bytes > device.max_smem_per_block_optin:
            return f"shared memory: {launch.smem_bytes} bytes > {device.max_smem_per_block_optin}"
        return None

    def starting_points(self, problem: Problem, device: DeviceLimits) -> list[dict[str, Any]]:
        return [self.complete(p) for p in self.starts if self.check(self.complete(p), problem, device) is None]

    # -- code -----------------------------------------------------------------------------------
    def render(self, params: Mapping[str, Any], problem: Problem) -> str:
        self.validate_params(params)
        s = self.sizes(problem)
        values = {**s, **params, "elem": ELEMENTS[problem.dtype][2], "kernel": self.kernel}
        path = self.folder / self.template
        try:
            if not self.template.endswith(".j2"):
                return with_defines(path.read_text(), params)
            return self.environment().get_template(self.template).render(**values)
        except OSError as exc:
            raise self.error("template", f"cannot read {path}: {exc.strerror or exc}") from None
        except jinja2.TemplateNotFound as exc:
            raise self.error("template", f"{exc} is not in {self.folder}") from None
        except jinja2.TemplateError as exc:
            where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
            raise FamilyError(f"{path}: template{where}: {exc.message or exc}") from None

    def environment(self) -> jinja2.Environment:
        if self._environment is None:
            self._environment = jinja2.Environment(
                loader=jinja2.FileSystemLoader(self.folder), undefined=jinja2.StrictUndefined,
                keep_trailing_newline=True, block_start_string="/*%", block_end_string="%*/",
                comment_start_string="/*#", comment_end_string="#*/")
        return self._environment

    def __getstate__(self) -> dict[str, Any]:  # shipped by value: the environment is made again
        return {**self.__dict__, "_environment": None}

    def launch(self, params: Mapping[str, Any], problem: Problem) -> Launch:
        p, s = Values(params), self.sizes(problem)
        grid, block = (dim3(self._call(f, self.geometry[f], p, s), f, self) for f in ("grid", "block"))
        smem = int(self._call("smem", self.geometry["smem"], p, s) or 0)
        scope = {**s, **params}
        args = []
        for kind, value in self.args:
            if kind == "value":
                value = self._call("args", eval, value, {"__builtins__": {}}, scope)
            if kind == "buffer":
                args.append(KernelArg("buffer", value))
            else:
                args.append(KernelArg("f32" if isinstance(value, float) else "i32", value))
        return Launch(self.kernel, grid, block, smem, tuple(args))

    def compile_options(self, params: Mapping[str, Any], problem: Problem) -> tuple[str, ...]:
        return self.options

    # -- data (torch, in templates.tensors) -----------------------------------------------------
    def inputs(self, problem: Problem, seed: int) -> dict[str, np.ndarray]:
        from templates import tensors

        return tensors.make_inputs(self, problem, seed)

    def input_shapes(self, problem: Problem) -> dict[str, tuple[tuple[int, ...], str]]:
        return {n: (self.buffer_shape(n, problem), self.buffer_dtype(n, problem)) for n in self.inputs_}

    def outputs(self, problem: Problem) -> tuple[BufferSpec, ...]:
        specs = []
        for name in self.outputs_:
            dtype = self.buffer_dtype(name, problem)
            host, poison, _ = ELEMENTS[dtype]
            specs.append(BufferSpec(name, self.buffer_shape(name, problem), np.dtype(host), poison, element=dtype))
        return tuple(specs)

    def reference(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> Any:
        from templates import tensors

        return tensors.Reference()

    def validate(self, problem: Problem, inputs: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray],
                 reference: Any = None) -> Validation:
        from templates import tensors

        return tensors.validate(self, problem, inputs, outputs, reference)

    def peers(self, problem: Problem, inputs: Mapping[str, np.ndarray]) -> dict[str, PeerCall]:
        from templates import tensors

        return tensors.peer_calls(self, problem, inputs) if self.peer_fns else {}


def kernel_family(template: str, **definition: Any) -> Callable[[Callable[..., Any]], SimpleFamily]:
    """Decorate a family's reference function (torch tensors in, the outputs' values out) to
    make the family; the function's name is the family's and the kernel's (``extern "C"``), its
    folder the template's. The keywords are :class:`SimpleFamily`'s (docs/FAMILIES.md)."""

    def make(reference: Callable[..., Any]) -> SimpleFamily:
        return SimpleFamily(template, reference=reference, **definition)

    return make


def dim3(value: Any, field: str, family: SimpleFamily) -> tuple[int, int, int]:
    """A grid or block given as a number or up to three: three numbers."""
    dims = tuple(int(v) for v in (value if isinstance(value, (tuple, list)) else (value,)))
    if not 1 <= len(dims) <= 3:
        raise family.error(field, f"{value!r} is not one to three numbers")
    return dims + (1,) * (3 - len(dims))  # type: ignore[return-value]


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\b(?!\()[^\n]*$", re.MULTILINE)


def with_defines(source: str, params: Mapping[str, Any]) -> str:
    """A plain CUDA file with its ``#define NAME value`` of each parameter set to the config's;
    a parameter it does not define is defined at the top."""
    defined = set()

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in params:
            return match.group(0)
        defined.add(name)
        return f"#define {name} {c_value(params[name])}"

    body = _DEFINE.sub(replace, source)
    head = "".join(f"#define {n} {c_value(v)}\n" for n, v in params.items() if n not in defined)
    return head + body


def c_value(value: Any) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)
