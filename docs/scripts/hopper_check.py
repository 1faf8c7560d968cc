"""The attention family's TMA path (LOADS=tma) on the GPU: correctness, SASS, speed, one run.

    python3 docs/scripts/hopper_check.py            # writes under $OUT (or ./hopper_out)

1. Picks configs of the TMA path that cover every value of its parameters (and FA3's tiles),
   compiles each for D 64/128, fp16/bf16, causal or not, in parallel.
2. Validates each on S = 1, 65, 1000, 4097 (B, H = 2, 3; 1, 3 at 4097) with the workers' own
   checks (poisoned outputs, NaN/unwritten count, two runs compared, float64 reference), in a
   child process watched for hangs (a config that stops making progress is killed and named).
3. Disassembles every compiled TMA-path cubin (cuobjdump) and counts UTMALDG, UTMASTG, SYNCS*,
   LDGSTS, USETMAXREG, HGMMA, LDL, STL.
4. Times candidate winners with ``triton.testing.do_bench`` (median) beside torch SDPA's cuDNN
   and flash backends on the same torch tensors, in one process; prints a table last.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from templates import get_family
from templates.family import H100_LIMITS

FAMILY = get_family("attention")
OUT = Path(os.environ.get("OUT", "hopper_out"))
CACHE = Path(tempfile.gettempdir()) / "hopper_cubins"
SEQS = (1, 65, 1000, 4097)
TIMED = (("4,16,4096,128", False), ("4,16,4096,128", True), ("8,16,2048,128", False),
         ("16,16,2048,64", False), ("1,32,8192,128", False))
BASE = dict(SMEM_LAYOUT="swizzle", WARP_SPECIALIZED=1, MMA="wgmma", LOADS="tma")
NEW = ("BLOCK_M", "BLOCK_N", "STAGES", "PRODUCER_REGS", "INTRA_OVERLAP", "PINGPONG", "EPILOGUE", "Q_IN_REGS",
       "SCHEDULE", "BLOCKS_PER_SM")


def tile(bm, bn, stages, regs, overlap, pingpong, epilogue="st16", q_regs=0):
    return dict(FAMILY.default_params(), **BASE, BLOCK_M=bm, NUM_WARPS=bm // 16, BLOCK_N=bn, STAGES=stages,
                PRODUCER_REGS=regs, INTRA_OVERLAP=overlap, PINGPONG=pingpong, EPILOGUE=epilogue, Q_IN_REGS=q_regs)


# Likely winners (FA3's tiles: D=128 128 x 128-176 on two consumer warpgroups, D=64 192 x 128).
CANDIDATES = {
    128: [tile(128, bn, 2, 24, 1, pp) for bn in (128, 160, 176) for pp in (0, 1)]
         + [tile(128, 128, 2, 24, 1, 1, "tma"), tile(128, 128, 3, 24, 1, 0), tile(128, 176, 2, 24, 0, 1),
           tile(128, 96, 2, 0, 0, 1)],
    64: [tile(192, bn, 2, 24, ov, 0) for bn in (64, 96, 128) for ov in (0, 1)]
        + [tile(128, bn, 2, 24, 1, pp) for bn in (128, 176) for pp in (0, 1)] + [tile(128, 192, 2, 24, 1, 1),
           tile(192, 64, 2, 0, 0, 0)],
}


def short(c):
    return ("{BLOCK_M}x{BLOCK_N} s{STAGES} r{PRODUCER_REGS} ov{INTRA_OVERLAP} pp{PINGPONG} "
            "{EPILOGUE} q{Q_IN_REGS} {SCHEDULE} b{BLOCKS_PER_SM}").format(**c)


def problem_of(d, dtype, causal, seq):
    b, h = (1, 3) if seq > 2048 else (2, 3)
    return FAMILY.parse_problem(f"{b},{h},{seq},{d}", dtype, {"causal": causal})


def covering(d, rng):
    """Valid TMA-path configs until every value of every parameter of the path (and every
    overlap x ping-pong pair) appears, plus the candidates."""
    problem = problem_of(d, "fp16", True, 1000)
    valid = [c for c in FAMILY.valid_configs(problem, H100_LIMITS) if c["LOADS"] == "tma"]
    rng.shuffle(valid)
    chosen, seen = [], set()
    for c in valid:
        keys = {(n, c[n]) for n in NEW} | {("ov_pp", (c["INTRA_OVERLAP"], c["PINGPONG"]))}
        if keys - seen:
            chosen.append(c)
            seen |= keys
    chosen += [c for c in CANDIDATES[d] if FAMILY.check(c, problem, H100_LIMITS) is None and c not in chosen]
    return chosen


def _compile(job):
    from workers.compile import compile_cubin
    from workers.results import CompileRequest

    problem, params = job
    start = time.time()
    try:
        binary = compile_cubin(CompileRequest(FAMILY.render(params, problem), "attention_fwd",
                                              FAMILY.compile_options(params, problem)), cache_dir=CACHE)
        r = binary.resources
        return dict(ok=True, seconds=time.time() - start, cubin=binary.cubin_hash, registers=r.registers,
                    stack=r.stack_bytes, spills=r.spill_stores + r.spill_loads)
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        return dict(ok=False, error=str(exc)[:400])


def key(problem, params):
    return json.dumps([problem.key, params], sort_keys=True)


# -- validation, in a child process ------------------------------------------------------------
def validate_child(jobs_file, done_file):
    from workers.gpu import GpuBench
    from workers.results import Binary
    from workers.kernel_run import KernelRun
    from workers.compile import compile_cubin
    from workers.results import CompileRequest

    jobs = json.loads(Path(jobs_file).read_text())
    done = {json.loads(line)["key"] for line in open(done_file)} if os.path.exists(done_file) else set()
    bench = GpuBench(0)
    with open(done_file, "a") as out:
        for shape, dtype, causal, params in jobs:
            problem = FAMILY.parse_problem(shape, dtype, {"causal": causal})
            k = key(problem, params)
            if k in done:
                continue
            out.write(json.dumps({"key": k, "start": True}) + "\n")
            out.flush()
            binary = compile_cubin(CompileRequest(FAMILY.render(params, problem), "attention_fwd",
                                                  FAMILY.compile_options(params, problem)), cache_dir=CACHE)
            trial = KernelRun(bench, binary, FAMILY.launch(params, problem))
            row = {"key": k, "problem": problem.key, "config": short(params)}
            try:
                failure = trial.load()
                if failure is None:
                    trial.attach(FAMILY, problem, 11)
                    failure, validation = trial.verify(FAMILY, problem)
                if failure is None:
                    row.update(ok=True, error=validation.error)
                else:
                    row.update(ok=False, failure=failure.failure, reason=failure.reason, error=failure.error)
            except Exception as exc:  # noqa: BLE001
                row.update(ok=False, failure="exception", reason=f"{type(exc).__name__}: {exc}"[:300])
            finally:
                try:
                    trial.release()
                except Exception:  # noqa: BLE001
                    pass
            out.write(json.dumps(row) + "\n")
            out.flush()
            if row.get("failure") == "exception" and "ILLEGAL" in row.get("reason", ""):
                return 3  # the context is dead: start again in a new process
    bench.close()
    return 0


def validate_all(jobs, log):
    jobs_file, done_file = OUT / "jobs.json", OUT / "validate.jsonl"
    jobs_file.write_text(json.dumps([[p.shape, p.dtype, p.flag("causal"), c] for p, c in jobs]))
    for attempt in range(12):
        child = subprocess.Popen([sys.executable, __file__, "validate", str(jobs_file), str(done_file)])
        last, size, hung = time.time(), -1, False
        while child.poll() is None:
            time.sleep(1)
            now_size = done_file.stat().st_size if done_file.exists() else 0
            if now_size != size:
                size, last = now_size, time.time()
            elif time.time() - last > 40 and size > 0:  # no progress: a hang
                child.kill()
                child.wait()
                lines = done_file.read_text().splitlines()
                stuck = json.loads(lines[-1])
                log(f"HANG: {stuck['key']}")
                config = json.loads(stuck["key"])[1]
                with open(done_file, "a") as out:  # the config's other problems are skipped too
                    for problem, params in jobs:
                        if params == config:
                            out.write(json.dumps({"key": key(problem, params), "ok": False, "failure": "hang",
                                                  "reason": "hung (here or on another problem)"}) + "\n")
                hung = True
                break
        if not hung and child.returncode != 3:  # done, or broken beyond a dead context
            break
    rows = {}
    for line in done_file.read_text().splitlines():
        r = json.loads(line)
        if "start" not in r:
            rows[r["key"]] = r
    return rows


# -- SASS ------------------------------------------------------------------------------------
OPS = ("UTMALDG", "UTMASTG", "UTMAPF", "SYNCS", "LDGSTS", "USETMAXREG", "HGMMA", "LDL", "STL", "BAR", "WARPSYNC")


def sass_counts(cubin_path):
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin_path)], capture_output=True, text=True).stdout
    ops = collections.Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)", sass))
    return {op: sum(n for name, n in ops.items() if name == op or name.startswith(op)) for op in OPS}


# -- timing, in a child process ----------------------------------------------------------------
def time_child(candidates_file, out_file):
    import ctypes

    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from workers.compile import compile_cubin
    from workers.device_checks import pack_params
    from workers.driver import check_call, driver_api
    from workers.results import CompileRequest
    from workers.tensormap import encode

    d = driver_api()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    check_call("cuInit", d.cuInit(0))
    ctx = check_call("cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain(0))
    check_call("cuCtxSetCurrent", d.cuCtxSetCurrent(ctx))
    candidates = json.loads(Path(candidates_file).read_text())
    rows = []
    for shape, causal in TIMED:
        dims = [int(x) for x in shape.split(",")]
        dtype = "fp16"
        problem = FAMILY.parse_problem(shape, dtype, {"causal": causal})
        torch.manual_seed(0)
        q, k, v = (torch.randn(*dims, dtype=torch.float16, device="cuda") for _ in range(3))
        o = torch.empty_like(q)
        ptrs = {"q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(), "o": o.data_ptr()}
        peers = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
                    ref = fn()
                    peers[name] = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
                    if name == "cudnn":
                        reference = ref
            except Exception as exc:  # noqa: BLE001
                print(f"{name}: {exc}", flush=True)
        for params in candidates[str(dims[3])]:
            if FAMILY.check(params, problem, H100_LIMITS) is not None:
                continue
            launch = FAMILY.launch(params, problem)
            binary = compile_cubin(CompileRequest(FAMILY.render(params, problem), "attention_fwd",
                                                  FAMILY.compile_options(params, problem)), cache_dir=CACHE)
            module = check_call("cuModuleLoadData", d.cuModuleLoadData(binary.cubin))
            func = check_call("cuModuleGetFunction", d.cuModuleGetFunction(module, b"attention_fwd"))
            check_call("cuFuncSetAttribute", d.cuFuncSetAttribute(
                func, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.smem_bytes))
            values = []
            for arg in launch.args:
                if arg.kind == "tensormap":
                    values.append(encode(arg.value, ptrs[arg.value.buffer]))
                elif arg.kind == "buffer":
                    values.append(ctypes.c_uint64(ptrs[arg.value]))
                elif arg.kind == "i32":
                    values.append(ctypes.c_int32(arg.value))
                else:
                    values.append(ctypes.c_float(arg.value))
            packed = pack_params(values)

            def run():
                check_call("cuLaunchKernel", d.cuLaunchKernel(
                    func, *launch.grid_on(torch.cuda.get_device_properties(0).multi_processor_count), *launch.block, launch.smem_bytes, torch.cuda.current_stream().cuda_stream,
                    ctypes.addressof(packed), 0))

            o.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            diff = (o.float() - reference.float()).abs().max().item() if "cudnn" in peers else float("nan")
            ms = triton.testing.do_bench(run, warmup=50, rep=200, return_mode="median")
            row = dict(problem=problem.key, config=short(params), params=params, ms=ms,
                       tflops=FAMILY.tflops(problem, ms), max_diff_vs_cudnn=diff,
                       cudnn_ms=peers.get("cudnn"), flash_ms=peers.get("flash"))
            rows.append(row)
            print(f"{problem.key:30s} {short(params):40s} {row['tflops']:6.0f} TF  diff {diff:.2e}  "
                  f"cudnn {FAMILY.tflops(problem, peers['cudnn']) if 'cudnn' in peers else 0:6.0f}  "
                  f"flash {FAMILY.tflops(problem, peers['flash']) if 'flash' in peers else 0:6.0f}", flush=True)
            check_call("cuModuleUnload", d.cuModuleUnload(module))
        Path(out_file).write_text(json.dumps(rows, indent=1))
    return 0


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    logfile = open(OUT / "check.log", "a")

    def log(line):
        print(line, flush=True)
        logfile.write(line + "\n")
        logfile.flush()

    rng = random.Random(14)
    configs = {d: covering(d, rng) for d in (64, 128)}
    jobs = [(problem_of(d, dtype, causal, seq), c) for d in (64, 128) for dtype in ("fp16", "bf16")
            for causal in (False, True) for seq in SEQS for c in configs[d]]
    builds = {}
    unique = {}
    for p, c in jobs:
        unique.setdefault((p.shape[3], p.dtype, p.flag("causal"), json.dumps(c, sort_keys=True)), (p, c))
    start = time.time()
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        for (dd, dt, ca, ck), result in zip(unique, pool.map(_compile, unique.values())):
            builds[(dd, dt, ca, ck)] = result
    bad = [(k, r) for k, r in builds.items() if not r["ok"] or r["stack"] or r["spills"]]
    log(f"compiled {len(builds)} kernels ({len(configs[64])} + {len(configs[128])} configs) in "
        f"{time.time() - start:.0f} s; failed or spilling: {len(bad)}")
    for k, r in bad:
        log(f"  BAD {k}: {r}")

    rows = validate_all([(p, c) for p, c in jobs], log)
    failures = [r for r in rows.values() if not r.get("ok")]
    worst = max((r.get("error") or 0 for r in rows.values() if r.get("ok")), default=0)
    log(f"validated {len(rows)} (config, problem) pairs: {len(failures)} failures; worst error {worst:.2e}")
    for r in failures:
        log(f"  FAIL {r['key']}: {r.get('failure')} {r.get('reason')}")

    # SASS of every compiled TMA-path cubin
    from workers.compile import compile_cubin
    from workers.results import CompileRequest

    totals = collections.Counter()
    local = 0
    sass_dir = Path(tempfile.mkdtemp())

    def disassemble(item):
        (dd, dt, ca, ck), r = item
        params = json.loads(ck)
        problem = problem_of(dd, dt, ca, 1000)
        binary = compile_cubin(CompileRequest(FAMILY.render(params, problem), "attention_fwd",
                                              FAMILY.compile_options(params, problem)), cache_dir=CACHE)
        path = sass_dir / f"{binary.cubin_hash}.cubin"
        path.write_bytes(binary.cubin)
        return dd, dt, ca, params, sass_counts(path)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        disassembled = list(pool.map(disassemble, [(k, r) for k, r in builds.items() if r["ok"]]))
    for dd, dt, ca, params, counts in disassembled:
        if dt == "fp16" and ca:
            log(f"  SASS D={dd} fp16 causal {short(params)}: " + " ".join(f"{k}={v}" for k, v in counts.items()))
    for dd, dt, ca, params, counts in disassembled:
        totals.update({op: 1 for op, n in counts.items() if n})
        if counts["LDL"] or counts["STL"] or counts["LDGSTS"] or not counts["UTMALDG"] or not counts["SYNCS"] \
                or bool(counts["USETMAXREG"]) != bool(params["PRODUCER_REGS"]) \
                or bool(counts["UTMASTG"]) != (params["EPILOGUE"] == "tma"):
            local += 1
            log(f"  SASS odd: D={dd} {dt} causal={ca} {short(params)}: {counts}")
    log(f"SASS of {len(builds)} cubins: cubins with each op: {dict(totals)}; odd ones: {local}")

    # timing of candidates that validated everywhere
    failed_configs = {json.dumps(json.loads(r["key"])[1], sort_keys=True) for r in failures}
    cands = {d: [c for c in CANDIDATES[d] if json.dumps(c, sort_keys=True) not in failed_configs
                 and any(json.dumps(c, sort_keys=True) == json.dumps(x, sort_keys=True) for x in configs[d])]
             for d in (64, 128)}
    (OUT / "candidates.json").write_text(json.dumps({str(d): v for d, v in cands.items()}))
    timing_file = OUT / "timing.json"
    try:
        subprocess.run([sys.executable, __file__, "time", str(OUT / "candidates.json"), str(timing_file)],
                       timeout=int(os.environ.get("TIME_LIMIT", "150")))
    except subprocess.TimeoutExpired:
        log("timing: stopped at its limit")
    if timing_file.exists():
        rows = json.loads(timing_file.read_text())
        log("\nproblem                         best config                                TFLOPS  cudnn  flash  vs cudnn  vs flash")
        for shape, causal in TIMED:
            mine = [r for r in rows if r["problem"] == FAMILY.parse_problem(shape, "fp16", {"causal": causal}).key]
            if not mine:
                continue
            b = min(mine, key=lambda r: r["ms"])
            p = FAMILY.parse_problem(shape, "fp16", {"causal": causal})
            cud = FAMILY.tflops(p, b["cudnn_ms"]) if b["cudnn_ms"] else 0
            fla = FAMILY.tflops(p, b["flash_ms"]) if b["flash_ms"] else 0
            log(f"{b['problem']:31s} {b['config']:42s} {b['tflops']:6.0f} {cud:6.0f} {fla:6.0f}  "
                f"{(b['cudnn_ms'] or 0) / b['ms']:7.2f}x {(b['flash_ms'] or 0) / b['ms']:7.2f}x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "validate":
        sys.exit(validate_child(sys.argv[2], sys.argv[3]))
    if len(sys.argv) > 1 and sys.argv[1] == "time":
        sys.exit(time_child(sys.argv[2], sys.argv[3]))
    main()
