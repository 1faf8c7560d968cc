"""Attention configs of the TMA path timed in turns with cuDNN, in one process on one GPU, each
rendered from the current template and from other versions of it:

    git show REV:templates/attention/hopper.cu.j2 > before.cu.j2
    python3 docs/scripts/attention_turns.py "8,16,2048,128;4,16,4096,128" fp16 configs.json before.cu.j2

``configs.json``: a list of parameter dicts over the TMA path's starting point (missing
parameters take it); a dtype of ``fp16:causal`` sets the mask. Every (config, template) is
compiled on all cores, checked by the workers' verification (outputs poisoned, float64 reference),
then timed with cuDNN by ``HeldTimer.time_each`` (the workers' flush, held events, REPS
repetitions in turns) and once more each by ``triton.testing.do_bench``. Prints a line a kernel,
the fastest first: its median, TFLOPS and cuDNN's time over its own by both methods.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from templates import get_family
from templates.attention import render as attention_render
from templates.attention.peers import peer_calls
from templates.attention.starts import TMA
from workers.compile import compile_cubin
from workers.gpu import GpuBench
from workers.hold import stream_handle
from workers.kernel_run import verified_run
from workers.peers import do_bench_ms, held_timer
from workers.results import CompileRequest

REPS = 200
FAMILY = get_family("attention")


class _Switch:
    """Stands in for the TMA path's template: renders whichever version is selected."""

    def __init__(self, versions: dict[str, object]) -> None:
        self.versions, self.selected = versions, "current"

    def render(self, **context: object) -> str:
        return self.versions[self.selected].render(**context)


def _label(config: dict, version: str) -> str:
    return (f"{config['BLOCK_M']}x{config['BLOCK_N']} {config['STAGES']} stages pingpong {config['PINGPONG']} "
            f"{config['SCHEDULE']} {config['EPILOGUE']} {config['TILE_ORDER']} | {version}")


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
    runs, trials = {"cudnn": peer_calls(problem, FAMILY.inputs(problem, 0))["cudnn"].run}, []
    for config, version in kernels:
        switch.selected = version
        trial = verified_run(bench, FAMILY, problem, config)
        trials.append(trial)
        runs[_label(config, version)] = (lambda t: lambda: t.launch_on(stream))(trial)
    timer = held_timer(torch)
    for run in runs.values():
        for _ in range(5):
            run()
    samples, late = timer.time_each(runs, REPS)
    medians = {name: statistics.median(times) for name, times in samples.items()}
    second = {name: do_bench_ms(run) for name, run in runs.items()}
    flops = FAMILY.flops(problem)
    print(f"\n{problem.key}: {len(kernels)} kernels and cuDNN in turns, {REPS} repetitions, {late} late holds")
    for name in sorted(medians, key=medians.get):
        print(f"  {1e3 * medians[name]:8.1f} us {flops / medians[name] / 1e9:5.0f} TFLOPS  cudnn/this "
              f"{medians['cudnn'] / medians[name]:.3f} (do_bench {second['cudnn'] / second[name]:.3f})  {name}",
              flush=True)
    torch.cuda.synchronize()
    for trial in trials:
        trial.release()
    timer.hold.close()


def main(shapes: str, dtype: str, config_file: str, others: list[str]) -> None:
    dtype, _, mask = dtype.partition(":")
    configs = [{**FAMILY.default_params(), **TMA, **c} for c in json.loads(Path(config_file).read_text())]
    current = attention_render._TEMPLATES["tma"]
    versions = {"current": current} | {Path(f).name: attention_render._ENVIRONMENT.from_string(Path(f).read_text())
                                        for f in others}
    switch = _Switch(versions)
    attention_render._TEMPLATES["tma"] = switch
    bench = GpuBench(0)
    try:
        for shape in shapes.split(";"):
            time_problem(FAMILY.parse_problem(shape, dtype, {"causal": mask == "causal"}), configs, switch, bench)
    finally:
        attention_render._TEMPLATES["tma"] = current


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
