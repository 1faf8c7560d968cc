"""The current problem's buffers on the GPU, kept from trial to trial::

    resident = bench.resident(family, problem, seed)   # uploaded once per (family, problem, seed)
    resident.inputs        # host copies (page-locked), for the reference
    resident.reference     # the family's reference output, computed once
    resident.buffers       # name -> (CUdeviceptr, bytes): the inputs and the outputs a run writes
    resident.second        # the outputs of the determinism run, by the same names
    resident.views()       # each output as a DeviceArray, for the family's validate
    bench.residents.changed()  # the name of an input some kernel wrote into, or None

A study measures every trial on the same inputs; uploading them for each trial cost an
8x16x2048x128 problem 192 MB of copies. A kernel that writes into its inputs would spoil every
later trial: ``changed`` compares the inputs' checksums with those taken after the upload, and
marks the buffers for a new upload when they differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import numpy as np

from templates.family import BufferSpec, KernelFamily, Problem
from workers.device_checks import DeviceChecks, padded
from workers.driver import check_call, driver_api
from workers.pinned import PinnedBuffers


class DeviceArray:
    """An array in device memory that copies back only what is indexed: leading integer
    indices (``o[b, h]``) read one contiguous block; anything else reads the whole array."""

    def __init__(self, ptr: Any, shape: tuple[int, ...], dtype: Any) -> None:
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), np.dtype(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        lead = key if isinstance(key, tuple) else (key,)
        if not lead or len(lead) > self.ndim or not all(isinstance(i, (int, np.integer)) for i in lead):
            return self.read()[key]
        offset = 0
        for index, size in zip(lead, self.shape):
            if not -size <= index < size:
                raise IndexError(f"index {index} is out of bounds for a dimension of size {size}")
            offset = offset * size + int(index) % size
        block = self.shape[len(lead):]
        return self._read(offset * math.prod(block), block)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = self.read()
        return values if dtype is None else values.astype(dtype)

    def astype(self, dtype: Any) -> np.ndarray:
        return self.read().astype(dtype)

    def read(self) -> np.ndarray:
        """The whole array, copied to the host."""
        return self._read(0, self.shape)

    def _read(self, first: int, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(shape, self.dtype)
        if out.nbytes:
            check_call("cuMemcpyDtoH", driver_api().cuMemcpyDtoH(
                out.ctypes.data, int(self.ptr) + first * self.dtype.itemsize, out.nbytes))
        return out


@dataclass
class Resident:
    key: tuple[str, Problem, int]
    inputs: dict[str, np.ndarray]
    specs: tuple[BufferSpec, ...]
    buffers: dict[str, tuple[Any, int]] = field(default_factory=dict)
    second: dict[str, tuple[Any, int]] = field(default_factory=dict)
    sums: dict[str, int] = field(default_factory=dict)  # input name -> checksum after upload
    reference: Any = None  # the family's reference for these inputs (KernelFamily.reference)

    def views(self) -> Mapping[str, DeviceArray]:
        return {s.name: DeviceArray(self.buffers[s.name][0], s.shape, s.dtype) for s in self.specs}


class BuffersBench(Protocol):
    """What ResidentBuffers uses of its bench (a ``workers.gpu.GpuBench``): the page-locked
    host copies of the inputs and the checks that take their checksums."""

    pinned: PinnedBuffers

    @property
    def checks(self) -> DeviceChecks: ...


class ResidentBuffers:
    """What a GpuBench keeps on the device: one problem's buffers at a time."""

    def __init__(self, bench: BuffersBench) -> None:
        self._bench, self._d, self._check = bench, driver_api(), check_call
        self.current: Resident | None = None

    def get(self, family: KernelFamily, problem: Problem, seed: int) -> Resident:
        key = (family.name, problem, seed)
        if self.current is not None and self.current.key == key:
            return self.current
        self.free()
        pinned = self._bench.pinned
        drawn = family.inputs(problem, seed)
        inputs = {name: pinned.copy_of(("input", name), np.ascontiguousarray(a)) for name, a in drawn.items()}
        resident = Resident(key, inputs, tuple(family.outputs(problem)), reference=family.reference(problem, inputs))
        try:
            for name, array in inputs.items():
                ptr = self._alloc(resident.buffers, name, array.nbytes)
                self._check("cuMemcpyHtoD", self._d.cuMemcpyHtoD(ptr, array.ctypes.data, array.nbytes))
            for spec in resident.specs:
                nbytes = math.prod(spec.shape) * np.dtype(spec.dtype).itemsize
                self._alloc(resident.buffers, spec.name, nbytes)
                self._alloc(resident.second, spec.name, nbytes)
            resident.sums = self._checksums(resident)
        except BaseException:
            self._release(resident)
            raise
        self.current = resident
        return resident

    def changed(self) -> str | None:
        """The first input whose checksum differs from the upload's (the buffers are then
        uploaded again for the next trial), or None."""
        resident = self.current
        if resident is None:
            return None
        now = self._checksums(resident)
        for name, value in now.items():
            if value != resident.sums[name]:
                self.free()
                return name
        return None

    def _checksums(self, resident: Resident) -> dict[str, int]:
        checks = self._bench.checks
        checks.begin()
        slots = {name: checks.checksum(resident.buffers[name][0], resident.buffers[name][1])
                 for name in resident.inputs}
        counts = checks.collect()
        return {name: counts[slot] for name, slot in slots.items()}

    def _alloc(self, into: dict[str, tuple[Any, int]], name: str, nbytes: int) -> Any:
        """A buffer of whole check vectors, zeroed (the padding stays zero)."""
        if name in into:
            raise ValueError(f"buffer {name!r} is both an input and an output")
        size = padded(nbytes)
        ptr = self._check("cuMemAlloc", self._d.cuMemAlloc(size))
        into[name] = (ptr, nbytes)
        self._check("cuMemsetD8", self._d.cuMemsetD8(ptr, 0, size))
        return ptr

    def free(self) -> None:
        resident, self.current = self.current, None
        if resident is not None:
            self._release(resident)

    def _release(self, resident: Resident) -> None:
        for ptr, _ in [*resident.buffers.values(), *resident.second.values()]:
            self._check("cuMemFree", self._d.cuMemFree(ptr))
        self._bench.pinned.free(*(("input", name) for name in resident.inputs))
