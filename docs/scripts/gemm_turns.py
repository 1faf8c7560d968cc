"""Gemm configs of the wgmma path timed in turns with cuBLAS (cuBLASLt with a fused epilogue), in
one process on one GPU, each rendered from the current template and from other versions of it:

    git show REV:templates/gemm/hopper.cu.j2 > before.cu.j2
    python3 docs/scripts/gemm_turns.py "8192,3072,768 bf16 nt:bias;4096,4096,11008 fp16 nt" configs.json before.cu.j2

Problems as ``docs/scripts/gemm_timing.py`` takes them (shape, type, layout with an optional
epilogue), separated by ``;``. ``configs.json``: a list of parameter dicts (missing parameters
take the family's defaults). Every (config, template) is compiled on all cores, checked by the
workers' verification (outputs poisoned, float64 reference), then timed with the peer by
``HeldTimer.time_each`` (the workers' flush, held events, REPS repetitions in turns) and once more
each by ``triton.testing.do_bench``. Prints a line a kernel, the fastest first: its median, TFLOPS
and the peer's time over its own by both methods.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gemm_timing  # noqa: E402  (this folder's scripts: the problem's parsing and its peer; the timing)
from in_turns import Switch, time_and_print, verified_kernels  # noqa: E402

from templates.gemm import render as gemm_render  # noqa: E402
from workers.gpu import GpuBench  # noqa: E402

FAMILY = gemm_timing.FAMILY


def _label(config: dict, version: str) -> str:
    kind = "ping-pong" if config.get("PINGPONG") else ("cooperative, persistent" if config["PERSISTENT"] else "cooperative")
    return f"{config['BLOCK_M']}x{config['BLOCK_N']} {config['STAGES']} stages {kind}, C {config['C_STORE']} | {version}"


def time_problem(problem, configs: list[dict], switch: Switch, bench: GpuBench) -> None:
    runs, trials = verified_kernels(torch, FAMILY, problem, configs, switch, bench, _label)
    try:
        m, n, k = problem.shape
        time_and_print(torch, problem.key, {"peer": gemm_timing.peer(problem), **runs}, "peer", 2.0 * m * n * k)
    finally:
        for trial in trials:
            trial.release()


def main(problems: str, config_file: str, others: list[str]) -> None:
    configs = [{**FAMILY.default_params(), **c} for c in json.loads(Path(config_file).read_text())]
    current = gemm_render._TEMPLATES["wgmma"]
    versions = {"current": current} | {Path(f).name: gemm_render._ENVIRONMENT.from_string(Path(f).read_text())
                                        for f in others}
    switch = Switch(versions)
    gemm_render._TEMPLATES["wgmma"] = switch
    bench = GpuBench(0)
    try:
        for spec in problems.split(";"):
            time_problem(gemm_timing.parse(*spec.split()), configs, switch, bench)
    finally:
        gemm_render._TEMPLATES["wgmma"] = current


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
