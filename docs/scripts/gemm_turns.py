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
import os
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gemm_timing  # noqa: E402  (this folder's script: the problem's parsing and its peer)

from templates.gemm import render as gemm_render  # noqa: E402
from workers.compile import compile_cubin  # noqa: E402
from workers.gpu import GpuBench  # noqa: E402
from workers.hold import stream_handle  # noqa: E402
from workers.kernel_run import verified_run  # noqa: E402
from workers.peers import do_bench_ms, held_timer  # noqa: E402
from workers.results import CompileRequest  # noqa: E402

REPS = 200
FAMILY = gemm_timing.FAMILY


class _Switch:
    """Stands in for the wgmma path's template: renders whichever version is selected."""

    def __init__(self, versions: dict[str, object]) -> None:
        self.versions, self.selected = versions, "current"

    def render(self, **context: object) -> str:
        return self.versions[self.selected].render(**context)


def _label(config: dict, version: str) -> str:
    kind = "ping-pong" if config.get("PINGPONG") else ("cooperative, persistent" if config["PERSISTENT"] else "cooperative")
    return f"{config['BLOCK_M']}x{config['BLOCK_N']} {config['STAGES']} stages {kind}, C {config['C_STORE']} | {version}"


def time_problem(problem, configs: list[dict], switch: _Switch, bench: GpuBench) -> None:
    limits = bench.device_info().limits
    kernels = [(c, v) for c in configs if FAMILY.check(c, problem, limits) is None for v in switch.versions]
    requests = []
    for config, version in kernels:
        switch.selected = version
        requests.append(CompileRequest(FAMILY.render(config, problem), FAMILY.launch(config, problem).kernel,
                                       tuple(FAMILY.compile_options(config, problem))))
    with ThreadPoolExecutor(os.cpu_count()) as pool:  # nvcc runs apart: a thread waits on each
        list(pool.map(compile_cubin, requests))
    stream = stream_handle(torch.cuda.current_stream().cuda_stream)
    runs, trials = {"peer": gemm_timing.peer(problem)}, []
    for config, version in kernels:
        switch.selected = version
        trial = verified_run(bench, FAMILY, problem, config)
        trials.append(trial)
        runs[_label(config, version)] = (lambda t: lambda: t.launch_on(stream))(trial)
    timer = held_timer(torch)
    for run in runs.values():
        for _ in range(10):
            run()
    samples, late = timer.time_each(runs, REPS)
    medians = {name: statistics.median(times) for name, times in samples.items()}
    second = {name: do_bench_ms(run) for name, run in runs.items()}
    m, n, k = problem.shape
    print(f"\n{problem.key}: {len(kernels)} kernels and the peer in turns, {REPS} repetitions, {late} late holds")
    for name in sorted(medians, key=medians.get):
        print(f"  {1e3 * medians[name]:8.1f} us {2.0 * m * n * k / medians[name] / 1e9:5.0f} TFLOPS  peer/this "
              f"{medians['peer'] / medians[name]:.3f} (do_bench {second['peer'] / second[name]:.3f})  {name}",
              flush=True)
    torch.cuda.synchronize()
    for trial in trials:
        trial.release()
    timer.hold.close()


def main(problems: str, config_file: str, others: list[str]) -> None:
    configs = [{**FAMILY.default_params(), **c} for c in json.loads(Path(config_file).read_text())]
    current = gemm_render._TEMPLATES["wgmma"]
    versions = {"current": current} | {Path(f).name: gemm_render._ENVIRONMENT.from_string(Path(f).read_text())
                                        for f in others}
    switch = _Switch(versions)
    gemm_render._TEMPLATES["wgmma"] = switch
    bench = GpuBench(0)
    try:
        for spec in problems.split(";"):
            time_problem(gemm_timing.parse(*spec.split()), configs, switch, bench)
    finally:
        gemm_render._TEMPLATES["wgmma"] = current


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
