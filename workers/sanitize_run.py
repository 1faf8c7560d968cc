"""The program compute-sanitizer's tools watch (``workers.sanitizer``): one config compiled (the
compile cache answers: the caller compiled it first), loaded on GPU 0 and run on the family's
inputs as a GPU worker's trial checks it (``workers.kernel_run.verified``: two runs on poisoned
outputs, the checks on the GPU, the family's reference), then released::

    python -m workers.sanitize_run SPEC.json OUT.json

SPEC.json is a ``workers.sanitizer.RunSpec``; OUT.json gets ``{"ok": true}`` or the failure and
its reason (``{"ok": false, "failure": "crash", "reason": "CUDA_ERROR_ILLEGAL_ADDRESS during ..."}``).
The exit code is 0 whenever OUT.json was written: what the tool found is in its own log.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from templates import get_family
from templates.family import Problem
from workers.compile import compile_cubin, default_cache_dir
from workers.errors import CompileError, LaunchError, NoGPUError
from workers.results import CompileRequest


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Compile, load, run and check ``spec``'s config once; what came of it."""
    from workers.gpu import GpuBench
    from workers.kernel_run import verified

    family = get_family(spec["family"])
    problem = Problem.from_json(spec["problem"])
    params = spec["params"]
    launch = family.launch(params, problem)
    try:
        binary = compile_cubin(CompileRequest(family.render(params, problem), launch.kernel,
                                              tuple(family.compile_options(params, problem))),
                               cache_dir=spec.get("cache_dir") or default_cache_dir())
    except CompileError as error:
        return {"ok": False, "failure": "compile", "reason": str(error)}
    try:
        bench = GpuBench(0)
    except NoGPUError as error:
        return {"ok": False, "failure": "worker", "reason": str(error)}
    trial = None
    try:
        trial = verified(bench, binary, launch, family, problem, seed=int(spec.get("seed", 0)))
        return {"ok": True}
    except ValueError as failed:  # the checks refused the output: "kind: reason"
        kind, _, reason = str(failed).partition(": ")
        return {"ok": False, "failure": kind, "reason": reason}
    except LaunchError as error:
        result = bench.classify(error, "the run")
        return {"ok": False, "failure": result.failure, "reason": result.reason}
    finally:
        if trial is not None and not bench.dead:
            trial.release()
        bench.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m workers.sanitize_run SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec, out = Path(argv[0]), Path(argv[1])
    result = run(json.loads(spec.read_text()))
    out.write_text(json.dumps(result))
    print(f"sanitize_run: {'ok' if result['ok'] else result['failure'] + ': ' + result['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
