"""Pieces of a GPU trial that need no GPU: reading back blocks of an output (DeviceArray, on a
driver whose "device" memory is host memory), and the check kernels compiling with nvcc."""

from __future__ import annotations

import ctypes
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

import workers.resident
from workers.device_checks import SOURCE, VECTOR, pack_params, padded
from workers.resident import DeviceArray


@pytest.fixture
def host_driver(monkeypatch):
    """cuMemcpyDtoH as a memmove: a DeviceArray over a numpy array's address reads it."""
    copies = []

    def copy(dst, src, nbytes):
        copies.append(nbytes)
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    monkeypatch.setattr(workers.resident, "driver_api", lambda: SimpleNamespace(cuMemcpyDtoH=copy))
    return copies


def test_leading_indices_read_one_block(host_driver):
    values = np.arange(2 * 3 * 5 * 4, dtype=np.uint16).reshape(2, 3, 5, 4)
    view = DeviceArray(values.ctypes.data, values.shape, values.dtype)
    assert np.array_equal(view[1, 2], values[1, 2]) and host_driver == [5 * 4 * 2]
    assert np.array_equal(view[0], values[0]) and host_driver[-1] == 3 * 5 * 4 * 2
    assert np.array_equal(view[-1, -3, 4], values[-1, -3, 4])
    assert np.array_equal(view[np.int64(1), 0][[0, 4]], values[1, 0][[0, 4]])


def test_other_indexing_reads_everything(host_driver):
    values = np.linspace(0, 1, 24, dtype=np.float32).reshape(4, 6)
    view = DeviceArray(values.ctypes.data, values.shape, values.dtype)
    assert np.array_equal(view[1:3, ::2], values[1:3, ::2]) and host_driver == [values.nbytes]
    assert np.array_equal(np.asarray(view), values) and view.astype(np.float64).dtype == np.float64
    assert len(view) == 4 and view.ndim == 2
    with pytest.raises(IndexError, match="out of bounds"):
        view[4]


def test_buffers_are_whole_vectors():
    assert [padded(n) for n in (0, 1, 16, 17, 4096)] == [VECTOR, 16, 16, 32, 4096]


def test_packed_params_point_at_the_values():
    values = [ctypes.c_uint64(7), ctypes.c_int32(-3), ctypes.c_float(2.5)]
    array = pack_params(values)
    assert ctypes.cast(array[0], ctypes.POINTER(ctypes.c_uint64)).contents.value == 7
    assert ctypes.cast(array[1], ctypes.POINTER(ctypes.c_int32)).contents.value == -3
    assert ctypes.cast(array[2], ctypes.POINTER(ctypes.c_float)).contents.value == 2.5


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_check_kernels_compile(tmp_path):
    from workers.compile import compile_cubin
    from workers.results import CompileRequest

    binary = compile_cubin(CompileRequest(SOURCE, "count_nonfinite", ("-O3",), "sm_90"), cache_dir=tmp_path)
    for name in (b"count_nonfinite", b"count_unequal", b"checksum"):
        assert name in binary.cubin
    assert binary.resources is not None and binary.resources.spill_stores == 0


@pytest.mark.parametrize("protocol", ["workers.device_checks.ChecksBench", "workers.resident.BuffersBench",
                                      "workers.kernel_run.RunBench", "workers.retime.RetimeBench"])
def test_the_bench_has_what_its_parts_use(protocol):
    """The checks, the resident buffers, a trial and the re-timing say what they use of their bench
    (a Protocol each, so that none imports workers.gpu, which imports them): GpuBench has it
    all, as a method, a property or an attribute its ``__init__`` sets."""
    import ast
    import importlib
    import inspect
    import textwrap

    from workers.gpu import GpuBench

    module, name = protocol.rsplit(".", 1)
    wanted = {member for cls in getattr(importlib.import_module(module), name).__mro__
              if cls.__name__.endswith("Bench")
              for member in (*vars(cls), *vars(cls).get("__annotations__", {})) if not member.startswith("_")}
    init = ast.parse(textwrap.dedent(inspect.getsource(GpuBench.__init__)))
    set_in_init = {node.attr for node in ast.walk(init) if isinstance(node, ast.Attribute)
                   and isinstance(node.ctx, ast.Store) and getattr(node.value, "id", None) == "self"}
    assert wanted and sorted(m for m in wanted if not hasattr(GpuBench, m) and m not in set_in_init) == []
