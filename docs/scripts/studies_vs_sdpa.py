"""Tune each problem with the service, then time torch SDPA's backends on the same GPU, same run.

    python3 docs/scripts/studies_vs_sdpa.py --trials 100 --db sqlite:///$OUT/bench.db --json $OUT/studies.json

Our number is the study winner's stored median (CUDA events, L2 flushed between repetitions);
the peers are timed here with the same method. Prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time

import tuner

PROBLEMS = [(f"{b},{h},{s},{d}", causal) for (b, h, s, d) in
            [(16, 16, 2048, 64), (4, 16, 4096, 128), (1, 32, 8192, 128)] for causal in (False, True)]


def time_sdpa(shape, causal, dtype="fp16", reps=50):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = torch.float16 if dtype == "fp16" else torch.bfloat16
    q, k, v = (torch.randn(*shape, device="cuda", dtype=dt) for _ in range(3))
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    out = {}
    for name, backend in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
        with sdpa_kernel(backend):
            def run(q=q, k=k, v=v):  # bound now: the tensors are deleted at the end
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            o = run()
            err = ((o.float() - ref).norm() / ref.norm()).item()
            for _ in range(5):
                run()
            samples = []
            for _ in range(reps):
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(); run(); end.record(); torch.cuda.synchronize()
                samples.append(start.elapsed_time(end))
            out[name] = {"median_ms": statistics.median(samples), "error": err}
    del q, k, v, flush
    torch.cuda.empty_cache()
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--db", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--only", type=int, nargs="*")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    rows = []
    for i, (shape, causal) in enumerate(PROBLEMS):
        if args.only and i not in args.only:
            continue
        t0 = time.perf_counter()
        result = tuner.tune("attention", shape, "fp16", {"causal": causal}, trials=args.trials, db=args.db, seed=0)
        wall = time.perf_counter() - t0
        dims = tuple(int(x) for x in shape.split(","))
        flops = 4 * dims[0] * dims[1] * dims[2] ** 2 * dims[3] / (2 if causal else 1)
        peers = time_sdpa(dims, causal)
        best = result.best
        rows.append({
            "shape": shape, "causal": causal, "device": result.device, "trials": result.measured,
            "failed": result.failed, "study_s": result.elapsed_s, "wall_s": wall,
            "gpu_busy_s": result.gpu_busy_s, "best_ms": best.median_ms, "best_tflops": best.tflops,
            "best_params": best.params, "best_error": best.error, "registers": best.registers,
            "peers": {k: dict(v, tflops=flops / v["median_ms"] / 1e9) for k, v in peers.items()},
        })
        json.dump(rows, open(args.json, "w"), indent=1, default=str)
    print(f"\nGPU: {rows[0]['device']}")
    print("| B,H,S,D | causal | trials (failed) | trials/min | GPU busy | ours | SDPA flash | SDPA cuDNN | ours/flash | ours/cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fl, cu = r["peers"]["flash"], r["peers"]["cudnn"]
        print(f"| {r['shape']} | {'yes' if r['causal'] else 'no'} | {r['trials']} ({r['failed']}) | "
              f"{60 * r['trials'] / r['study_s']:.0f} | {100 * r['gpu_busy_s'] / r['study_s']:.0f}% | "
              f"{r['best_tflops']:.0f} TF ({1000 * r['best_ms']:.0f} us) | {fl['tflops']:.0f} TF | {cu['tflops']:.0f} TF | "
              f"{fl['median_ms'] / r['best_ms']:.2f}x | {cu['median_ms'] / r['best_ms']:.2f}x |")
    for r in rows:
        print(r["shape"], r["causal"], r["best_params"], "regs", r["registers"])


if __name__ == "__main__":
    main()
