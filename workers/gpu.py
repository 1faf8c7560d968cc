"""One GPU's bench: load a cubin, check its output, time it (CUDA driver API, no Ray)::

    bench = GpuBench()                      # device 0 (Ray sets CUDA_VISIBLE_DEVICES)
    info = bench.device_info()
    m = bench.measure(binary, launch, "attention", problem, seed=0)
    m.ok, m.timing.median_ms, m.failure

    retiming = bench.retime([(binary, launch), (other, launch2)], "attention", problem, seed=0)

A measurement never raises for what a kernel does: it ends in ``Measurement.failed(kind, ...)``.
A crash (illegal address, trap, ...) leaves the CUDA context unusable; the bench then marks
itself ``dead`` and the pool replaces its process.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
import time
import traceback
from dataclasses import replace
from typing import Any, Mapping, Sequence

from templates import get_family
from templates.family import KernelFamily, Launch, Problem
from workers.compile import binary_tags
from workers.driver import check_call, driver_api
from workers.errors import LaunchError, NoGPUError
from workers.hold import StreamHold, compile_hold
from workers.nvml import NvmlClocks
from workers.device_checks import DeviceChecks, compile_checks
from workers.pinned import PinnedBuffers
from workers.request import TakesRequests
from workers.resident import Resident, ResidentBuffers
from workers.results import Binary, DeviceInfo, Measurement, Retiming
from workers.retime import MAX_SECONDS, ROUNDS, interleave
from workers.kernel_run import KernelRun
from workers.timing_options import DEFAULT_TIMING, TimingOptions

logger = logging.getLogger(__name__)


# How much the flush reads, in L2 sizes. A memset of 1x was within 0.6% of 4x (an H200,
# docs/scripts/flush_size.py); the read: docs/BENCHMARKS.md, "Timing methods" (2026-11-27).
FLUSH_FACTOR = 1.0


def l2_flush_bytes(l2_size: int) -> int:
    """Bytes the flush reads before a timed repetition so that it starts with a cold L2 of clean
    lines (``workers.hold``): FLUSH_FACTOR times the L2's size, in whole 16-byte words."""
    return max(int(FLUSH_FACTOR * l2_size), 1 << 20) // 16 * 16


# Errors after which the context is unusable: the process must go.
CRASH_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_TIMEOUT", "CUDA_ERROR_INVALID_ADDRESS_SPACE",
})
# Errors that say the launch asked for more than the device has; the context lives on.
RESOURCE_ERRORS = frozenset({
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "CUDA_ERROR_OUT_OF_RESOURCES",
    "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_OUT_OF_MEMORY",
})
_STATIC_SMEM_LIMIT = 48 * 1024


_NVML: dict[str, NvmlClocks | None] = {}


def read_clocks(uuid: str = "") -> dict[str, Any]:
    """Current SM/memory clocks (MHz), temperature (C) and driver: through NVML for a GPU
    given by ``uuid``, else from nvidia-smi; {} when neither answers."""
    if uuid:
        if uuid not in _NVML:
            _NVML[uuid] = NvmlClocks.open(uuid)
        reader = _NVML[uuid]
        clocks = reader.read() if reader is not None else {}
        if clocks:
            return clocks
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    cmd = [smi, "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,driver_version",
           "--format=csv,noheader,nounits"]
    if uuid:
        cmd += ["--id=" + uuid]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
        sm, mem, temp, drv = [f.strip() for f in out.strip().splitlines()[0].split(",")]
        return {"sm_mhz": int(sm), "mem_mhz": int(mem), "temperature_c": int(temp), "driver": drv}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


class GpuBench(TakesRequests):
    """The GPU side of a worker: one device, its primary context, one stream."""

    def __init__(self, device_ordinal: int = 0) -> None:
        driver = driver_api()
        self.dead = False
        try:
            check_call("cuInit", driver.cuInit(0))
            count = check_call("cuDeviceGetCount", driver.cuDeviceGetCount())
        except Exception as exc:
            raise NoGPUError(f"no GPU visible to the CUDA driver: {exc}") from None
        if device_ordinal >= count:
            raise NoGPUError(f"no GPU {device_ordinal}: the driver sees {count}")
        self._device = check_call("cuDeviceGet", driver.cuDeviceGet(device_ordinal))
        self.context = check_call("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(self._device))
        check_call("cuCtxSetCurrent", driver.cuCtxSetCurrent(self.context))
        self.stream = check_call("cuStreamCreate", driver.cuStreamCreate(0))
        l2 = self._attribute("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE")
        self._flush_bytes = l2_flush_bytes(l2)
        self._flush_buf = check_call("cuMemAlloc", driver.cuMemAlloc(self._flush_bytes))
        check_call("cuMemsetD32", driver.cuMemsetD32(self._flush_buf, 0, self._flush_bytes // 4))
        self.last_event: Any = None  # the latest event a live trial recorded after a launch
        self._spare_events: list[Any] = []  # events released trials gave back
        self._info: DeviceInfo | None = None
        self.pinned = PinnedBuffers()  # the host inputs of the current problem, the check counts
        self.residents = ResidentBuffers(self)
        self._checks: DeviceChecks | None = None
        self._hold: StreamHold | None = None
        self._capability = (self._attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                            self._attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"))
        # the check and hold kernels compile (a second or two) while the study asks its first configs
        self._checks_compiled = threading.Thread(target=_compile_quietly, args=(self._capability,), daemon=True)
        self._checks_compiled.start()

    def resident(self, family: KernelFamily, problem: Problem, seed: int) -> Resident:
        """The device buffers of (problem, seed): a study measures every trial on the same
        inputs, uploaded once (one problem at a time)."""
        return self.residents.get(family, problem, seed)

    @property
    def checks(self) -> DeviceChecks:
        """The output checks that run on this GPU (compiled on first use)."""
        if self._checks is None:
            self._checks_compiled.join()
            self._checks = DeviceChecks(self)
        return self._checks

    @property
    def hold(self) -> StreamHold:
        """The spin kernel that holds this bench's stream while timed repetitions are queued
        (``workers.hold``; compiled on first use)."""
        if self._hold is None:
            self._checks_compiled.join()
            self._hold = StreamHold(self.stream, self._capability)
        return self._hold

    def event(self) -> Any:
        """A CUDA event to time with: a spare one, else a new one. A trial records about two
        events a repetition; making and destroying them cost two driver calls each, and the
        destroys ran while the GPU waited for the next trial."""
        if self._spare_events:
            return self._spare_events.pop()
        return check_call("cuEventCreate", driver_api().cuEventCreate(0))

    def spare(self, events: Sequence[Any]) -> None:
        """Keep ``events`` for the next trials (their last recordings are of no more use)."""
        if self.last_event is not None and any(e is self.last_event for e in events):
            self.last_event = None
        self._spare_events.extend(events)

    def flush_l2(self) -> None:
        """Queue, on the bench's stream, the L2 flush (a read of ``l2_flush_bytes``: ``workers.hold``)."""
        self.hold.flush(self._flush_buf, self._flush_bytes)

    # -- the device ---------------------------------------------------------------------------
    def _attribute(self, name: str) -> int:
        driver = driver_api()
        attr = getattr(driver.CUdevice_attribute, name)
        return int(check_call("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(attr, self._device)))

    def device_info(self) -> DeviceInfo:
        if self._info is None:
            driver = driver_api()
            raw = check_call("cuDeviceGetName", driver.cuDeviceGetName(256, self._device))
            name = raw.split(b"\x00", 1)[0].decode(errors="replace").strip()
            uuid = bytes(check_call("cuDeviceGetUuid", driver.cuDeviceGetUuid(self._device)).bytes)
            h = uuid.hex()
            uuid_text = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
            version = int(check_call("cuDriverGetVersion", driver.cuDriverGetVersion()))
            cuda_version = f"{version // 1000}.{(version % 1000) // 10}"
            clocks = read_clocks(uuid_text)
            reader = _NVML.get(uuid_text)
            self._info = DeviceInfo(
                name=name,
                sm_count=self._attribute("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
                compute_capability=(
                    self._attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
                    self._attribute("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"),
                ),
                max_smem_per_block_optin=self._attribute(
                    "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"
                ),
                driver_version=str(clocks.pop("driver", "")) or cuda_version,
                cuda_version=cuda_version,
                uuid=uuid_text,
                clocks=clocks,
                index=reader.index() if reader is not None else None,
            )
        return self._info

    def prepare(self, family: str | KernelFamily, problem: Problem, seed: int = 0) -> None:
        """Draw, upload and check the inputs of (problem, seed) and compute the reference ahead
        of the first trial (1.9 s for an 8x16x2048x128 problem). Never raises: what fails here
        fails the first measurement again, with its reason."""
        try:
            self.resident(get_family(family), problem, seed)
        except Exception as exc:  # noqa: BLE001 - reported by the first measurement
            logger.debug("preparing %s failed: %s", problem.key, exc)

    # -- one trial ----------------------------------------------------------------------------
    def measure(
        self,
        binary: Binary,
        launch: Launch,
        family_ref: str | KernelFamily,
        problem: Problem,
        *,
        params: Mapping[str, Any] | None = None,
        seed: int = 0,
        timing: TimingOptions = DEFAULT_TIMING,
    ) -> Measurement:
        """Load, run, validate, check determinism, time (as ``timing`` says). ``family_ref`` is
        what ``get_family`` resolves in this process (a name, a path, module:ATTR, or the family
        shipped by value); ``params`` is unused (replay needs it). With ``timing.anchor`` (the
        study's anchor, several GPUs), the repetitions alternate with the anchor's
        (``workers.paired``)."""
        if self.dead:
            return Measurement.failed("worker", "this GPU worker's context is dead", **self._tags(binary))

        start = time.perf_counter()
        trial = KernelRun(self, binary, launch)
        paired = KernelRun(self, *timing.anchor) if timing.anchor is not None else None
        try:
            family = get_family(family_ref)
            result = trial.run(family, problem, seed=seed, timing=timing, beside=paired)
        except LaunchError as exc:
            result = self.classify(exc, trial.stage)
        except Exception as exc:  # a family or host bug: fail this trial, keep the worker
            result = _host_failure(exc)
        finally:
            self._release([trial] if paired is None else [trial, paired])
        if paired is not None:
            trial.kernel_ms += paired.kernel_ms
            trial.flush_ms += paired.flush_ms
        seconds = time.perf_counter() - start
        clocks = dict(trial.clocks) if result.ok else {}
        return Measurement(**{**result.__dict__, **self._tags(binary), "gpu_seconds": seconds,
                              "kernel_seconds": trial.kernel_ms / 1e3,
                              "flush_seconds": trial.flush_ms / 1e3, "clocks": clocks,
                              "gpu": self.device_info().identity})

    # -- several kernels, interleaved -------------------------------------------------------------
    def retime(
        self,
        kernels: Sequence[tuple[Binary, Launch]],
        family_ref: str | KernelFamily,
        problem: Problem,
        *,
        params: Sequence[Mapping[str, Any]] | None = None,
        seed: int = 0,
        rounds: int = ROUNDS,
        max_seconds: float = MAX_SECONDS,
        warmup_ms: float = 25.0,
        flush_l2: bool = True,
    ) -> Retiming:
        """Time ``kernels`` again, interleaved round-robin on this GPU (see ``workers.retime``):
        one Measurement each, in order, and the clocks read before and after. Never raises for
        what a kernel does. ``params`` is unused (replay needs it)."""
        if self.dead:
            dead = Measurement.failed("worker", "this GPU worker's context is dead")
            return Retiming(tuple(replace(dead, **self._tags(b)) for b, _ in kernels), rounds=0)
        start = time.perf_counter()
        before = self.clocks_now()
        trials = [KernelRun(self, binary, launch) for binary, launch in kernels]
        try:
            family = get_family(family_ref)
            results, count = interleave(
                self, trials, family, problem, seed=seed, rounds=rounds, max_seconds=max_seconds,
                warmup_ms=warmup_ms, flush_l2=flush_l2)
        except LaunchError as exc:
            results, count = [self.classify(exc, "re-timing")] * len(trials), 0
        except Exception as exc:  # a family or host bug: fail the re-timing, keep the worker
            results, count = [_host_failure(exc)] * len(trials), 0
        finally:
            self._release(trials)
        measurements = tuple(Measurement(**{**r.__dict__, **self._tags(b)})
                             for r, (b, _) in zip(results, kernels))
        return Retiming(measurements, count, clocks_before=before, clocks_after=self.clocks_now(),
                        gpu_seconds=time.perf_counter() - start,
                        kernel_seconds=sum(t.kernel_ms for t in trials) / 1e3,
                        flush_seconds=sum(t.flush_ms for t in trials) / 1e3,
                        gpu=self.device_info().identity)

    def _release(self, trials: Sequence[KernelRun]) -> None:
        """Free what the trials took, unless the context is dead (then nothing can be freed)."""
        for trial in trials:
            if self.dead:
                return
            try:
                trial.release()
            except LaunchError as exc:
                logger.warning("cleanup failed, the context is unusable: %s", exc)
                self.dead = True

    def clocks_now(self) -> dict[str, Any]:
        """SM/memory clocks, temperature and power now (``read_clocks`` less the driver), or {}.
        A trial reads them right before and right after its timed repetitions."""
        clocks = read_clocks(self._info.uuid if self._info else "")
        clocks.pop("driver", None)
        return clocks

    def classify(self, exc: LaunchError, stage: str) -> Measurement:
        """Turn a driver error into a failure kind; mark the bench dead when the context is."""
        if exc.name in CRASH_ERRORS:
            self.dead = True
            return Measurement.failed("crash", f"{exc.name} during {stage}", detail=exc.name)
        if exc.name in RESOURCE_ERRORS and stage in ("smem", "launch", "alloc"):
            return Measurement.failed("resources", f"{exc.name} at {stage}", detail=exc.name)
        if stage in ("load", "function"):
            return Measurement.failed("compile", f"module unusable: {exc}", detail=exc.name)
        self.dead = True  # an error we do not know: do not trust the context any more
        return Measurement.failed("crash", f"{exc.name} during {stage}", detail=exc.name)

    @staticmethod
    def _tags(binary: Binary | None) -> dict[str, Any]:
        return {} if binary is None else binary_tags(binary)

    def close(self) -> None:
        if self.dead:
            return
        driver = driver_api()
        self.residents.free()
        if self._checks is not None:
            self._checks.close()
        if self._hold is not None:
            self._hold.close()
        self.pinned.free()
        for event in self._spare_events:
            driver.cuEventDestroy(event)
        self._spare_events.clear()
        driver.cuMemFree(self._flush_buf)
        driver.cuStreamDestroy(self.stream)
        driver.cuDevicePrimaryCtxRelease(self._device)
        self.dead = True


def _compile_quietly(capability: tuple[int, int]) -> None:
    """Fill the compile cache with the check and hold kernels; an error shows when they are used."""
    for compile_ahead in (compile_checks, compile_hold):
        try:
            compile_ahead(capability)
        except Exception as exc:  # noqa: BLE001 - their users compile again and raise it there
            logger.debug("%s did not compile ahead: %s", compile_ahead.__name__, exc)


def _host_failure(exc: Exception) -> Measurement:
    """A family or host bug while measuring: a ``worker`` failure with the traceback's tail."""
    tail = "".join(traceback.format_exception(exc)[-3:])
    return Measurement.failed("worker", f"{type(exc).__name__}: {exc}".splitlines()[0], detail=tail)


__all__ = ["GpuBench", "read_clocks"]
