"""What one Ray actor call costs the caller's CPU: with the pool's arguments (separate, and packed
as one request: ``workers.request``), with two small ones, and a trial's share when a batch of
trials goes in one call (docs/BENCHMARKS.md, "Scale by simulation", 2026-11-27).

    python3 docs/scripts/ray_call_cost.py [--calls 2000]

One async actor (``num_cpus=0``) on a local Ray; the caller's process CPU time while it submits,
and the wall time until every answer is back, a call (or a trial, for the batches).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    calls = parser.parse_args().calls

    import ray

    from templates import get_family
    from templates.family import H100_LIMITS
    from workers.request import pack

    fam = get_family("attention")
    problem = fam.parse_problem("4,8,512,64", "fp16", {"causal": True})
    configs = fam.valid_configs(problem, H100_LIMITS)
    launch = fam.launch(configs[0], problem)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")

    @ray.remote(num_cpus=0)
    class Host:
        async def measure(self, binary, launch, family, problem, *, gpu=0, params=None, **options):
            return 1

        async def measure_request(self, family, request):
            return 1

        async def light(self, gpu, params):
            return 1

        async def many(self, items):
            return len(items)

    ship = ray.put(fam)
    host = Host.remote()
    ray.get(host.measure.remote(None, launch, ship, problem, gpu=0))

    def timed(name: str, submit, count: int, per: int = 1) -> None:
        cpu, wall = time.process_time(), time.perf_counter()
        refs = [submit(i) for i in range(count)]
        cpu = time.process_time() - cpu
        ray.get(refs)
        wall = time.perf_counter() - wall
        trials = count * per
        print(f"{name}: submit CPU {cpu / trials * 1e6:.0f} us a trial, wall {wall / trials * 1e6:.0f} us a trial")

    pick = lambda i: configs[i % len(configs)]  # noqa: E731
    timed("one call a trial, the pool's arguments",
          lambda i: host.measure.remote(None, launch, ship, problem, gpu=i % 64, params=pick(i), seed=0,
                                        abort_above_ms=1.0), calls)
    for size in (0, 60_000):  # no cubin, and a 60 KB stand-in
        binary = b"\x7fELF" * (size // 4) or None
        timed(f"one call a trial, the pool's arguments, {size // 1000} KB binary",
              lambda i: host.measure.remote(binary, launch, "attention", problem, params=pick(i), seed=0,
                                            abort_above_ms=1.0), calls)
        timed(f"one call a trial, packed (workers.request), {size // 1000} KB binary",
              lambda i: host.measure_request.remote("attention", pack(binary, launch, problem, pick(i),
                                                                      {"seed": 0, "abort_above_ms": 1.0})), calls)
    timed("one call a trial, two arguments", lambda i: host.light.remote(i % 64, pick(i)), calls)
    for batch in (16, 64):
        timed(f"{batch} trials a call", lambda i: host.many.remote(
            [(j % 64, pick(j), launch) for j in range(i * batch, (i + 1) * batch)]), calls // batch, batch)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
