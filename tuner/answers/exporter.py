"""Write a stored winner out as a CUDA source and the facts needed to launch it.

    path = write_export(render_export(family, problem, best_record), Path("out"))
    # out/attention_4x16x4096x128-fp16-causal.cu and, beside it, launch_path(path):
    # out/attention_4x16x4096x128-fp16-causal.launch.json (exports of several problems can
    # share a folder)

The source is re-rendered from the stored params with the current template, so the caller
must first check that the stored template hash is the current one (``tuner.api.export`` does).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from templates.family import KernelFamily, Problem

ARCH = "sm_90a"  # what the workers compile for (workers.results.CompileRequest.arch)


def arch_flags(arch: str = ARCH) -> tuple[str, str]:
    return ("-gencode", f"arch={arch.replace('sm_', 'compute_', 1)},code={arch}")


def source_name(family: KernelFamily, problem: Problem) -> str:
    return f"{family.name}_{problem.key}.cu"


def launch_path(source: Path) -> Path:
    """Where the launch facts of an exported ``.cu`` go: beside it, ``<name>.launch.json``."""
    return source.with_suffix(".launch.json")


def launch_document(family: KernelFamily, problem: Problem, best: Any, *, source: str) -> dict[str, Any]:
    """The content of the ``.launch.json``: how to compile and launch the winner, and how it did."""
    launch = family.launch(best.params, problem).to_json()
    flags = [*arch_flags(), *family.compile_options(best.params, problem)]
    return {
        "family": family.name,
        "source": source,
        "kernel": launch["kernel"],
        "grid": launch["grid"],
        "block": launch["block"],
        "dynamic_smem_bytes": launch["dynamic_smem_bytes"],
        "args": launch["args"],
        **{key: launch[key] for key in ("then", "workspace", "grid_x_max_blocks_per_sm") if key in launch},
        # what the kernel is called on, in order: inputs, then outputs (workers.loader checks a
        # caller's tensors against these)
        "tensors": tensors(family, problem),
        "compile_flags": flags,
        "params": dict(best.params),
        "problem": problem.to_json(),
        "measured": {
            "median_ms": best.median_ms,
            "interval_ms": best.interval_ms,  # the half-width of its noise (storage.ranking)
            "min_ms": best.min_ms,
            "max_ms": best.max_ms,
            "iqr_ms": best.iqr_ms,
            "tflops": best.tflops,
            "error": best.error,
            "max_abs_error": best.max_abs_error,
            "replayed": best.replayed,
            "retimed": best.retime is not None,  # the median is the interleaved re-timing's
            "search_median_ms": best.search_median_ms,
        },
        "resources": {
            "registers": best.registers,
            "smem_static": best.smem_static,
            "stack_bytes": best.stack_bytes,
            "spill_stores": best.spill_stores,
            "spill_loads": best.spill_loads,
        },
        "gpu": best.device.name,
        "compute_capability": best.device.compute_capability,
        "driver_version": best.device.driver_version,
        "cuda_version": best.device.cuda_version,
        "toolkit": best.toolkit,  # what compiled the measured cubin, e.g. "nvcc 13.0.88"
        "template_hash": best.template_hash,
        "study": best.study,
        "trial": best.trial_number,
        "measured_at": _iso(best.measured_at),
    }


def tensors(family: KernelFamily, problem: Problem) -> list[dict[str, Any]]:
    """The kernel's inputs then outputs: name, shape, element type, and whether it is written."""
    found = [{"name": name, "shape": list(shape), "dtype": element, "output": False}
             for name, (shape, element) in family.input_shapes(problem).items()]
    for spec in family.outputs(problem):
        found.append({"name": spec.name, "shape": list(spec.shape), "dtype": spec.element or np.dtype(spec.dtype).name,
                      "output": True})
    return found


@dataclass(frozen=True)
class Export:
    """An export before it is written: the ``.cu``'s name and text, and its launch document."""

    name: str  # <family>_<problem>.cu
    source: str
    launch: dict[str, Any]  # the .launch.json's content


def render_export(family: KernelFamily, problem: Problem, best: Any) -> Export:
    """The winner's source, rendered with the current template, and its launch document."""
    name = source_name(family, problem)
    return Export(name, family.render(best.params, problem),
                  launch_document(family, problem, best, source=name))


def write_export(files: Export, out_dir: Path) -> Path:
    """Write the ``.cu`` and its ``.launch.json`` into ``out_dir``; return the ``.cu`` path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cu = out_dir / files.name
    write_atomic(cu, files.source)
    write_atomic(launch_path(cu), json.dumps(files.launch, indent=2) + "\n")
    return cu


def _iso(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all, readable as any new file is (``0o666`` less the umask;
    mkstemp alone gives ``0o600``)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def _umask() -> int:
    mask = os.umask(0o022)  # read by setting it; put back at once
    os.umask(mask)
    return mask
