"""Compile and measure in this process, without Ray: for benchmarks that sit beside peers.

    from workers.local import LocalBench
    with LocalBench() as bench:
        measurement = bench.measure("attention", problem, source, launch, options)
        with bench.launcher("attention", problem, source, launch, options) as run:
            run()                               # queued on torch's current stream
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from templates.family import KernelFamily, Launch, Params, Problem
from workers.compile import compile_cubin, default_cache_dir
from workers.errors import CompileError
from workers.hold import stream_handle
from workers.results import Binary, CompileRequest, DeviceInfo, Measurement
from workers.timing_options import TimingOptions


class LocalBench:
    """One GpuBench on GPU 0 of this process, with the compile cache the workers use."""

    def __init__(self, device_ordinal: int = 0, **measure_options: Any) -> None:
        from workers.gpu import GpuBench

        self._bench = GpuBench(device_ordinal)
        self._timing = TimingOptions.of(measure_options)

    @property
    def device(self) -> DeviceInfo:
        return self._bench.device_info()

    def measure(self, family: str | KernelFamily, problem: Problem, source: str, launch: Launch,
                options: Sequence[str], *, seed: int = 0) -> Measurement:
        try:
            binary = _compiled(source, launch, options)
        except CompileError as exc:
            return Measurement.failed("compile", str(exc), detail=exc.log[-2000:])
        return self._bench.measure(binary, launch, family, problem, seed=seed, timing=self._timing)

    def failures(self, family: KernelFamily, configs: Sequence[tuple[Problem, Params]]) -> list[str]:
        """Each (problem, params) rendered, compiled and measured (the workers' checks: outputs
        poisoned, two runs compared, the family's reference): a line for each that failed."""
        lines = []
        for problem, params in configs:
            m = self.measure(family, problem, family.render(params, problem), family.launch(params, problem),
                             family.compile_options(params, problem))
            if not m.ok:
                lines.append(f"{problem.key} {dict(params)}: {m.failure}: {m.reason}")
        return lines

    def do_bench(self, family: str | KernelFamily, problem: Problem, source: str, launch: Launch,
                 options: Sequence[str], *, seed: int = 0) -> float | None:
        """The same kernel timed a second way: ``triton.testing.do_bench``'s median (its own L2
        clearing and events, on torch's current stream), on the inputs ``measure`` used. None
        where torch or Triton is missing, or the kernel does not pass its checks."""
        from workers.peers import do_bench_ms

        with self.launcher(family, problem, source, launch, options, seed=seed) as run:
            return do_bench_ms(run) if run is not None else None

    @contextmanager
    def launcher(self, family: str | KernelFamily, problem: Problem, source: str, launch: Launch,
                 options: Sequence[str], *, seed: int = 0) -> Iterator[Callable[[], None] | None]:
        """A call that queues the kernel on torch's current stream, on the inputs ``measure``
        used, once it has passed the workers' checks (for timing it beside torch calls); None
        where torch is missing or the kernel fails its checks."""
        try:
            import torch
        except ImportError:
            yield None
            return
        from templates import get_family
        from workers.kernel_run import verified

        try:
            trial = verified(self._bench, _compiled(source, launch, options), launch, get_family(family),
                             problem, seed=seed)
        except (CompileError, ValueError):
            yield None
            return
        try:
            stream = stream_handle(torch.cuda.current_stream().cuda_stream)
            yield lambda: trial.launch_on(stream)
        finally:
            torch.cuda.synchronize()
            trial.release()

    def close(self) -> None:
        self._bench.close()

    def __enter__(self) -> "LocalBench":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _compiled(source: str, launch: Launch, options: Sequence[str]) -> Binary:
    """The cubin of ``source`` (the workers' compile cache)."""
    return compile_cubin(CompileRequest(source, launch.kernel, tuple(options)), cache_dir=default_cache_dir())
