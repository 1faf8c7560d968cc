"""Where a study's wall time goes: when each trial was asked, compiled, sent to the GPU actor and
measured, and what the GPU actor waited for between two measurements.

    OUT=/tmp PYTHONPATH=<checkout> python3 docs/scripts/timeline.py "2,8,1024,64 fp16 1 100" ...
    ... --replay templates/attention/landscapes/attention_2x8x1024x64-fp16-causal_h200.json "2,8,1024,64 fp16 1 100"

Studies run one after another in one Ray session, as in ``throughput.py`` (same defaults). The
GPU worker (or the replay worker) is swapped for a subclass that writes the start and end of each
``measure`` to $OUT/timeline_<pid>.jsonl; the pool's and the coordinator's steps are wrapped here.
Each gap between two measurements is put down to the first thing the next trial lacked when the
previous measurement ended: ``queued`` (it was already sent: Ray's and the actor's own latency),
``ask`` (not yet asked), ``compile`` (asked, not compiled) or ``send`` (compiled, not yet sent).
With several GPUs (one file per actor), each GPU's gaps are put down to its own next trial;
``gpus`` lists each GPU's measurements, and ``largest_gaps`` the longest gaps. A study's fifth
word, if any, is its sampler (``"2,8,1024,64 fp16 1 100 random"``; default tpe). One JSON line
per study (``TIMELINE {...}``), seconds.
"""
import functools
import glob
import json
import logging
import os
import sys
import time
from collections import defaultdict

import tuner
import tuner.study.loop as loop_module
import workers.gpu as gpu_module
import workers.pool as pool_module
import workers.replay as replay_module
from call_time import summed
from storage import params_key
from workers.ray_session import shared_ray

OUT = os.environ.get("OUT", "/tmp")
events: dict[str, dict] = defaultdict(dict)  # params key -> {"asked": t, "compiled": t, "sent": t}
totals: dict[str, float] = defaultdict(float)


def _timed_measure(cls):
    class Timed(cls):
        def measure(self, binary, launch, family_name, problem, *, params=None, **options):
            start = time.time()
            result = super().measure(binary, launch, family_name, problem, params=params, **options)
            with open(f"{OUT}/timeline_{os.getpid()}.jsonl", "a") as log:
                log.write(json.dumps({"key": params_key(params or {}), "start": start, "end": time.time(),
                                      "kernel": result.kernel_seconds}) + "\n")
            return result
    Timed.__name__ = cls.__name__
    return Timed


def _stamp(name, get_params):
    def wrap(method):
        @functools.wraps(method)
        def stamped(self, *args):
            events[params_key(get_params(*args))].setdefault(name, time.time())
            return method(self, *args)
        return stamped
    return wrap


def _summed(name, method):
    return summed(totals, name, method)


gpu_module.GpuBench = _timed_measure(gpu_module.GpuBench)
replay_module.ReplayBench = _timed_measure(replay_module.ReplayBench)
P = pool_module.WorkerPool
P.submit = _stamp("asked", lambda ticket, params, *rest: params)(P.submit)
P._compiled = _stamp("compiled", lambda item: item.params)(P._compiled)
P._dispatch = _stamp("sent", lambda slot, item: item.params)(P._dispatch)
P.poll = _summed("poll", P.poll)
C = loop_module.Coordinator
C._propose = _summed("ask", C._propose)  # a batch of asks
C._finish = _summed("finish", C._finish)
C._retime = _summed("retime", C._retime)
_run = C.run


def _stamped_run(self):
    totals["run_start"] = time.time()
    return _run(self)


C.run = _stamped_run
loop_module.MirroredStudy.record = _summed("record", loop_module.MirroredStudy.record)
loop_module.MirroredStudy.finish = _summed("store", loop_module.MirroredStudy.finish)
loop_module.MirroredStudy.record_many = _summed("record", loop_module.MirroredStudy.record_many)
loop_module.MirroredStudy.finish_many = _summed("store", loop_module.MirroredStudy.finish_many)


def summarize(label: str, start: float, end: float, result) -> dict:
    per_gpu: list[list[dict]] = []  # each GPU actor's measurements (one file per actor process)
    for path in sorted(glob.glob(f"{OUT}/timeline_*.jsonl")):
        with open(path) as log:
            mine = [json.loads(line) for line in log]
        os.remove(path)
        mine = sorted((r for r in mine if start <= r["start"] <= end), key=lambda r: r["start"])
        if mine:
            per_gpu.append(mine)
    runs = sorted((r for mine in per_gpu for r in mine), key=lambda r: r["start"])
    gaps: dict[str, float] = defaultdict(float)
    largest: list[tuple[float, int, float, str]] = []  # (gap, GPU, seconds from the start, cause)
    for gpu, mine in enumerate(per_gpu):  # a GPU's gap is put down to what its own next trial lacked
        for before, after in zip(mine, mine[1:]):
            gap = max(0.0, after["start"] - before["end"])
            marks = events.get(after["key"], {})
            cause = next((step for step in ("ask", "compile", "send")
                          if marks.get({"ask": "asked", "compile": "compiled", "send": "sent"}[step], 0)
                          > before["end"]), "queued")
            gaps[cause] += gap
            largest.append((gap, gpu, before["end"] - start, cause))
    busy = sum(r["end"] - r["start"] for r in runs)
    begun = totals.pop("run_start", start)
    firsts = {step: round(min((m[step] for m in events.values() if step in m), default=begun) - begun, 2)
              for step in ("asked", "compiled", "sent")}
    firsts["measured"] = round(runs[0]["start"] - begun, 2) if runs else None
    out = {
        "label": label, "wall": round(end - start, 2), "measures": len(runs),
        "busy": round(busy, 2), "kernels": round(sum(r["kernel"] for r in runs), 2),
        "head": round(runs[0]["start"] - start, 2) if runs else None,  # from the call's start
        "tail": round(end - runs[-1]["end"], 2) if runs else None,
        "gpus": [{"measures": len(mine), "busy": round(sum(r["end"] - r["start"] for r in mine), 2),
                  "first": round(mine[0]["start"] - start, 2), "last": round(end - mine[-1]["end"], 2)}
                 for mine in per_gpu],
        "first": firsts,  # seconds from the coordinator's start to the first trial's steps
        "gaps": {k: round(v, 2) for k, v in sorted(gaps.items())},
        "largest_gaps": [{"s": round(g, 3), "gpu": i, "at": round(at, 2), "cause": c}
                         for g, i, at, c in sorted(largest, reverse=True)[:8]],
        "coordinator": {k: round(v, 2) for k, v in sorted(totals.items())},
        "trials_per_min": round(60 * result.measured / result.elapsed_s, 1),
        # over the study's own clock (the coordinator's run, as tune reports it)
        "elapsed": round(result.elapsed_s, 2),
        "busy_share": round(result.gpu_busy_s / (max(1, len(per_gpu)) * result.elapsed_s), 3),
        "kernel_share": round(result.kernel_busy_s / (max(1, len(per_gpu)) * result.elapsed_s), 3),
    }
    events.clear()
    totals.clear()
    return out


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING)
    replay = None
    if argv[:1] == ["--replay"]:
        replay, argv = argv[1], argv[2:]
    with shared_ray():
        for i, study in enumerate(argv):
            shape, dtype, causal, trials, *sampler = study.split()
            db = f"{OUT}/timeline_{i}.db"
            if os.path.exists(db):
                os.remove(db)
            start = time.time()
            r = tuner.tune("attention", shape, dtype, {"causal": causal == "1"}, trials=int(trials),
                           db=f"sqlite:///{db}", seed=0, replay=replay, sampler=(sampler or ["tpe"])[0])
            print("TIMELINE " + json.dumps(summarize(f"{shape} {dtype} causal={causal}", start, time.time(), r)),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
