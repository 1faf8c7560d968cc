"""GPU clocks through NVML agree with nvidia-smi, and cost far less to read.

Run on the GPU machine: ``pytest -m gpu``. Skipped where no GPU is visible.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from workers.nvml import NvmlClocks

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def uuid():
    from workers.gpu import GpuBench

    bench = GpuBench(0)
    try:
        yield bench.device_info().uuid
    finally:
        bench.close()


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi not installed")
def test_nvml_reads_what_nvidia_smi_reports(uuid):
    reader = NvmlClocks.open(uuid)
    assert reader is not None, "libnvidia-ml.so.1 should load where the CUDA driver does"
    clocks = reader.read()
    out = subprocess.run(["nvidia-smi", f"--id={uuid}", "--format=csv,noheader,nounits",
                          "--query-gpu=clocks.mem,temperature.gpu,driver_version"],
                         capture_output=True, text=True, check=True).stdout
    mem, temperature, driver = [field.strip() for field in out.strip().split(",")]
    assert clocks["driver"] == driver and clocks["mem_mhz"] == int(mem)
    assert abs(clocks["temperature_c"] - int(temperature)) <= 3
    assert 200 < clocks["sm_mhz"] < 3000
    start = time.perf_counter()
    for _ in range(100):
        reader.read()
    assert (time.perf_counter() - start) / 100 < 2e-3  # nvidia-smi takes tens of milliseconds


def test_an_unknown_uuid_gives_no_reader():
    assert NvmlClocks.open("GPU-00000000-0000-0000-0000-000000000000") is None
