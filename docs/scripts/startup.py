"""Where a ``tuner tune`` call's time goes before its first measurement: each step's start and
end, in seconds from the call, for a whole call (Ray started and stopped by it, as the CLI does).

    PYTHONPATH=<checkout> python3 docs/scripts/startup.py "2,8,1024,64 fp16 1 100" DB_URL

The steps are wrapped here (the code is not changed); the GPU worker's own start-up is timed in
its process and printed as ``worker_init`` (its start and end, on the same clock). One JSON line (``STARTUP {...}``).
"""
import functools
import json
import sys
import time

T0, T0_WALL = time.perf_counter(), time.time()
steps: list[tuple[str, float, float]] = []


def wrap(owner, attr, label):
    method = getattr(owner, attr)

    @functools.wraps(method)
    def timed(*args, **kwargs):
        start = time.perf_counter() - T0
        try:
            return method(*args, **kwargs)
        finally:
            steps.append((label, round(start, 3), round(time.perf_counter() - T0, 3)))
    setattr(owner, attr, timed)


import tuner  # noqa: E402
import tuner.api as api  # noqa: E402
import tuner.study.loop as loop  # noqa: E402
import workers.gpu as gpu  # noqa: E402
import workers.pool as pool  # noqa: E402
import workers.ray_session as ray_session  # noqa: E402
from tuner.study import search  # noqa: E402

IMPORTED = time.perf_counter() - T0


class TimedBench(gpu.GpuBench):
    """The GPU worker, timing its own start (seconds in its process, from its first line)."""

    def __init__(self, *args, **kwargs):
        self.init_began = time.time()
        super().__init__(*args, **kwargs)
        self.init_s = time.time() - self.init_began

    def startup(self):
        return {"init_began": self.init_began, "init_s": round(self.init_s, 3)}


gpu.GpuBench = TimedBench
wrap(ray_session, "start_ray", "start_ray")
wrap(pool.WorkerPool, "__init__", "worker_pool")
wrap(pool.WorkerPool, "_start_actors", "actors_ready")
wrap(pool, "check_toolkit_for_driver", "toolkit_check")
wrap(pool, "toolkit_release", "toolkit_release")
wrap(api.warmstart, "nearest_winners", "warm_start_query")
wrap(api, "_storage_call", "storage_call")
wrap(search, "memory_study", "optuna_memory_study")
wrap(loop.Coordinator, "__init__", "coordinator_init")
wrap(loop.Coordinator, "run", "coordinator_run")
wrap(pool.WorkerPool, "_dispatch", "dispatch")
first_poll = {}
_poll = pool.WorkerPool.poll


def poll(self, timeout):
    out = _poll(self, timeout)
    if out and "first_result" not in first_poll:
        first_poll["first_result"] = round(time.perf_counter() - T0, 3)
        worker = __import__("ray").get(self._slots[0].actor.startup.remote())
        first_poll["worker_init"] = [round(worker["init_began"] - T0_WALL, 3),
                                     round(worker["init_began"] - T0_WALL + worker["init_s"], 3)]
    return out


pool.WorkerPool.poll = poll


def main(study: str, db: str) -> None:
    shape, dtype, causal, trials = study.split()
    r = tuner.tune("attention", shape, dtype, {"causal": causal == "1"}, trials=int(trials), db=db, seed=0)
    end = round(time.perf_counter() - T0, 3)
    seen = {}
    for label, start, stop in steps:  # first occurrence, and how many
        entry = seen.setdefault(label, {"start": start, "end": stop, "count": 0, "total": 0.0})
        entry["count"] += 1
        entry["total"] = round(entry["total"] + stop - start, 3)
    print("STARTUP " + json.dumps({"imports": round(IMPORTED, 3), "call_end": end, "study_elapsed": round(r.elapsed_s, 3),
                                   **first_poll, "steps": seen}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
