"""One GEMM config of ours and cuBLAS on the same problem, timed several ways in one process on one
GPU, to see where `tuner bench`'s held ratio and `triton.testing.do_bench`'s part:

    python3 docs/scripts/gemm_timing.py 4096,4096,4096 fp16 nn '{"BLOCK_M": 128, ...}' [--rounds 2]
    python3 docs/scripts/gemm_timing.py 4096,4096,4096 fp16 nn '[{...}, {...}]'     # configs in turns

Ways, each the median of REPS repetitions with the L2 flushed before each (but "no flush"):
- ``trial``: the workers' timing of ours (``kernel_run.repeat_in_turns``: the bench's stream, its flush, holds);
- ``held``: ``workers.peers.HeldTimer`` on torch's stream, ours (``KernelRun.launch_on``) and cuBLAS;
- ``alternate``: the same holds, ours and cuBLAS one after the other in every batch (no drift of
  clocks between the two sets);
- ``do_bench``: ``triton.testing.do_bench``, each;
- ``no flush``: held, without the flush.
The SM clock and power are read (NVML) while each way runs. Rounds repeat the whole sequence,
the second in reverse order, so that an order effect shows.

Given a list of configs (JSON, or a ``.json`` file's path): all of them and cuBLAS in turns
(``HeldTimer.time_each``), REPS repetitions each, then ``do_bench`` of each; a line a config, the
fastest first. The layout may name an epilogue after a colon (``nt:bias_relu``): cuBLAS's call
is then cuBLASLt's with that epilogue fused. The type may name e4m3's scales (``e4m3:block``);
the line "cublas" is then the family's peer for them. ``all:{"BLOCK_M": 64, "STAGES": [6, 8]}`` for every
valid wgmma config of the problem that matches (a value or a list of values a parameter; a list
of such patterns: any of them). The configs compile on every
core first. ``--flush read,memset`` times the turns once a flush: ``read`` is the workers' (the L2's size
read: clean lines), ``memset`` writes the L2's size instead (the workers' flush until
2026-11-27: it leaves the L2 full of dirty lines that the timed kernel's reads must write back),
``read2`` reads twice the L2's size. A config the family's constraints refuse is not run. ``--names`` prints the
kernels cuBLAS launched (its tile, cluster and schedule are in their names).
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time

import torch

from templates import get_family
from templates.gemm.peers import cublas_call, operands, peer_calls
from workers.driver import check_call, driver_api
from workers.hold import stream_handle
from workers.gpu import GpuBench
from workers.peers import do_bench_ms, held_timer
from workers.kernel_run import repeat_in_turns, verified_run

REPS = 200
FAMILY = get_family("gemm")


def alternate(timer, runs, reps):
    """Each of ``runs`` timed in turn, every repetition, behind the same holds: medians in ms."""
    samples, _ = timer.time_each(runs, reps)
    return {name: statistics.median(times) for name, times in samples.items()}


def main(shape: str, dtype: str, layout: str, params: dict, rounds: int) -> None:
    problem = FAMILY.parse_problem(shape, dtype, {"layout": layout})
    params = dict(FAMILY.default_params(), **params)
    bench = GpuBench(0)
    trial = verified_run(bench, FAMILY, problem, params)
    a, b, _ = operands(problem, FAMILY.inputs(problem, 0))
    tstream = stream_handle(torch.cuda.current_stream().cuda_stream)
    ours = lambda: trial.launch_on(tstream)  # noqa: E731
    cublas = lambda: torch.matmul(a, b)  # noqa: E731
    timer = held_timer(torch)
    m, n, k = problem.shape
    flops = 2.0 * m * n * k

    def sampled(fn):
        """fn's value, and the median SM clock and power NVML read every 2 ms while it ran."""
        samples, done = [], threading.Event()

        def poll():
            while not done.is_set():
                c = bench.clocks_now()
                if c:
                    samples.append((c.get("sm_mhz", 0), c.get("power_w", 0.0)))
                time.sleep(0.002)

        thread = threading.Thread(target=poll)
        thread.start()
        try:
            value = fn()
            torch.cuda.synchronize()
        finally:
            done.set()
            thread.join()
        if not samples:
            return value, "no clocks"
        return value, (f"{statistics.median(s[0] for s in samples):.0f} MHz "
                       f"{statistics.median(s[1] for s in samples):.0f} W, {len(samples)} reads")

    for _ in range(200):  # a steady GPU: about a second of cuBLAS
        cublas()
    torch.cuda.synchronize()
    rows = []

    def way(name, fn):
        value, clk = sampled(fn)
        rows.append((name, value, clk))

    steps = [
        ("trial ours", lambda: (trial.warm_up(25.0), statistics.median(repeat_in_turns([trial], REPS, True)[0]))[1]),
        ("held ours", lambda: statistics.median(timer.time(ours, REPS)[0])),
        ("held cublas", lambda: statistics.median(timer.time(cublas, REPS)[0])),
        ("alternate", lambda: alternate(timer, {"ours": ours, "cublas": cublas}, REPS)),
        ("do_bench ours", lambda: do_bench_ms(ours)),
        ("do_bench cublas", lambda: do_bench_ms(cublas)),
        ("no flush ours", lambda: _noflush(timer, ours)),
        ("no flush cublas", lambda: _noflush(timer, cublas)),
    ]
    for r in range(rounds):
        for name, fn in (steps if r % 2 == 0 else steps[::-1]):
            way(f"r{r} {name}", fn)
    print(f"\n{problem.key} {json.dumps({k: v for k, v in params.items()})}")
    for name, value, clk in rows:
        if isinstance(value, dict):
            text = ", ".join(f"{k} {1e3 * v:.1f} us ({flops / v / 1e9:.0f} TFLOPS)" for k, v in value.items())
            text += f", cublas/ours {value['cublas'] / value['ours']:.3f}"
        else:
            text = f"{1e3 * value:.1f} us ({flops / value / 1e9:.0f} TFLOPS)"
        print(f"  {name:22s} {text}   [{clk}]")
    torch.cuda.synchronize()
    trial.release()
    timer.hold.close()


def _noflush(timer, run):
    saved = timer._flush
    timer._flush = lambda index: None
    try:
        return statistics.median(timer.time(run, REPS)[0])
    finally:
        timer._flush = saved


def other_flush(timer, flush):
    """``memset``: a write of the L2's size (each word the repetition's index); ``read2``: a read of
    twice its size; on the timer's stream."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    buffer = torch.zeros(2 * l2, dtype=torch.int8, device="cuda")
    if flush == "read2":
        return lambda index: timer.hold.flush(buffer.data_ptr(), buffer.numel())
    d = driver_api()
    return lambda index: check_call("cuMemsetD32Async", d.cuMemsetD32Async(
        buffer.data_ptr(), index, l2 // 4, timer.hold.stream))


def kernel_names(run) -> list[str]:
    """The CUDA kernels one call of ``run`` launches."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def _compile(args) -> None:
    from workers.compile import compile_cubin
    from workers.results import CompileRequest

    problem, params = args
    try:
        compile_cubin(CompileRequest(FAMILY.render(params, problem), FAMILY.launch(params, problem).kernel,
                                     tuple(FAMILY.compile_options(params, problem))))
    except Exception:  # noqa: BLE001 - verified_run compiles it again and says why
        pass


def parse(shape: str, dtype: str, layout: str):
    """The problem; ``layout`` may name an epilogue after a colon: ``nt:bias_gelu_tanh``; ``dtype``
    e4m3's scales after one: ``e4m3:block`` (``e4m3``: per tensor; C in bf16)."""
    layout, _, epilogue = layout.partition(":")
    dtype, _, scale = dtype.partition(":")
    flags = {"layout": layout, "epilogue": epilogue or "none"}
    if dtype == "e4m3":
        flags |= {"scale": scale or "tensor", "out_dtype": "bf16"}
    return FAMILY.parse_problem(shape, dtype, flags)


def peer(problem):
    """cuBLAS's call (cuBLASLt's with a fused epilogue); e4m3: the family's peer for its scales
    (``torch._scaled_mm`` per tensor, the autotuned Triton kernel per block)."""
    inputs = FAMILY.inputs(problem, 0)
    if problem.dtype == "e4m3":
        calls = peer_calls(problem, inputs)
        return next(call.run for call in calls.values() if call.run is not None)
    a, b, bias = operands(problem, inputs)
    return cublas_call(a, b, bias, problem.flag("epilogue"))


def matching(problem, wanted: list[dict]) -> list[dict]:
    """Every valid wgmma config of ``problem`` (on an H100's limits) whose parameters match one of
    ``wanted``."""
    from templates.family import H100_LIMITS

    def fits(config, want):
        return all(config[k] in (v if isinstance(v, list) else [v]) for k, v in want.items())
    return [c for c in FAMILY.valid_configs(problem, H100_LIMITS)
            if c["MMA"] == "wgmma" and any(fits(c, want) for want in wanted)]


def sweep(shape: str, dtype: str, layout: str, configs: list[dict], flushes=("read",),
          names: bool = False, wanted: list[dict] | None = None) -> None:
    import multiprocessing
    import os

    problem = parse(shape, dtype, layout)
    if wanted is not None:
        configs = matching(problem, wanted)
    with multiprocessing.get_context("spawn").Pool(os.cpu_count()) as pool:
        pool.map(_compile, [(problem, dict(FAMILY.default_params(), **c)) for c in configs])
    bench = GpuBench(0)
    tstream = stream_handle(torch.cuda.current_stream().cuda_stream)
    runs, trials, failed = {"cublas": peer(problem)}, [], []
    for i, config in enumerate(configs):
        params = dict(FAMILY.default_params(), **config)
        if (why := FAMILY.check(params, problem, bench.device_info().limits)) is not None:
            failed.append(f"{config}: {why}")
            continue
        try:
            trial = verified_run(bench, FAMILY, problem, params)
        except ValueError as exc:
            failed.append(f"{config}: {str(exc)[-200:]}")
            continue
        trials.append(trial)
        runs[json.dumps(config, sort_keys=True)] = (lambda t: lambda: t.launch_on(tstream))(trial)
    timer = held_timer(torch)
    workers = timer._flush
    for run in runs.values():
        for _ in range(10):
            run()
    m, n, k = problem.shape
    flops = 2.0 * m * n * k
    if names:
        print(f"\n{problem.key}: cuBLAS launches {kernel_names(runs['cublas'])}")
    second = {name: do_bench_ms(run) for name, run in runs.items()}
    for flush in flushes:
        timer._flush = workers if flush == "read" else other_flush(timer, flush)
        samples, late = timer.time_each(runs, REPS)
        medians = {name: statistics.median(v) for name, v in samples.items()}
        print(f"\n{problem.key}: {len(runs) - 1} configs and cuBLAS in turns, flush {flush}, {REPS} "
              f"repetitions, {late} late holds")
        for name in sorted(medians, key=medians.get):
            print(f"  {1e3 * medians[name]:7.1f} us {flops / medians[name] / 1e9:5.0f} TFLOPS  "
                  f"cublas/this {medians['cublas'] / medians[name]:.3f} (do_bench {second['cublas'] / second[name]:.3f})  {name}")
    for line in failed:
        print("  failed:", line)
    torch.cuda.synchronize()
    for trial in trials:
        trial.release()
    timer.hold.close()


if __name__ == "__main__":
    args = [x for x in sys.argv[1:] if not x.startswith("--")]
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
    if "--rounds" in sys.argv:
        args.remove(str(rounds))
    flushes = sys.argv[sys.argv.index("--flush") + 1].split(",") if "--flush" in sys.argv else ["read"]
    if "--flush" in sys.argv:
        args.remove(sys.argv[sys.argv.index("--flush") + 1])
    if args[3].startswith("all:"):
        pattern = json.loads(args[3][4:])
        sweep(args[0], args[1], args[2], [], flushes, "--names" in sys.argv,
              pattern if isinstance(pattern, list) else [pattern])
    else:
        given = json.load(open(args[3])) if args[3].endswith(".json") else json.loads(args[3])
        if isinstance(given, list):
            sweep(args[0], args[1], args[2], given, flushes, "--names" in sys.argv)
        else:
            main(args[0], args[1], args[2], given, rounds)
