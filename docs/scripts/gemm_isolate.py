"""Each config of a list on one problem in a process of its own: compiled, verified by the workers'
checks, launched back to back, synchronized and verified again. A config that faults (an illegal
address ends its context) shows as its own line instead of ending the whole list:

    python3 docs/scripts/gemm_isolate.py 128,4096,4096 bf16 nt docs/scripts/configs/gemm_small_m.json
    python3 docs/scripts/gemm_isolate.py 128,4096,4096 bf16 nt FILE --index 3     # one config, here

A line each: the config's index, ``ok`` or what failed, and the config.
"""

from __future__ import annotations

import json
import subprocess
import sys

LAUNCHES = 30


def one(shape: str, dtype: str, layout: str, params: dict) -> str:
    from templates import get_family
    from workers.driver import check_call, driver_api
    from workers.gpu import GpuBench
    from workers.kernel_run import verified_run

    family = get_family("gemm")
    problem = family.parse_problem(shape, dtype, {"layout": layout})
    params = dict(family.default_params(), **params)
    bench = GpuBench(0)
    if (why := family.check(params, problem, bench.device_info().limits)) is not None:
        return f"skipped: {why}"
    try:
        trial = verified_run(bench, family, problem, params)
    except ValueError as exc:
        return f"failed the first check: {str(exc)[-300:]}"
    for _ in range(LAUNCHES):
        trial.launch_on(bench.stream)
    check_call("cuStreamSynchronize", driver_api().cuStreamSynchronize(bench.stream))
    failure, _ = trial.verify(family, problem)
    return "ok" if failure is None else f"failed after {LAUNCHES} launches: {failure.failure}: {failure.reason}"


def main(args: list[str]) -> None:
    shape, dtype, layout, path = args[:4]
    configs = json.load(open(path))
    if "--index" in args:
        params = configs[int(args[args.index("--index") + 1])]
        try:
            print(one(shape, dtype, layout, params))
        except Exception as exc:  # noqa: BLE001 - the fault is the result
            print(f"{type(exc).__name__}: {str(exc)[-300:]}")
        return
    for index, params in enumerate(configs):
        try:
            done = subprocess.run([sys.executable, __file__, shape, dtype, layout, path, "--index", str(index)],
                                  capture_output=True, text=True, timeout=120)
            lines = done.stdout.strip().splitlines()
            said = lines[-1] if lines else f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            said = "timed out (120 s)"
        short = {k: v for k, v in params.items() if k not in ("MMA", "BLOCK_K", "SMEM_LAYOUT")}
        print(f"{shape} {dtype} {layout} #{index}: {said}  {json.dumps(short)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
