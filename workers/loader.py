"""Run an exported kernel (``tuner export``'s ``.cu`` and ``.launch.json``) on torch tensors::

    from workers.loader import load
    kernel = load("out/attention_4x16x4096x128-fp16-causal")   # the stem, the .cu or the .launch.json
    o = kernel(q, k, v)            # or kernel(q, k, v, o), or kernel(q=q, k=k, v=v, o=o)

Nothing of the tuner's search, Ray or a database is imported: the launch file says everything
(kernel, grid, block, shared memory, arguments, tensor maps, workspace, the tensors it takes). The
first call on a device compiles the source (``workers.compile.compile_cubin``: NVRTC or nvcc, as
the tuner compiled it, cached by source hash in the tuner's compile cache), loads it in the
device's primary context (torch's), allocates and zeroes the workspace; every call encodes the
TMA tensor maps over the tensors' pointers, caps a persistent grid at the device's SMs and
launches on torch's current stream. Outputs not given are allocated (``torch.empty``) and
returned. Tensors of another shape, dtype or device, or not contiguous, are refused with one
:class:`KernelArgumentError` line: the kernel serves the exported problem only (the C++ dispatch
header, ``tuner export-dispatch``, serves other shapes).
"""

from __future__ import annotations

import ctypes
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from templates.family import Launch, TensorMap
from workers.errors import WorkerError

TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
_DEFAULT_DYNAMIC_SMEM = 48 * 1024


class LoadError(WorkerError, ValueError):
    """An export that cannot be read (missing file, not an export); one line."""


class KernelArgumentError(WorkerError, ValueError):
    """Tensors that the exported kernel cannot take (shape, dtype, device, layout); one line."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # fp16, bf16, fp32, or a torch dtype's name
    output: bool


@dataclass
class _OnDevice:
    """What a kernel holds on one device: its module, functions and workspace."""

    context: Any  # the device's primary context (torch's)
    module: Any
    functions: list[Any]
    workspace: dict[str, Any]  # name -> torch uint8 tensor (zeroed once)
    sm_count: int


@dataclass
class ExportedKernel:
    """A loaded export: call it on tensors (see the module's docstring)."""

    name: str  # the export's stem, e.g. attention_4x16x4096x128-fp16-causal
    source: str
    arch: str
    options: tuple[str, ...]
    launch: Launch
    tensors: tuple[TensorSpec, ...]
    document: dict[str, Any]
    cache_dir: Path | None = None
    _devices: dict[int, _OnDevice] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if not t.output)

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if t.output)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        bound = self.bind(args, kwargs)
        device = next(iter(bound.values())).device
        with torch.cuda.device(device):
            for spec in self.outputs:
                if spec.name not in bound:
                    bound[spec.name] = torch.empty(spec.shape, dtype=_torch_dtype(spec.dtype), device=device)
            state = self._on(device.index)
            self._queue(state, bound, torch.cuda.current_stream(device).cuda_stream)
        outs = tuple(bound[spec.name] for spec in self.outputs)
        return outs[0] if len(outs) == 1 else outs

    # -- the checks ------------------------------------------------------------------------------
    def bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The tensors by name, checked (KernelArgumentError otherwise): inputs then outputs, in
        order or by name; outputs may be left out."""
        names = [t.name for t in self.tensors]
        if len(args) > len(names):
            raise KernelArgumentError(f"{self.name}: {len(args)} tensors given, it takes {len(names)} "
                                      f"({', '.join(names)})")
        bound = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                raise KernelArgumentError(f"{self.name}: no tensor named {key!r} (it takes {', '.join(names)})")
            if key in bound:
                raise KernelArgumentError(f"{self.name}: tensor {key!r} given twice")
            bound[key] = value
        missing = [t.name for t in self.inputs if t.name not in bound]
        if missing:
            raise KernelArgumentError(f"{self.name}: missing input{'s' if len(missing) > 1 else ''} "
                                      f"{', '.join(missing)} (it takes {', '.join(names)})")
        device = None
        for spec in self.tensors:
            if spec.name not in bound:
                continue
            tensor = bound[spec.name]
            problem = _refusal(spec, tensor)
            if problem is None and device is not None and tensor.device != device:
                problem = f"on {tensor.device}, the other tensors on {device}"
            if problem is not None:
                raise KernelArgumentError(
                    f"{self.name}: {spec.name} must be a contiguous {spec.dtype} CUDA tensor of shape "
                    f"{list(spec.shape)}: {problem}")
            device = tensor.device
        return {spec.name: bound[spec.name] for spec in self.tensors if spec.name in bound}

    # -- the GPU ---------------------------------------------------------------------------------
    def _on(self, index: int) -> _OnDevice:
        with self._lock:
            if index not in self._devices:
                self._devices[index] = self._load(index)
            return self._devices[index]

    def _load(self, index: int) -> _OnDevice:
        import torch

        from workers.compile import compile_cubin, default_cache_dir
        from workers.driver import check_call, driver_api
        from workers.results import CompileRequest

        d = driver_api()
        props = torch.cuda.get_device_properties(index)
        capability = f"sm_{props.major}{props.minor}"
        if self.arch.rstrip("a") != capability:
            raise KernelArgumentError(f"{self.name}: compiled for {self.arch}, the tensors are on "
                                      f"{props.name} ({capability})")
        check_call("cuInit", d.cuInit(0))
        context = check_call("cuDevicePrimaryCtxRetain",
                             d.cuDevicePrimaryCtxRetain(check_call("cuDeviceGet", d.cuDeviceGet(index))))
        check_call("cuCtxSetCurrent", d.cuCtxSetCurrent(context))
        binary = compile_cubin(CompileRequest(self.source, self.launch.kernel, self.options, self.arch),
                               cache_dir=self.cache_dir if self.cache_dir is not None else default_cache_dir())
        module = check_call("cuModuleLoadData", d.cuModuleLoadData(binary.cubin))
        functions = []
        for step in self.launch.kernels:
            function = check_call("cuModuleGetFunction", d.cuModuleGetFunction(module, step.kernel.encode()))
            if step.smem_bytes > _DEFAULT_DYNAMIC_SMEM:
                check_call("cuFuncSetAttribute", d.cuFuncSetAttribute(
                    function, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    step.smem_bytes))
            functions.append(function)
        # zeroed once: a kernel that counts in its workspace leaves it zero for the next launch
        workspace = {name: torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{index}")
                     for name, nbytes in self.launch.workspace}
        return _OnDevice(context, module, functions, workspace, props.multi_processor_count)

    def _queue(self, state: _OnDevice, bound: Mapping[str, Any], stream: int) -> None:
        from workers.device_checks import pack_args
        from workers.driver import check_call, driver_api

        d = driver_api()
        check_call("cuCtxSetCurrent", d.cuCtxSetCurrent(state.context))  # this thread may have none yet
        pointers = {name: tensor.data_ptr() for name, tensor in {**bound, **state.workspace}.items()}
        for function, step in zip(state.functions, self.launch.kernels):
            params, _values = pack_args(step, pointers)  # _values: alive until the launch is queued
            check_call("cuLaunchKernel", d.cuLaunchKernel(
                function, *step.grid_on(state.sm_count), *step.block, step.smem_bytes, d.CUstream(stream),
                ctypes.addressof(params), 0))


def load(path: str | Path, *, cache_dir: str | Path | None = None) -> ExportedKernel:
    """The export at ``path``: its ``.launch.json``, its ``.cu``, or their common stem."""
    given = Path(path)
    name = given.name.removesuffix(".launch.json").removesuffix(".cu")
    launch_file = given.with_name(f"{name}.launch.json")
    try:
        document = json.loads(launch_file.read_text())
        source = (launch_file.parent / document["source"]).read_text()
        launch = Launch.from_json(document)
        tensors = tuple(TensorSpec(str(t["name"]), tuple(int(n) for n in t["shape"]), str(t["dtype"]),
                                   bool(t["output"])) for t in document["tensors"])
        flags = [str(f) for f in document["compile_flags"]]
    except OSError as error:
        raise LoadError(f"cannot read the export {given}: {error.strerror or error}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        what = f"no {error}" if isinstance(error, KeyError) else str(error).splitlines()[0]
        raise LoadError(f"{launch_file} is not a kernel export of this tuner ({what}); "
                        "export it again with `tuner export`") from None
    arch, options = _arch_and_options(flags)
    bound = {buffer for step in launch.kernels for buffer in _buffers(step)}
    unknown = sorted(bound - {t.name for t in tensors} - {n for n, _ in launch.workspace})
    if unknown:
        raise LoadError(f"{launch_file}: the launch names buffers no tensor is: {', '.join(unknown)}")
    return ExportedKernel(name, source, arch, options, launch, tensors, document,
                          Path(cache_dir) if cache_dir is not None else None)


def _arch_and_options(flags: list[str]) -> tuple[str, tuple[str, ...]]:
    """The export's ``-gencode arch=compute_X,code=sm_X`` pair as the arch; the rest as options."""
    arch, rest, skip = "sm_90a", [], False
    for i, flag in enumerate(flags):
        if skip:
            skip = False
            continue
        if flag == "-gencode" and i + 1 < len(flags):
            arch = flags[i + 1].rsplit("code=", 1)[-1]
            skip = True
        else:
            rest.append(flag)
    return arch, tuple(rest)


def _buffers(step: Launch) -> list[str]:
    return [a.value.buffer if isinstance(a.value, TensorMap) else a.value
            for a in step.args if a.kind in ("buffer", "tensormap")]


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, TORCH_DTYPES.get(name, name))


def _refusal(spec: TensorSpec, tensor: Any) -> str | None:
    """Why ``tensor`` cannot stand for ``spec``; None when it can."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return f"got {type(tensor).__name__}"
    got = f"got {str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)} on {tensor.device}"
    if tensor.dtype != _torch_dtype(spec.dtype) or tuple(tensor.shape) != spec.shape:
        return got
    if tensor.device.type != "cuda":
        return got
    if not tensor.is_contiguous():
        return f"got a non-contiguous tensor (strides {list(tensor.stride())})"
    return None


__all__ = ["ExportedKernel", "KernelArgumentError", "LoadError", "TensorSpec", "load"]
