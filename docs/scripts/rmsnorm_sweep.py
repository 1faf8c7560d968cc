"""Every 16-byte-load config of the rmsnorm example, measured on a few problems, then the three
fastest of each timed in turns beside torch and the autotuned Triton kernel (one process).

    python3 docs/scripts/rmsnorm_sweep.py DIR

Prints, per problem, the fastest configs, the best time for each value of each parameter, and
the peers' time over ours (held CUDA events / do_bench); writes DIR/<problem>.json.
"""
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "scripts"))
from templates import get_family  # noqa: E402
from templates.family import H100_LIMITS  # noqa: E402
from workers.local import LocalBench, _compiled  # noqa: E402
from workers.peers import time_peers, OURS  # noqa: E402
import examples_bench as eb  # noqa: E402

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
folder = str(ROOT / "docs/examples/rmsnorm")
fam = get_family(folder)
fam.peer_fns = {**fam.peer_fns, "triton": eb.triton_fused_add_rmsnorm()}
problems = [("4096,4096", "bf16"), ("4096,8192", "bf16"), ("16384,8192", "fp16"), ("8192,5120", "bf16")]
rows = []
with LocalBench() as bench:
    for shape, dtype in problems:
        pr = fam.parse_problem(shape, dtype)
        configs = [c for c in fam.valid_configs(pr, H100_LIMITS) if c["VEC"] == 8]
        t0 = time.time()
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda c: _compiled(fam.render(c, pr), fam.launch(c, pr), fam.compile_options(c, pr)), configs))
        t1 = time.time()
        res = []
        for c in configs:
            m = bench.measure(fam, pr, fam.render(c, pr), fam.launch(c, pr), fam.compile_options(c, pr))
            if m.ok:
                res.append((m.timing.median_ms, c))
            else:
                print("FAIL", pr.key, c, m.failure, m.reason, flush=True)
        res.sort(key=lambda r: r[0])
        print(f"{pr.key}: {len(configs)} configs, compile {t1-t0:.0f}s, measure {time.time()-t1:.0f}s", flush=True)
        for t, c in res[:8]:
            print(f"   {t*1e3:8.2f} us {c}", flush=True)
        for k in ("THREADS", "ROWS", "CACHE", "NC"):
            best = {}
            for t, c in res:
                best.setdefault(c[k], t)
            print(f"   best by {k}: " + ", ".join(f"{v}={t*1e3:.1f}" for v, t in sorted(best.items())), flush=True)
        for t, c in res[:3]:
            with bench.launcher(fam, pr, fam.render(c, pr), fam.launch(c, pr), fam.compile_options(c, pr)) as ours:
                timed = time_peers(folder, pr, seed=0, reps=300, ours=ours)
            o = timed[OURS]
            line = f"| {pr.key} | {c} | {o.median_ms*1e3:.1f} | " + " | ".join(
                f"{n} {v.median_ms/o.median_ms:.3f}x / {v.check_ms/o.check_ms:.3f}x" for n, v in timed.items() if n != OURS and v.median_ms)
            rows.append(line); print(line, flush=True)
        json.dump([(t, c) for t, c in res], open(out / f"{pr.key}.json", "w"))
print("\n".join(rows))
