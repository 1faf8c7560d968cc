"""Time chosen configs of the attention family beside torch SDPA, in one process, on the GPU.

    python3 docs/scripts/configs_vs_flash.py "4,16,4096,128;1,32,8192,128" fp16 configs.json

``configs.json`` is a list of parameter dicts (missing parameters take the family's defaults).
Every (problem, config) valid on the visible GPU is compiled in parallel, then measured with the
workers' method (LocalBench: poisoned outputs, float64 reference, CUDA events, L2 flushed) right
after SDPA's backends on the same inputs. Prints a line per kernel, then the best config of each
tensor-core path per problem with its ratio to SDPA flash and cuDNN; writes $OUT/variants.json.
Used for the 2026-11-22 comparison of the mma.sync and wgmma paths in docs/BENCHMARKS.md.
"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from templates import get_family
from workers.compile import compile_cubin, default_cache_dir
from workers.local import LocalBench
from workers.peers import time_peers
from workers.results import CompileRequest

FAMILY = get_family("attention")


def short(c):
    return "{MMA}/{BLOCK_M}/{BLOCK_N}/{NUM_WARPS}w/{STAGES}s/{SMEM_LAYOUT}/ws{WARP_SPECIALIZED}/q{Q_IN_REGS}".format(**c)


def main(shapes: str, dtypes: str, config_file: str) -> None:
    configs = [dict(FAMILY.default_params(), **c) for c in json.load(open(config_file))]
    problems = [FAMILY.parse_problem(s, d, {"causal": c}) for s in shapes.split(";") for d in dtypes.split(",")
                for c in (False, True)]
    bench = LocalBench(min_reps=10, max_reps=60, target_ms=150)
    info = bench.device
    limits = info.limits
    jobs = [(p, c) for p in problems for c in configs if FAMILY.check(c, p, limits) is None]
    print(f"{info.name}: {len(jobs)} kernels", flush=True)

    def build(job):
        p, c = job
        request = CompileRequest(FAMILY.render(c, p), "attention_fwd", FAMILY.compile_options(c, p))
        compile_cubin(request, cache_dir=default_cache_dir())

    start = time.time()
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(build, jobs))
    print(f"compiled in {time.time() - start:.0f} s", flush=True)
    rows = []
    for p in problems:
        peers = time_peers("attention", p, reps=50)
        for c in (c for q, c in jobs if q == p):
            m = bench.measure("attention", p, FAMILY.render(c, p), FAMILY.launch(c, p), FAMILY.compile_options(c, p))
            ms = m.timing.median_ms if m.ok else None
            rows.append(dict(problem=p.key, config=short(c), params=c, ok=m.ok, failure=m.failure,
                             median_ms=ms, tflops=FAMILY.tflops(p, ms) if ms else None, error=m.error,
                             flash_ms=peers["flash"].median_ms if peers else None,
                             cudnn_ms=peers["cudnn"].median_ms if peers else None))
            print(f"{p.key:32s} {short(c):44s} {'ok' if m.ok else m.failure:8s} {(ms or 0) * 1e3:9.1f} us", flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "variants.json"), "w"), indent=1)
    print("\nbest per problem:")
    for p in problems:
        ok = [r for r in rows if r["problem"] == p.key and r["ok"]]
        for mma in ("sync", "wgmma"):
            b = min((r for r in ok if r["params"]["MMA"] == mma), key=lambda r: r["median_ms"], default=None)
            if b and b["flash_ms"]:
                print(f"{p.key:32s} {mma:5s} {b['config']:44s} {b['tflops']:6.0f} TF  vs flash "
                      f"{b['flash_ms'] / b['median_ms']:.2f}x  cudnn {b['cudnn_ms'] / b['median_ms']:.2f}x")
    bench.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
