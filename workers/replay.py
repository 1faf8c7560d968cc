"""Recorded landscapes: every measured config of one family, problem and device, as JSON.

A landscape lets the search run and be tested without a GPU::

    save_landscape("attn.json", device=info, family="attention", problem=problem,
                   template_hash=family.template_hash, entries=[(params, measurement), ...])
    with WorkerPool("attention", problem, replay="attn.json") as pool:
        ...                                   # answers come from the file, replayed=True

Configs recorded before the family's space grew are completed on load (``KernelFamily.complete``).

For tests and simulations only, a replay can stand in for several GPUs that differ:
``WorkerPool(..., replay=path, replay_gpus=(1.0, 1.04))`` starts one replay actor per factor,
each answering as GPU ``i`` (uuid ``GPU-replay-i``) with the recorded times multiplied by its
factor (:meth:`ReplayBench.simulate`): the second runs 4% slow, as two GPUs of one model can.

The file: ``{"format": 1, "device": {...}, "family": "...", "problem": {...},
"template_hash": "...", "entries": [{"params": {...}, "measurement": {...}}, ...]}``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from storage.records import params_key
from templates.family import Launch, Problem
from workers.errors import WorkerError
from workers.request import TakesRequests
from workers.results import (
    Binary,
    DeviceInfo,
    Measurement,
    Retiming,
    Timing,
    measurement_from_json,
    measurement_to_json,
)

FORMAT = 1
NOT_RECORDED = "not in the recorded landscape"


@dataclass(frozen=True)
class Landscape:
    device: DeviceInfo
    family: str
    problem: Problem
    template_hash: str
    entries: tuple[tuple[Mapping[str, Any], Measurement], ...]

    def lookup(self) -> dict[str, Measurement]:
        return {params_key(p): m for p, m in self.entries}


def save_landscape(
    path: str | Path,
    *,
    device: DeviceInfo,
    family: str,
    problem: Problem,
    template_hash: str,
    entries: Iterable[tuple[Mapping[str, Any], Measurement]],
) -> Path:
    """Write a landscape atomically; returns its path."""
    path = Path(path)
    data = {
        "format": FORMAT,
        "device": device.to_json(),
        "family": family,
        "problem": problem.to_json(),
        "template_hash": template_hash,
        "entries": [{"params": dict(p), "measurement": measurement_to_json(m)} for p, m in entries],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".landscape-")
    with os.fdopen(fd, "wb") as handle:
        text = json.dumps(data, indent=1).encode()
        # mtime 0: the same landscape compresses to the same bytes
        handle.write(gzip.compress(text, mtime=0) if path.name.endswith(".gz") else text)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; a landscape is shared
    os.replace(tmp, path)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def landscape_json(path: str | Path) -> Any:
    """A landscape file's JSON, decompressed where its name ends in ``.gz`` (``.json.gz``: a
    tenth of the size); OSError or ValueError as reading and parsing raise them."""
    raw = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        try:
            raw = gzip.decompress(raw)  # not gzip at all: BadGzipFile, an OSError
        except (EOFError, zlib.error) as exc:  # cut short, or corrupt
            raise OSError(f"{exc}") from None
    return json.loads(raw)


def load_landscape(path: str | Path, family: Any = None) -> Landscape:
    """Read a landscape; a missing, malformed or wrong file raises WorkerError with one line. Its
    configs are completed by ``family`` (a reference ``templates.get_family`` resolves; None:
    the family the file names, when this process finds it by that name).

    What it records is checked: at least one entry, a positive, finite ``median_ms`` for each
    that is ok, and where the family is found and is the one the file names, its problem and
    every config (completed) of the family's (a problem or a parameter of another space)."""
    try:
        data = landscape_json(path)
    except OSError as exc:  # gzip's BadGzipFile too
        raise WorkerError(f"cannot read landscape {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # UnicodeDecodeError too
        raise WorkerError(f"landscape {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise WorkerError(f"landscape {path}: unknown format {data.get('format')!r}, expected {FORMAT}"
                          if isinstance(data, dict) else f"landscape {path}: not an object")
    try:
        found = _family(str(data["family"]) if family is None else family)
        ours = found is not None and found.name == str(data["family"])
        complete = found.complete if found is not None else dict
        problem = Problem.from_json(data["problem"])
        landscape = Landscape(
            device=DeviceInfo.from_json(data["device"]),
            family=str(data["family"]),
            problem=_problem(path, found, problem) if ours else problem,
            template_hash=str(data.get("template_hash", "")),
            entries=tuple(
                (complete(dict(e["params"])), measurement_from_json(e["measurement"])) for e in data["entries"]
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WorkerError(f"landscape {path} is malformed: {type(exc).__name__}: {exc}") from None
    _check_entries(path, landscape, found if ours else None)
    return landscape


def _problem(path: str | Path, family: Any, recorded: Problem) -> Problem:
    """``recorded`` checked by ``family`` as a user's problem is (its flags' defaults added)."""
    from templates.family import TemplateError

    try:
        return family.parse_problem(recorded.shape, recorded.dtype, dict(recorded.flags))
    except TemplateError as exc:
        raise WorkerError(f"landscape {path} records a problem {family.name} refuses: "
                          f"{_unprefixed(exc, family)}") from None


def _check_entries(path: str | Path, landscape: Landscape, family: Any) -> None:
    """WorkerError where the landscape records nothing, an ok entry has no positive, finite time,
    or (``family``: not None) a config has a parameter or value not of the family's space."""
    from templates.family import TemplateError

    if not landscape.entries:
        raise WorkerError(f"landscape {path} records no configs (its 'entries' are empty)")
    for number, (params, measurement) in enumerate(landscape.entries, start=1):
        median = measurement.timing.median_ms if measurement.timing is not None else None
        if measurement.ok and median is not None and not (math.isfinite(median) and median > 0):
            raise WorkerError(f"landscape {path}: entry {number} is ok with median_ms {median!r}, "
                              "not a positive number of milliseconds")  # an ok one has a timing
        if family is not None:
            try:
                family.validate_params(params)
            except TemplateError as exc:
                raise WorkerError(f"landscape {path}: entry {number} is not in {family.name}'s space: "
                                  f"{_unprefixed(exc, family)}") from None


def _unprefixed(error: Exception, family: Any) -> str:
    return str(error).removeprefix(f"{family.name}: ")


def _family(family: Any) -> Any:
    """The family ``family`` refers to; None where this process cannot load it."""
    from templates import get_family
    from templates.family import TemplateError

    try:
        return get_family(family)
    except TemplateError:
        return None


def _completion(family: Any) -> Any:
    """How to bring a recorded config up to the family's space today: parameters added since it
    was recorded take their first choice, which is what the kernels did before they existed
    (``KernelFamily.complete``). A family this process cannot load leaves configs as recorded."""
    found = _family(family)
    return dict if found is None else found.complete


class ReplayBench(TakesRequests):
    """GpuBench's interface, answered from a landscape by params. Needs no GPU."""

    dead = False

    def __init__(self, landscape: Landscape | str | Path, family: Any = None) -> None:
        """``family``: the pool's reference to it (None: the family the landscape names)."""
        self._gpu: dict[str, Any] = {}  # set by simulate(): the GPU this replay stands for
        self._slowdown = 1.0
        self.load(landscape, family)

    def load(self, landscape: Landscape | str | Path, family: Any = None) -> DeviceInfo:
        """Answer from ``landscape`` from now on (a pool's next problem); its device."""
        if not isinstance(landscape, Landscape):
            landscape = load_landscape(landscape, family)
        self._landscape = landscape
        self._lookup = self._landscape.lookup()
        # asked as the entries were loaded
        self._complete = _completion(self._landscape.family if family is None else family)
        return landscape.device

    def simulate(self, index: int, slowdown: float = 1.0) -> dict[str, Any]:
        """Answer as GPU ``index`` of a machine whose times are the recorded ones times
        ``slowdown`` (tests and simulations of several GPUs); returns its identity."""
        if not (slowdown > 0 and math.isfinite(slowdown)):
            raise ValueError(f"a GPU's slowdown must be a positive number, not {slowdown!r}")
        self._gpu = {"uuid": f"GPU-replay-{index}", "index": int(index),
                     "name": self._landscape.device.name}
        self._slowdown = float(slowdown)
        return dict(self._gpu)

    def device_info(self) -> DeviceInfo:
        return self._landscape.device

    def measure(
        self,
        binary: Binary | None,
        launch: Launch | None,
        family_name: str,
        problem: Problem,
        *,
        params: Mapping[str, Any] | None = None,
        **_timing: Any,
    ) -> Measurement:
        recorded = self._lookup.get(params_key(self._complete(dict(params or {}))))
        if recorded is None:
            return Measurement.failed("invalid", NOT_RECORDED, replayed=True, gpu=dict(self._gpu))
        if not self._gpu:
            return replace(recorded, replayed=True)
        timing, f = recorded.timing, self._slowdown
        if timing is not None and f != 1.0:
            timing = Timing(timing.median_ms * f, timing.min_ms * f, timing.max_ms * f,
                            timing.iqr_ms * f, timing.repetitions)
        return replace(recorded, replayed=True, timing=timing, gpu=dict(self._gpu))

    def retime(
        self,
        kernels: Sequence[tuple[Binary | None, Launch | None]],
        family_name: str,
        problem: Problem,
        *,
        params: Sequence[Mapping[str, Any]] | None = None,
        **_timing: Any,
    ) -> Retiming:
        """GpuBench.retime's answer from the landscape: each config's recorded measurement,
        by ``params`` (one per kernel); no clocks, no rounds."""
        configs = list(params or [])
        if len(configs) != len(kernels):
            raise ValueError(f"{len(kernels)} kernels but {len(configs)} params")
        return Retiming(tuple(self.measure(None, None, family_name, problem, params=p) for p in configs),
                        rounds=0, replayed=True, gpu=dict(self._gpu))

    def close(self) -> None:
        pass
