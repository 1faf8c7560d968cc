"""What attention_turns.py and gemm_turns.py share: a family's configs rendered from several
versions of one template, compiled, verified, then timed in turns with a peer and printed with the
peer's time over each kernel's by two methods."""

from __future__ import annotations

import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import torch

from workers.compile import compile_cubin
from workers.hold import stream_handle
from workers.kernel_run import verified_run
from workers.peers import do_bench_ms, held_timer
from workers.results import CompileRequest

REPS = 200


class Switch:
    """Stands in for one of a family's templates: renders whichever version is selected."""

    def __init__(self, versions: dict[str, object]) -> None:
        self.versions, self.selected = versions, "current"

    def render(self, **context: object) -> str:
        return self.versions[self.selected].render(**context)


@contextmanager
def template_versions(render, key: str, files: list[str]) -> Iterator[Switch]:
    """``render._TEMPLATES[key]`` (a family's render module) replaced, while the block runs, by a
    Switch over it ("current") and each file's template (by its name)."""
    current = render._TEMPLATES[key]
    switch = Switch({"current": current} | {Path(f).name: render._ENVIRONMENT.from_string(Path(f).read_text())
                                            for f in files})
    render._TEMPLATES[key] = switch
    try:
        yield switch
    finally:
        render._TEMPLATES[key] = current


def time_versions(family, problem, configs: list[dict], switch: Switch, bench,
                  label: Callable[[dict, str], str], peer: tuple[str, Callable[[], None]]) -> None:
    """Each valid config in each of ``switch``'s versions, labelled ``label(config, version)``,
    verified, then timed in turns with ``peer`` (its name and a call) and printed."""
    runs, trials = verified_kernels(family, problem, configs, switch, bench, label)
    try:
        name, call = peer
        time_and_print(problem.key, {name: call, **runs}, name, family.flops(problem))
    finally:
        for trial in trials:
            trial.release()


def verified_kernels(family, problem, configs: list[dict], switch: Switch, bench, label) -> tuple[dict, list]:
    """Each valid config in each of ``switch``'s versions, compiled on every core, checked by the
    workers' verification (outputs poisoned, float64 reference): ``label(config, version)`` to a
    launch on torch's stream, and the trials to release."""
    limits = bench.device_info().limits
    kernels = [(c, v) for c in configs if family.check(c, problem, limits) is None for v in switch.versions]
    requests = []
    for config, version in kernels:
        switch.selected = version
        requests.append(CompileRequest(family.render(config, problem), family.launch(config, problem).kernel,
                                       tuple(family.compile_options(config, problem))))
    with ThreadPoolExecutor(os.cpu_count()) as pool:  # nvcc runs apart: a thread waits on each
        list(pool.map(compile_cubin, requests))
    stream = stream_handle(torch.cuda.current_stream().cuda_stream)
    runs, trials = {}, []
    for config, version in kernels:
        switch.selected = version
        trial = verified_run(bench, family, problem, config)
        trials.append(trial)
        runs[label(config, version)] = (lambda t: lambda: t.launch_on(stream))(trial)
    return runs, trials


def time_and_print(title: str, runs: dict[str, Callable[[], None]], peer: str, flops: float) -> None:
    """Warms each of ``runs`` up, times them all by ``HeldTimer.time_each`` (the workers' flush,
    held events, REPS repetitions in turns), then each by ``triton.testing.do_bench``; prints a
    line a run, the fastest first: its median, TFLOPS and ``peer``'s time over its own by both."""
    timer = held_timer(torch)
    try:
        for run in runs.values():
            for _ in range(10):
                run()
        samples, late = timer.time_each(runs, REPS)
        medians = {name: statistics.median(times) for name, times in samples.items()}
        second = {name: do_bench_ms(run) for name, run in runs.items()}
        print(f"\n{title}: {len(runs) - 1} kernels and {peer} in turns, {REPS} repetitions, {late} late holds")
        for name in sorted(medians, key=medians.get):
            print(f"  {1e3 * medians[name]:8.1f} us {flops / medians[name] / 1e9:5.0f} TFLOPS  {peer}/this "
                  f"{medians[peer] / medians[name]:.3f} (do_bench {second[peer] / second[name]:.3f})  {name}",
                  flush=True)
        torch.cuda.synchronize()
    finally:
        timer.hold.close()
