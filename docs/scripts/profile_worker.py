"""A TPE study with its GPU worker under cProfile: where the worker's time goes inside a study.

    OUT=/tmp python3 docs/scripts/profile_worker.py 8,16,2048,128 fp16 0 100

GpuBench is swapped for a subclass that profiles each ``measure`` and writes the 25 costliest
calls to $OUT/actor_<pid>.txt every 20 trials (Ray ships the subclass to the actor by value).
"""
import cProfile, os, pstats, sys, time, io
import workers.gpu as gpu_module
from workers.gpu import GpuBench

OUT = os.environ.get("OUT", "/tmp")


class ProfiledBench(GpuBench):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._prof = cProfile.Profile()
        self._busy = 0.0
        self._n = 0

    def measure(self, *a, **k):
        t = time.perf_counter()
        self._prof.enable()
        try:
            return super().measure(*a, **k)
        finally:
            self._prof.disable()
            self._busy += time.perf_counter() - t
            self._n += 1
            if self._n % 20 == 0:
                s = io.StringIO()
                pstats.Stats(self._prof, stream=s).sort_stats("tottime").print_stats(25)
                with open(f"{OUT}/actor_{os.getpid()}.txt", "w") as f:
                    f.write(f"{self._n} measures, {self._busy:.2f} s\n" + s.getvalue())


gpu_module.GpuBench = ProfiledBench
import tuner  # noqa: E402

shape, dtype, causal, trials = sys.argv[1:5]
r = tuner.tune("attention", shape, dtype, {"causal": causal == "1"}, trials=int(trials), db=f"sqlite:///{OUT}/pw.db", seed=0)
print(f"wall {r.elapsed_s:.1f} s busy {r.gpu_busy_s / r.elapsed_s:.0%} kernels {r.kernel_busy_s / r.elapsed_s:.0%}")
