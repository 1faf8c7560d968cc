"""The four short-form examples (docs/examples) on one GPU: each tuned, checked at odd sizes and
timed beside its peers, in one process.

    python3 docs/scripts/examples_bench.py --out DIR [--trials 30] [--only rmsnorm,silu_mul]

For each example: ``tuner.tune`` by its folder (``--trials`` trials, a database in DIR); the
winner checked at odd sizes (1 row, 1,000,001 rows, a hidden size of 4,097) by the workers'
own checks (outputs poisoned, two runs compared, inputs unchanged, the reference), taking the
nearest valid config where the winner cannot run a size; then the winner timed in turns with the
family's peers (torch) and, for the RMSNorm, an autotuned Triton kernel written here: CUDA
events around each call behind the workers' L2 flush, warm-up first, the median of ``--reps``
(``workers.peers.time_peers``), and ``triton.testing.do_bench``'s median as a second method.
Bandwidth is the family's fewest bytes over the median; "of floor" is the time those bytes
take at the device's measured copy bandwidth (and at the H200's 4.8 TB/s) over ours.

Writes DIR/examples_bench.json and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import tuner  # noqa: E402
from templates import get_family  # noqa: E402
from templates.family import H100_LIMITS  # noqa: E402

SPEC_BANDWIDTH = 4.8e12  # bytes/s: the H200's HBM3e
EXAMPLES = {  # tuned problems, then the odd sizes its winner is checked at
    "row_softmax": ([("8192,4096", "bf16")], [("1,1000", "fp16"), ("1000001,64", "bf16"), ("37,4097", "fp16")]),
    "silu_mul": ([("4096,11008", "bf16")], [("1,4097", "bf16"), ("1000001,128", "fp16"), ("37,4097", "bf16")]),
    "rmsnorm": ([("4096,4096", "bf16"), ("4096,8192", "bf16"), ("16384,8192", "fp16")],
                [("1,4096", "bf16"), ("1000001,256", "bf16"), ("4096,4097", "fp16"), ("1,4097", "bf16")]),
    "transpose": ([("8192,8192", "fp32")], [("1,4097", "fp32"), ("1000001,7", "fp32"), ("4097,4097", "fp32")]),
}


def nearest_valid(family, params, problem):
    """``params`` where they can run ``problem``, else the valid config that differs from them in
    the fewest parameters (the first such)."""
    valid = family.valid_configs(problem, H100_LIMITS)
    return min(valid, key=lambda c: sum(c[k] != params.get(k) for k in c)) if valid else None


def triton_fused_add_rmsnorm():
    """A fused residual-add + RMSNorm in Triton, one row a program, its warps autotuned by
    Triton's autotuner: a peer for the rmsnorm example (called as the family's peers are)."""
    import torch
    import triton
    import triton.language as tl

    @triton.autotune(configs=[triton.Config({}, num_warps=w, num_stages=s) for w in (1, 2, 4, 8, 16, 32)
                              for s in (1, 2)], key=["H", "BLOCK"])
    @triton.jit
    def kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_ptr, H, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * H
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        s = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32) + \
            tl.load(r_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + row + cols, s.to(res_ptr.dtype.element_ty), mask=mask)
        scale = tl.rsqrt(tl.sum(s * s, axis=0) / H + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row + cols, (s * scale * w).to(out_ptr.dtype.element_ty), mask=mask)

    def run(x, residual, weight, H):
        out, res = torch.empty_like(x), torch.empty_like(x)
        kernel[(x.shape[0],)](x, residual, weight, out, res, H, 1e-6, BLOCK=triton.next_power_of_2(H))
        return out, res

    return run


def copy_bandwidth():
    """Bytes a second a device-to-device copy of 2 GiB moves (read and write), median of 20."""
    import statistics

    import torch

    src = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(20):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (1 << 31) / statistics.median(times)


def odd_sizes(bench, family, params, odd):
    """Each odd problem run by ``params`` (or the nearest valid config) through the workers'
    checks: (problem key, config used, "ok" or the failure)."""
    rows = []
    for shape, dtype in odd:
        problem = family.parse_problem(shape, dtype)
        config = nearest_valid(family, params, problem)
        if config is None:
            rows.append((problem.key, None, "no valid config"))
            continue
        failures = bench.failures(family, [(problem, config)])
        rows.append((problem.key, config, failures[0] if failures else "ok"))
        print(f"  {problem.key:<22} {'ok' if not failures else failures[0]}  {config}", flush=True)
    return rows


def time_problem(bench, family, folder, problem, params, reps):
    """Ours in turns with the family's peers (workers.peers.time_peers), on the same inputs."""
    from workers.peers import time_peers

    source, launch = family.render(params, problem), family.launch(params, problem)
    options = family.compile_options(params, problem)
    with bench.launcher(family, problem, source, launch, options) as ours:
        if ours is None:
            return {}
        return time_peers(folder, problem, seed=0, reps=reps, ours=ours)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--only", default=",".join(EXAMPLES))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{args.out / 'examples.db'}"

    from workers.local import LocalBench
    from workers.peers import OURS

    copy_bw = copy_bandwidth()
    print(f"device copy bandwidth: {copy_bw / 1e12:.2f} TB/s", flush=True)
    records, table = [], []
    for name in args.only.split(","):
        folder = str(ROOT / "docs" / "examples" / name)
        family = get_family(folder)
        if name == "rmsnorm":
            try:
                family.peer_fns = {**family.peer_fns, "triton": triton_fused_add_rmsnorm()}
            except ImportError:
                print("triton is not installed: the rmsnorm has no Triton peer", flush=True)
        tuned, odd = EXAMPLES[name]
        for shape, dtype in tuned:
            start = time.perf_counter()
            result = tuner.tune(folder, shape, dtype, trials=args.trials, db=db, seed=0)
            problem = family.parse_problem(shape, dtype)
            params = dict(result.best.params) if result.best else None
            print(f"{name} {problem.key}: {result.measured} measured, {result.failed} failed, "
                  f"{time.perf_counter() - start:.0f} s; winner {params}", flush=True)
            if params is None:
                records.append({"example": name, "problem": problem.key, "error": "no winner"})
                continue
            with LocalBench() as bench:
                checked = odd_sizes(bench, family, params, odd) if shape == tuned[0][0] else []
                timed = time_problem(bench, family, folder, problem, params, args.reps)
            ours = timed.get(OURS)
            nbytes = family.min_bytes(problem)
            record = {"example": name, "problem": problem.key, "params": params, "trials": result.measured,
                      "failed": result.failed, "min_bytes": nbytes,
                      "odd_sizes": [{"problem": k, "params": c, "result": r} for k, c, r in checked],
                      "timings": {n: {"median_ms": t.median_ms, "do_bench_ms": t.check_ms, "error": t.error,
                                      "note": t.note} for n, t in timed.items()}}
            records.append(record)
            if ours is None or ours.median_ms is None:
                table.append(f"| {name} | {problem.key} | - | - | - | - | - | {len(checked)} checked |")
                continue
            peers = [(n, t) for n, t in timed.items() if n != OURS]
            ratio = "; ".join(f"{n} {t.median_ms / ours.median_ms:.2f}x" if t.median_ms else f"{n} -" for n, t in peers)
            check = "; ".join(f"{n} {t.check_ms / ours.check_ms:.2f}x" for n, t in peers
                              if t.check_ms and ours.check_ms) or "-"
            seconds = ours.median_ms / 1e3
            odd_ok = sum(r == "ok" for _, _, r in checked)
            table.append(f"| {name} | {problem.key} | {ours.median_ms * 1e3:.1f} | {ratio} | {check} | "
                         f"{nbytes / seconds / 1e12:.2f} TB/s | {nbytes / copy_bw / seconds:.0%} / "
                         f"{nbytes / SPEC_BANDWIDTH / seconds:.0%} | "
                         f"{f'{odd_ok}/{len(checked)} ok' if checked else ''} |")
    (args.out / "examples_bench.json").write_text(json.dumps({"copy_bandwidth": copy_bw, "records": records},
                                                             indent=2, default=str))
    print(f"\nwrote {args.out / 'examples_bench.json'}\n")
    print("| example | problem | ours (us) | peers' time / ours (events) | (do_bench) | bandwidth | "
          "of floor (copy / spec) | odd sizes |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(table))
    bad = [r for r in records if r.get("error") or
           any(o["result"] != "ok" for o in r.get("odd_sizes", []))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
