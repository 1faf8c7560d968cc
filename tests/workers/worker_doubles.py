"""Test doubles for GpuBench, run in real Ray actors. ``params["behaviour"]`` picks what
``measure`` does: ok, slow (0.5 s, then ok), hang (sleeps for ever), exit (os._exit), crash (a
dead-context result; like GpuBench, every later call then fails as a dead worker);
``retime`` does the same for the whole re-timing when any config asks for it (crash: that one)."""

from __future__ import annotations

import os
import time

import numpy as np

from templates import get_family
from workers.results import DeviceInfo, Measurement, Retiming, Timing
from workers.request import TakesRequests
from workers.timing_options import TimingOptions

FAKE_DEVICE = DeviceInfo("Fake H100", 132, (9, 0), 232448, "580.00", "13.0", uuid="GPU-fake")


class FakeBench(TakesRequests):
    ray_options = {"num_gpus": 0}  # no GPU in the test cluster
    num_workers = 1

    def __init__(self) -> None:
        self.calls = 0
        self.dead = False
        self.prepared = None

    def device_info(self) -> DeviceInfo:
        return FAKE_DEVICE

    def measure(self, binary, launch, family_name, problem, *, params=None, **options):
        behaviour = (params or {}).get("behaviour", "ok")
        timing = options.get("timing") or TimingOptions()
        self.calls += 1
        started = time.time()
        if self.dead:
            return Measurement.failed("worker", "this GPU worker's context is dead")
        if behaviour == "slow":
            time.sleep(0.5)
        if behaviour == "slower":  # outlasts the compiles of the configs sent after it
            time.sleep(2.0)
        if behaviour == "hang":
            time.sleep(3600)
        if behaviour == "exit":  # dies mid-trial: a process that died at the very start of a task
            time.sleep(0.2)      # could lose the reply of the task before it (Ray sends it on a thread)
            os._exit(3)
        if behaviour == "crash":
            self.dead = True
            return Measurement.failed("crash", "CUDA_ERROR_ILLEGAL_ADDRESS during synchronize",
                                      detail="CUDA_ERROR_ILLEGAL_ADDRESS", gpu_seconds=0.01)
        if behaviour == "raise":
            raise RuntimeError("the bench broke")
        assert binary is not None and binary.cubin[:4] == b"\x7fELF"
        return Measurement(ok=True, timing=Timing(1.0, 0.9, 1.2, 0.1, 20), error=0.0,
                           max_abs_error=0.0, gpu_seconds=0.5, kernel_seconds=0.4, flush_seconds=0.05,
                           detail=f"pid={os.getpid()} calls={self.calls} prepared={self.prepared} "
                                  f"abort_above_ms={timing.abort_above_ms} "
                                  f"max_reps={timing.max_reps} target_ms={timing.target_ms} "
                                  f"anchor={timing.anchor[0].cubin_hash if timing.anchor else None} "
                                  f"start={started:.3f} end={time.time():.3f}")


    def retime(self, kernels, family_name, problem, *, params=None, rounds=30, **options):
        behaviours = [p.get("behaviour", "ok") for p in params]
        self.calls += 1
        if "hang" in behaviours:
            time.sleep(3600)
        if "exit" in behaviours:
            os._exit(3)
        out = []
        for (binary, launch), p, behaviour in zip(kernels, params, behaviours):
            assert binary is not None and binary.cubin[:4] == b"\x7fELF" and launch.kernel
            if behaviour == "crash":
                out.append(Measurement.failed("crash", "CUDA_ERROR_ILLEGAL_ADDRESS during timing"))
                continue
            ms = 1.0 + p["tag"] / 10
            out.append(Measurement(ok=True, timing=Timing(ms, ms, ms, 0.0, rounds), error=0.0,
                                   detail=f"pid={os.getpid()} calls={self.calls}"))
        return Retiming(tuple(out), rounds, clocks_before={"sm_mhz": 1980, "temperature_c": 40},
                        clocks_after={"sm_mhz": 1965, "temperature_c": 52}, gpu_seconds=0.25,
                        kernel_seconds=0.2, flush_seconds=0.02)


class PreparingBench(FakeBench):
    """A bench that, as GpuBench does, is told the problem when it starts (``prepare``)."""

    def prepare(self, family_name, problem, seed=0):
        self.prepared = f"{family_name}|{problem.key}|{seed}"


class TwoFakeBenches(FakeBench):
    num_workers = 2


class TwoPreparingBenches(PreparingBench):
    num_workers = 2


class FamilyBench(FakeBench):
    """A bench that, as GpuBench does, resolves the family it is sent in its own process
    (``templates.get_family``: a name, a path, module:ATTR or the family by value) and validates
    through it; the kernel itself is not run (its output is computed on the host)."""

    def prepare(self, family, problem, seed=0):
        self.prepared = get_family(family).name

    def measure(self, binary, launch, family, problem, *, params=None, seed=0, **options):
        fam = get_family(family)
        assert binary is not None and binary.cubin[:4] == b"\x7fELF"
        inputs = fam.inputs(problem, seed)
        scale = next(a.value for a in launch.args if a.kind == "f32")
        check = fam.validate(problem, inputs, {"y": (scale * inputs["x"]).astype(np.float32)})
        return Measurement(ok=check.ok, timing=Timing(1.0, 0.9, 1.2, 0.1, 20), error=check.error,
                           detail=f"pid={os.getpid()} family={fam.name} folder={fam.folder} "
                                  f"prepared={self.prepared}")


class SlowStartBench(FakeBench):
    """A bench that takes START_S to start (as a GPU worker takes to make its context and upload
    the problem): what replacing one costs is measurable."""

    START_S = 0.6

    def __init__(self) -> None:
        super().__init__()
        time.sleep(self.START_S)
