"""A transformer layer's MLP and attention blocks through the ops of `tuner export-torch`, against
the same blocks on the vendor's path, at token counts tuned and not (one GPU, one process).

    python3 docs/scripts/model_check.py --packages DIR --config docs/models/llama-3-8b.json \
        [--tokens 1,2,...] [--reps 50] [--out DIR]

DIR holds the packages ``tuned_gemm`` and ``tuned_attention`` (exported, and guarded by
``tuner guard``, on this GPU model). The blocks, in the config's dtype, with random weights:

- MLP: ``h = x @ W_gate_up^T``; ``silu(gate) * up`` in torch; ``h @ W_down^T``.
- attention: ``x @ W_qkv^T`` split into q (H heads) and k, v (the KV heads), each made
  (1, heads, T, D); causal attention (grouped-query where fewer KV heads); ``o @ W_o^T``.

Ours calls ``tuned_gemm.gemm`` and ``tuned_attention.attention``; the vendor's path calls
``torch.matmul`` and ``F.scaled_dot_product_attention(enable_gqa=...)``. For each token count:
ours eager, inside ``torch.compile(fullgraph=True, dynamic=True)`` (a graph break fails it) and
replayed from a captured CUDA graph, each against the vendor's eager output (relative Frobenius
error within the dtype's tolerance); then both blocks captured in CUDA graphs and the graphs
timed in turns, behind the workers' L2 flush with the stream held (``workers.peers.HeldTimer``),
medians of ``--reps``; ``triton.testing.do_bench`` on the same graphs as a second method.

Prints a table per block (ours, the vendor, vendor / ours by both methods, what ours ran), the
geometric mean of vendor / ours over the counts, and exits 1 where a check failed or ours was
slower than the vendor by more than 1% at some count. Writes DIR/model_check.json with --out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TOLERANCE = {"bf16": 2e-2, "fp16": 4e-3}  # ||ours - vendor|| / ||vendor||
DEFAULT_TOKENS = tuple(2**i for i in range(14)) + (3, 24, 100, 300, 1000, 3000, 6000)
SLOWER_LIMIT = 0.99  # vendor / ours below this: ours slower by more than 1%
ROLES = {"mlp": ("gate_up", "down"), "attention": ("qkv", "attention", "o")}


def blocks(torch, shape, ops):
    """The layer's two blocks as functions of x, over ``ops`` (mm, attention)."""
    mm, attention = ops
    heads, kv_heads, d = shape.heads, shape.kv_heads, shape.head_dim

    def mlp(x, w_gate_up, w_down):
        gate, up = mm(x, w_gate_up.t()).chunk(2, dim=-1)
        return mm(torch.nn.functional.silu(gate) * up, w_down.t())

    def attend(x, w_qkv, w_o):
        tokens = x.shape[0]
        q, k, v = mm(x, w_qkv.t()).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
        q, k, v = (t.view(tokens, n, d).transpose(0, 1).unsqueeze(0).contiguous()
                   for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)))
        o = attention(q, k, v)
        return mm(o.squeeze(0).transpose(0, 1).reshape(tokens, heads * d), w_o.t())

    return {"mlp": mlp, "attention": attend}


def weights(torch, shape, dtype):
    """Random weights scaled by 1/sqrt(fan-in), on the GPU."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    hidden, d = shape.hidden, shape.head_dim

    def make(rows, cols):
        return (torch.randn(rows, cols, device="cuda", generator=generator) / math.sqrt(cols)).to(dtype)

    return {"mlp": (make(2 * shape.intermediate, hidden), make(hidden, shape.intermediate)),
            "attention": (make((shape.heads + 2 * shape.kv_heads) * d, hidden), make(hidden, shape.heads * d))}


def relative(torch, got, want) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def captured(torch, fn, args):
    """``fn(*args)`` captured in a CUDA graph (warmed up first): (graph, its output tensor)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    return graph, out


def check_count(torch, setup, name, tokens, reps):
    """One block at one token count: the checks, then ours and the vendor timed in turns."""
    from workers.peers import do_bench_ms, held_timer
    from workers.results import timing_of

    ours, vendor, compiled, w, dtype, tolerance = setup
    x = torch.randn(tokens, w[0].shape[1], device="cuda", dtype=dtype)
    want = vendor(x, *w)
    row = {"block": name, "tokens": tokens, "errors": {}}
    row["errors"]["eager"] = relative(torch, ours(x, *w), want)
    row["errors"]["compiled"] = relative(torch, compiled(x, *w), want)
    ours_graph, ours_out = captured(torch, ours, (x, *w))
    vendor_graph, _ = captured(torch, vendor, (x, *w))
    ours_out.fill_(float("nan"))  # poisoned: the replay must write it again
    ours_graph.replay()
    torch.cuda.synchronize()
    row["errors"]["graph"] = relative(torch, ours_out, want)
    row["ok"] = all(e <= tolerance for e in row["errors"].values())
    timer = held_timer(torch)
    try:
        samples, _ = timer.time_each({"ours": ours_graph.replay, "vendor": vendor_graph.replay}, reps)
    finally:
        timer.hold.close()
    row["ours_ms"], row["vendor_ms"] = (timing_of(samples[n]).median_ms for n in ("ours", "vendor"))
    row["ours_do_bench_ms"], row["vendor_do_bench_ms"] = do_bench_ms(ours_graph.replay), do_bench_ms(vendor_graph.replay)
    row["ratio"] = row["vendor_ms"] / row["ours_ms"]
    row["ratio_do_bench"] = (row["vendor_do_bench_ms"] / row["ours_do_bench_ms"]) if row["ours_do_bench_ms"] else None
    return row


def ran(packages, shape, tokens, torch, dtype):
    """What ours ran at this count for each problem of the layer: tuned, the rule's pick or vendor."""
    gemm, attention = packages
    d, hidden = shape.head_dim, shape.hidden

    def linear(rows, cols):
        return gemm.gemm_choice(torch.empty(tokens, cols, device="cuda", dtype=dtype),
                                torch.empty(rows, cols, device="cuda", dtype=dtype).t())

    choices = {"qkv": linear((shape.heads + 2 * shape.kv_heads) * d, hidden), "o": linear(hidden, shape.heads * d),
               "gate_up": linear(2 * shape.intermediate, hidden), "down": linear(hidden, shape.intermediate),
               "attention": attention.attention_choice(
                   torch.empty(1, shape.heads, tokens, d, device="cuda", dtype=dtype),
                   *(torch.empty(1, shape.kv_heads, tokens, d, device="cuda", dtype=dtype),) * 2, True)}
    return {role: "vendor" if c.use == "vendor" else ("tuned" if c.reason == "tuned" else "rule")
            for role, c in choices.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", required=True, type=Path)
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    from tuner.study.model import read_config

    shape = read_config(args.config)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[shape.dtype]
    sys.path.insert(0, str(args.packages))
    gemm, attention = (importlib.import_module(n) for n in ("tuned_gemm", "tuned_attention"))
    grouped = shape.kv_heads != shape.heads
    ours = blocks(torch, shape, (gemm.gemm, lambda q, k, v: attention.attention(q, k, v, causal=True)))
    vendor = blocks(torch, shape, (torch.matmul, lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=grouped)))
    compiled = {name: torch.compile(fn, fullgraph=True, dynamic=True) for name, fn in ours.items()}
    w = weights(torch, shape, dtype)
    tokens = sorted({int(t) for t in args.tokens.split(",")})
    rows = []
    for name in ("mlp", "attention"):
        setup = (ours[name], vendor[name], compiled[name], w[name], dtype, TOLERANCE[shape.dtype])
        for count in tokens:
            row = check_count(torch, setup, name, count, args.reps)
            row["ran"] = {role: use for role, use in ran((gemm, attention), shape, count, torch, dtype).items()
                          if role in ROLES[name]}
            rows.append(row)
            print(f"{name} {count}: ours {row['ours_ms'] * 1e3:.1f} us, vendor {row['vendor_ms'] * 1e3:.1f} us, "
                  f"{row['ratio']:.3f}x; errors {', '.join(f'{k} {v:.1e}' for k, v in row['errors'].items())}",
                  flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "model_check.json").write_text(json.dumps(rows, indent=2))
    bad = False
    for name in ("mlp", "attention"):
        mine = [r for r in rows if r["block"] == name]
        print(f"\n{name}: vendor / ours, geometric mean over {len(mine)} counts: "
              f"{math.exp(sum(math.log(r['ratio']) for r in mine) / len(mine)):.3f}x")
        print("| tokens | ours (us) | vendor (us) | vendor / ours (events / do_bench) | worst error | ours ran |")
        print("|---|---|---|---|---|---|")
        for r in mine:
            second = f"{r['ratio_do_bench']:.3f}x" if r["ratio_do_bench"] else "-"
            flag = "" if r["ok"] and r["ratio"] >= SLOWER_LIMIT else " FAIL"
            bad |= bool(flag)
            print(f"| {r['tokens']} | {r['ours_ms'] * 1e3:.1f} | {r['vendor_ms'] * 1e3:.1f} | "
                  f"{r['ratio']:.3f}x / {second}{flag} | {max(r['errors'].values()):.1e} | "
                  f"{'; '.join(f'{k}: {v}' for k, v in r['ran'].items())} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
