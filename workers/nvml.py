"""GPU clocks, temperature and power through NVML (the driver's ``libnvidia-ml``), by ctypes::

    reader = NvmlClocks.open("GPU-5b0e...")   # None where the library or the GPU is missing
    reader.read()    # {"sm_mhz": 1980, "mem_mhz": 2619, "temperature_c": 38, "power_w": 121.5,
                     #  "driver": "580.82.07"}
    reader.index()   # 3: the GPU's index on its machine (as nvidia-smi numbers it), or None

A read takes microseconds; running ``nvidia-smi`` for the same numbers took tens of
milliseconds, and every measured trial reads them.
"""

from __future__ import annotations

import ctypes
from typing import Any

_CLOCK_SM, _CLOCK_MEM = 1, 2  # nvmlClockType_t
_TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t
_library: Any = None


def _load() -> Any:
    """The initialised NVML library, or None."""
    global _library
    if _library is None:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
        except (OSError, AttributeError):
            return None
        _library = lib
    return _library


class NvmlClocks:
    def __init__(self, lib: Any, handle: ctypes.c_void_p) -> None:
        self._lib, self._handle = lib, handle

    @classmethod
    def open(cls, uuid: str) -> "NvmlClocks | None":
        lib = _load()
        if lib is None or not uuid:
            return None
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) != 0:
            return None
        return cls(lib, handle)

    def read(self) -> dict[str, Any]:
        """SM and memory clocks (MHz), temperature (C), power (W, where the GPU reports it)
        and the driver version, or {}."""
        sm, mem, temp = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        version = ctypes.create_string_buffer(96)
        lib, handle = self._lib, self._handle
        if (lib.nvmlDeviceGetClockInfo(handle, _CLOCK_SM, ctypes.byref(sm))
                or lib.nvmlDeviceGetClockInfo(handle, _CLOCK_MEM, ctypes.byref(mem))
                or lib.nvmlDeviceGetTemperature(handle, _TEMPERATURE_GPU, ctypes.byref(temp))
                or lib.nvmlSystemGetDriverVersion(version, len(version))):
            return {}
        out = {"sm_mhz": sm.value, "mem_mhz": mem.value, "temperature_c": temp.value,
               "driver": version.value.decode(errors="replace")}
        milliwatts = ctypes.c_uint()
        if lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(milliwatts)) == 0:  # not on every GPU
            out["power_w"] = round(milliwatts.value / 1000.0, 1)
        return out

    def index(self) -> int | None:
        """The GPU's index among the machine's GPUs (NVML's, as nvidia-smi prints it: not the
        CUDA ordinal inside a process that sees one GPU), or None."""
        value = ctypes.c_uint()
        if self._lib.nvmlDeviceGetIndex(self._handle, ctypes.byref(value)) != 0:
            return None
        return int(value.value)
