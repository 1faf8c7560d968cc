"""How fast each compiler backend turns attention configs into cubins, all cores at once, and
whether the two give the same machine code.

    PYTHONPATH=<checkout> python3 docs/scripts/compile_rate.py 2,8,1024,64 fp16 1 64 [PROCESSES]

Compiles the same COUNT valid configs (spread over the space) with nvcc and with NVRTC, without
the cache, PROCESSES at a time (default: the CPUs), and prints one JSON line per backend; then
compares the SASS of each pair (``cuobjdump -sass``, where it is installed).
"""
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from templates import get_family
from templates.family import DeviceLimits
from workers.compile import compile_cubin
from workers.results import CompileRequest

HOPPER = DeviceLimits("H100 or H200", (9, 0), 132, 232448)


def _compile(job):
    backend, source, kernel, options = job
    start = time.perf_counter()
    binary = compile_cubin(CompileRequest(source, kernel, options), backend=backend, cache_dir=None)
    return time.perf_counter() - start, binary.cubin


def _sass(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout


def main(shape: str, dtype: str, causal: str, count: str, processes: str | None = None) -> None:
    family = get_family("attention")
    problem = family.parse_problem(shape, dtype, {"causal": causal == "1"})
    configs = list(family.valid_configs(problem, HOPPER))
    step = max(1, len(configs) // int(count))
    picked = configs[::step][: int(count)]
    jobs = [(family.render(p, problem), family.launch(p, problem).kernel,
             tuple(family.compile_options(p, problem))) for p in picked]
    workers = int(processes or os.cpu_count() or 1)
    cubins = {}
    for backend in ("nvcc", "nvrtc"):
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            pool.map(_compile, [(backend, *jobs[0])] * workers)  # each process loads its compiler
            start = time.perf_counter()
            results = pool.map(_compile, [(backend, *job) for job in jobs], chunksize=1)
            wall = time.perf_counter() - start
        cubins[backend] = [cubin for _, cubin in results]
        print("COMPILE " + json.dumps({
            "backend": backend, "configs": len(jobs), "processes": workers, "wall_s": round(wall, 2),
            "configs_per_s": round(len(jobs) / wall, 2),
            "median_s": round(statistics.median(s for s, _ in results), 3),
            "max_s": round(max(s for s, _ in results), 3)}), flush=True)
    if shutil.which("cuobjdump"):
        same = sum(_sass(a) == _sass(b) for a, b in zip(cubins["nvcc"], cubins["nvrtc"]))
        print(f"COMPILE same SASS: {same} of {len(jobs)}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
