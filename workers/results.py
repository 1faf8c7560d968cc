"""Values that cross process boundaries between the coordinator and the workers.

They are frozen, picklable and free of CUDA handles or ORM objects.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from templates.family import DeviceLimits

# Why a trial failed. Every failure a kernel can cause ends in one of these, never in the study.
FAILURE_KINDS = (
    "invalid",  # the family's constraints rejected the config before compiling
    "compile",  # the compiler failed (log in `detail`)
    "resources",  # compiled, but the launch asked for more than the device has
    "crash",  # illegal address, trap, misaligned access: the CUDA context died
    "timeout",  # ran past the deadline (a hang); the worker was replaced
    "wrong",  # finished but the output does not match the reference (or NaN/Inf/unwritten)
    "nondeterministic",  # two runs on the same inputs gave different bits
    "worker",  # the worker process died for another reason
    "screened",  # the compiler's report ruled it out before any GPU time (heavy spills)
)


@dataclass(frozen=True)
class Resources:
    """What the compiler reports for the kernel (ptxas -v)."""

    registers: int
    smem_static: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Resources":
        return cls(**{k: int(data[k]) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class CompileRequest:
    source: str
    kernel: str
    options: tuple[str, ...]
    arch: str = "sm_90a"


@dataclass(frozen=True)
class Binary:
    """A compiled module: the cubin, its resources and the hashes that key caches."""

    cubin: bytes
    kernel: str
    resources: Resources | None
    source_hash: str  # sha256 of (source, options, arch, toolkit)
    cubin_hash: str  # sha256 of the cubin: configs with equal cubins are measured once
    toolkit: str  # e.g. "nvcc 13.0.88" or "nvrtc 13.0"
    options: tuple[str, ...]
    compile_seconds: float
    log: str = ""


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    iqr_ms: float  # spread: interquartile range
    repetitions: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Timing":
        return cls(
            float(data["median_ms"]),
            float(data["min_ms"]),
            float(data["max_ms"]),
            float(data["iqr_ms"]),
            int(data["repetitions"]),
        )


@dataclass(frozen=True)
class Paired:
    """A trial timed interleaved with the study's anchor on its GPU (``workers.paired``): the
    anchor's median over the same repetitions, the median of the repetitions' ratios (each
    trial repetition over the anchor's right after it) and their IQR."""

    anchor_ms: float
    ratio: float
    ratio_iqr: float
    repetitions: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Paired":
        return cls(float(data["anchor_ms"]), float(data["ratio"]), float(data["ratio_iqr"]),
                   int(data["repetitions"]))


def timing_of(samples_ms: list[float]) -> Timing:
    """The summary of a set of repetitions' times (milliseconds)."""
    ordered = sorted(samples_ms)
    q1, _, q3 = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else (ordered[0],) * 3
    return Timing(
        median_ms=float(statistics.median(ordered)),
        min_ms=float(ordered[0]),
        max_ms=float(ordered[-1]),
        iqr_ms=float(q3 - q1),
        repetitions=len(ordered),
    )



@dataclass(frozen=True)
class DeviceInfo:
    """A GPU as the worker sees it."""

    name: str
    sm_count: int
    compute_capability: tuple[int, int]
    max_smem_per_block_optin: int
    driver_version: str
    cuda_version: str
    uuid: str = ""
    clocks: Mapping[str, Any] = field(default_factory=dict)  # read when the worker started
    index: int | None = None  # the GPU's index on its machine (NVML's), where known

    @property
    def identity(self) -> dict[str, Any]:
        """Which GPU this is: ``{"uuid", "index", "name"}`` (what a measurement carries)."""
        return {"uuid": self.uuid, "index": self.index, "name": self.name}

    @property
    def limits(self) -> DeviceLimits:
        """What a family's constraints check a config against on this GPU."""
        return DeviceLimits(self.name, tuple(self.compute_capability), self.sm_count,  # type: ignore[arg-type]
                            self.max_smem_per_block_optin)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["compute_capability"] = list(self.compute_capability)
        data["clocks"] = dict(self.clocks)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "DeviceInfo":
        return cls(
            name=str(data["name"]),
            sm_count=int(data["sm_count"]),
            compute_capability=tuple(int(c) for c in data["compute_capability"]),  # type: ignore[arg-type]
            max_smem_per_block_optin=int(data["max_smem_per_block_optin"]),
            driver_version=str(data["driver_version"]),
            cuda_version=str(data["cuda_version"]),
            uuid=str(data.get("uuid", "")),
            clocks=dict(data.get("clocks") or {}),
            index=None if data.get("index") is None else int(data["index"]),
        )


@dataclass(frozen=True)
class Measurement:
    """The outcome of one trial on a worker: ok with a timing, or a failure with its reason."""

    ok: bool
    failure: str | None = None  # one of FAILURE_KINDS when not ok
    reason: str | None = None  # one line a person can read
    detail: str = ""  # compiler log, CUDA error name, traceback tail
    timing: Timing | None = None
    error: float | None = None  # relative error against the reference
    max_abs_error: float | None = None
    resources: Resources | None = None
    cubin_hash: str | None = None
    toolkit: str | None = None  # what compiled the cubin, e.g. "nvcc 13.0.88"
    compile_seconds: float | None = None
    advisories: tuple[str, ...] = ()  # ptxas' notes of a cut wgmma pipeline (workers.compile.ptxas_advisories)
    gpu_seconds: float = 0.0  # wall time the worker spent on the GPU for this trial
    kernel_seconds: float = 0.0  # of which the GPU ran the kernel (CUDA events; warm-up included)
    flush_seconds: float = 0.0  # and flushed the L2 before its timed launches (CUDA events)
    replayed: bool = False  # the numbers came from a recorded landscape, not a GPU
    # the GPU's SM/memory clocks, temperature and power read right before and right after the
    # timed repetitions: {"before": {...}, "after": {...}} ({} for a failure)
    clocks: Mapping[str, Any] = field(default_factory=dict)
    gpu: Mapping[str, Any] = field(default_factory=dict)  # which GPU: {"uuid", "index", "name"}
    paired: Paired | None = None  # timed interleaved with the study's anchor (several GPUs)

    def __post_init__(self) -> None:
        if self.ok and self.timing is None:
            raise ValueError("a successful measurement needs a timing")
        if not self.ok and self.failure not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {self.failure!r}")

    @classmethod
    def failed(cls, failure: str, reason: str, **extra: Any) -> "Measurement":
        return cls(ok=False, failure=failure, reason=reason, **extra)

    def to_json(self) -> dict[str, Any]:
        return measurement_to_json(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Measurement":
        return measurement_from_json(data)


@dataclass(frozen=True)
class Retiming:
    """Several kernels timed again interleaved on one GPU (A B C A B C ...): one Measurement per
    kernel, in the order given (ok with the timing of its rounds, or failed with its reason), and
    the GPU's clocks and temperature read before and after."""

    measurements: tuple[Measurement, ...]
    rounds: int  # interleaved rounds timed; 0 when no kernel was timed or the numbers are replayed
    clocks_before: Mapping[str, Any] = field(default_factory=dict)
    clocks_after: Mapping[str, Any] = field(default_factory=dict)
    gpu_seconds: float = 0.0
    kernel_seconds: float = 0.0
    flush_seconds: float = 0.0
    replayed: bool = False  # the numbers came from a recorded landscape, not a GPU
    gpu: Mapping[str, Any] = field(default_factory=dict)  # the GPU it ran on: {"uuid", "index", "name"}


@dataclass(frozen=True)
class Calibration:
    """A GPU's timing of the study's incumbent (the best config so far), taken between its
    trials so that the GPUs' timings can be made one set (``tuner.study.normalize``). Every GPU times
    the same config in a ``round``; ``measurement.gpu`` says which GPU this one is."""

    round: int
    params: Mapping[str, Any]
    measurement: Measurement


def measurement_to_json(m: Measurement) -> dict[str, Any]:
    """A plain JSON-able dict (nested values as dicts, absent ones as None)."""
    return {
        "ok": m.ok,
        "failure": m.failure,
        "reason": m.reason,
        "detail": m.detail,
        "timing": m.timing.to_json() if m.timing else None,
        "error": m.error,
        "max_abs_error": m.max_abs_error,
        "resources": m.resources.to_json() if m.resources else None,
        "cubin_hash": m.cubin_hash,
        "toolkit": m.toolkit,
        "compile_seconds": m.compile_seconds,
        "advisories": list(m.advisories),
        "gpu_seconds": m.gpu_seconds,
        "kernel_seconds": m.kernel_seconds,
        "flush_seconds": m.flush_seconds,
        "replayed": m.replayed,
        "clocks": dict(m.clocks),
        "gpu": dict(m.gpu),
        "paired": m.paired.to_json() if m.paired else None,
    }


def measurement_from_json(data: Mapping[str, Any]) -> Measurement:
    def opt_float(key: str) -> float | None:
        value = data.get(key)
        return None if value is None else float(value)

    return Measurement(
        ok=bool(data["ok"]),
        failure=data.get("failure"),
        reason=data.get("reason"),
        detail=str(data.get("detail") or ""),
        timing=Timing.from_json(data["timing"]) if data.get("timing") else None,
        error=opt_float("error"),
        max_abs_error=opt_float("max_abs_error"),
        resources=Resources.from_json(data["resources"]) if data.get("resources") else None,
        cubin_hash=data.get("cubin_hash"),
        toolkit=data.get("toolkit"),
        compile_seconds=opt_float("compile_seconds"),
        advisories=tuple(str(a) for a in data.get("advisories") or ()),
        gpu_seconds=float(data.get("gpu_seconds") or 0.0),
        kernel_seconds=float(data.get("kernel_seconds") or 0.0),
        flush_seconds=float(data.get("flush_seconds") or 0.0),
        replayed=bool(data.get("replayed", False)),
        clocks=dict(data.get("clocks") or {}),
        gpu=dict(data.get("gpu") or {}),
        paired=Paired.from_json(data["paired"]) if data.get("paired") else None,
    )
