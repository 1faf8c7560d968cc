"""The torch side of a :class:`~templates.simple.SimpleFamily`: its inputs drawn, its reference
run and its outputs compared, on the GPU where torch sees one, else on the CPU.

    inputs = make_inputs(family, problem, seed)        # host arrays (16-bit elements as raw bits)
    check = validate(family, problem, inputs, outputs, Reference())

torch is imported here only, and only when called: a coordinator that searches never needs it.
A GPU worker hands ``validate`` its outputs in device memory (``workers.resident.DeviceArray``):
they are read in place as torch tensors (``__cuda_array_interface__``), and the reference is
computed once on that device, so a check of a million rows moves nothing to the host.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Mapping

import numpy as np

from templates.family import PeerCall, Problem, TemplateError, Validation

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
# The reference runs in float64 up to this many elements of inputs and outputs, in float32 beyond.
FLOAT64_ELEMENTS = 1 << 27
# No row (the last dimension) may be further off than this many times the tolerance: a wrong row
# among a million would hide in the whole output's relative error.
ROW_FACTOR = 4.0
TORCH_MISSING = "the short family form needs torch here: pip install 'kernel-tuner-service[torch]'"


def torch_module() -> Any:
    try:
        import torch
    except ImportError:
        raise TemplateError(TORCH_MISSING) from None
    return torch


def make_inputs(family: Any, problem: Problem, seed: int) -> dict[str, np.ndarray]:
    """Each input drawn standard normal in float32 (on the GPU when there is one), passed
    through its ``init``, rounded to its element type; host arrays, raw bits for 16-bit ones."""
    torch = torch_module()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device)
    generator.manual_seed(int(seed))
    drawn = {}
    for name, (buffer, _) in family.inputs_.items():
        shape = family.buffer_shape(name, problem)
        values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        if buffer.init is not None:
            values = family._call("inputs", buffer.init, values)
            if tuple(values.shape) != shape:
                raise family.error("inputs", f"init of {name!r} gave shape {tuple(values.shape)}, not {shape}")
        dtype = family.buffer_dtype(name, problem)
        drawn[name] = to_host(values.to(getattr(torch, TORCH_DTYPES[dtype])))
    return drawn


def to_host(tensor: Any) -> np.ndarray:
    """A tensor's elements on the host: raw bits (uint16) for 16-bit floats."""
    torch = torch_module()
    tensor = tensor.detach().contiguous().cpu()
    if tensor.element_size() == 2:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def from_host(array: Any, dtype: str, device: Any = "cpu") -> Any:
    """Host elements (raw bits for 16-bit floats) as a tensor of ``dtype`` on ``device``."""
    torch = torch_module()
    array = np.ascontiguousarray(array)
    if array.dtype.itemsize == 2:
        array = array.view(np.int16)
    return torch.from_numpy(array).view(getattr(torch, TORCH_DTYPES[dtype])).to(device)


class _Interface:
    """A device array (``ptr``, ``shape``, ``dtype``) as ``__cuda_array_interface__`` offers it."""

    def __init__(self, array: Any) -> None:
        typestr = "<i2" if np.dtype(array.dtype).itemsize == 2 else np.dtype(array.dtype).str
        self.__cuda_array_interface__ = {"shape": tuple(array.shape), "typestr": typestr,
                                         "data": (int(array.ptr), False), "version": 3, "strides": None}


def output_tensor(torch: Any, array: Any, dtype: str) -> Any:
    """An output as a tensor of its dtype: read in place on the GPU, or from host elements."""
    if hasattr(array, "ptr"):  # device memory
        tensor = torch.as_tensor(_Interface(array))  # on the device the pointer is on
        return tensor.view(getattr(torch, TORCH_DTYPES[dtype])) if tensor.element_size() == 2 else tensor
    return from_host(array, dtype)


class Reference:
    """The reference outputs, computed on first use on the device the outputs are on and kept
    there for the later checks of the same inputs (a GPU worker keeps one per problem)."""

    def __init__(self) -> None:
        self.device: Any = None
        self.values: dict[str, Any] = {}

    def on(self, family: Any, problem: Problem, inputs: Mapping[str, Any], device: Any) -> dict[str, Any]:
        if self.device != device or not self.values:
            self.values, self.device = run_reference(family, problem, inputs, device), device
        return self.values


def bind(fn: Callable[..., Any], tensors: Mapping[str, Any], sizes: Mapping[str, Any]) -> Callable[[], Any]:
    """``fn`` called with the inputs and sizes its parameters name (all of them for ``**kw``)."""
    available = {**sizes, **tensors}
    signature = inspect.signature(fn)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return lambda: fn(**available)
    missing = [n for n in signature.parameters if n not in available]
    if missing:
        raise TemplateError(f"its parameter {missing[0]!r} is not an input or a size "
                            f"({', '.join(available)})")
    return lambda: fn(**{n: available[n] for n in signature.parameters})


def outputs_of(family: Any, problem: Problem, result: Any, field: str) -> dict[str, Any]:
    """What a reference or a peer returned as {output name: tensor}: one tensor, a tuple in the
    outputs' order, or a dict by name; shapes checked."""
    names = list(family.outputs_)
    if isinstance(result, Mapping):
        values = dict(result)
    elif isinstance(result, (tuple, list)):
        values = dict(zip(names, result))
    else:
        values = {names[0]: result}
    for name in (names if field == "reference" else names[:1]):
        shape = family.buffer_shape(name, problem)
        value = values.get(name)
        if not hasattr(value, "shape"):
            raise family.error(field, f"returned {type(value).__name__} for output {name!r}, not a tensor")
        if tuple(value.shape) != shape:
            raise family.error(field, f"returned shape {tuple(value.shape)} for output {name!r}, not {shape}")
    return values


def run_reference(family: Any, problem: Problem, inputs: Mapping[str, Any], device: Any) -> dict[str, Any]:
    """The reference function on the inputs (float64, or float32 for large problems), on ``device``."""
    torch = torch_module()
    names = [*family.inputs_, *family.outputs_]
    elements = sum(math.prod(family.buffer_shape(n, problem)) for n in names)
    work = torch.float64 if elements <= FLOAT64_ELEMENTS else torch.float32
    tensors = {n: from_host(inputs[n], family.buffer_dtype(n, problem), device).to(work) for n in family.inputs_}
    try:
        call = bind(family.reference_fn, tensors, family.sizes(problem))
    except TemplateError as exc:
        raise family.error("reference", str(exc)) from None
    with torch.no_grad():
        values = outputs_of(family, problem, family._call("reference", call), "reference")
    return {name: values[name].to(device=device, dtype=work) for name in family.outputs_}


def validate(family: Any, problem: Problem, inputs: Mapping[str, Any], outputs: Mapping[str, Any],
             reference: Any = None) -> Validation:
    """Each output given against the reference: the relative error of the whole output, then
    of its worst row; the tolerance is the output dtype's (``family.tolerance``)."""
    torch = torch_module()
    got = {name: output_tensor(torch, outputs[name], family.buffer_dtype(name, problem))
           for name in family.outputs_ if name in outputs}
    device = next(iter(got.values())).device
    expected = (reference if isinstance(reference, Reference) else Reference()).on(family, problem, inputs, device)
    error = max_abs = 0.0
    for name, tensor in got.items():
        want = expected[name]
        diff = tensor.to(want.dtype) - want
        scale = float(torch.linalg.vector_norm(want))
        this = float(torch.linalg.vector_norm(diff)) / (scale or 1.0)
        error, max_abs = max(error, this), max(max_abs, float(diff.abs().max()))
        tolerance = family.tolerance[family.buffer_dtype(name, problem)]
        if not this <= tolerance:
            return Validation(False, this, max_abs, f"relative error {this:.2e} of {name!r} > {tolerance:.2g}")
        last = want.shape[-1] if want.dim() else 1
        rows = torch.linalg.vector_norm(diff.reshape(-1, last), dim=1) / \
            torch.linalg.vector_norm(want.reshape(-1, last), dim=1).clamp_min(1e-30)
        worst = int(torch.argmax(rows))
        if not float(rows[worst]) <= ROW_FACTOR * tolerance:
            return Validation(False, this, max_abs, f"row {worst} of {name!r}: relative error "
                              f"{float(rows[worst]):.2e} > {ROW_FACTOR * tolerance:.2g}")
    return Validation(True, error, max_abs)


def peer_calls(family: Any, problem: Problem, inputs: Mapping[str, Any]) -> dict[str, PeerCall]:
    """The family's peers on GPU tensors of the inputs (in their own types); each call returns
    the first output."""
    torch = torch_module()
    if not torch.cuda.is_available():
        return {name: PeerCall(None, "no GPU visible to torch") for name in family.peer_fns}
    tensors = {n: from_host(inputs[n], family.buffer_dtype(n, problem), "cuda") for n in family.inputs_}
    first = next(iter(family.outputs_))
    calls = {}
    for name, fn in family.peer_fns.items():
        try:
            call = bind(fn, tensors, family.sizes(problem))
        except TemplateError as exc:
            raise family.error("peers", f"{name}: {exc}") from None
        calls[name] = PeerCall(lambda call=call: _first(call(), first))
    return calls


def _first(result: Any, name: str) -> Any:
    if isinstance(result, Mapping):
        return result[name]
    return result[0] if isinstance(result, (tuple, list)) else result
