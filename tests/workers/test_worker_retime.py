"""The interleaved re-timing's order and failure handling, on fake trials (no GPU): launches go
round-robin, a kernel that fails leaves the race alone, a dead context ends it for all."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest

import workers.retime
from templates.family import Validation
from workers.errors import LaunchError
from workers.hold import HOLD_BATCH
from workers.gpu import GpuBench
from workers.retime import MIN_ROUNDS, interleave, round_count
from workers.kernel_run import wrong


class FakeTrial:
    """KernelRun's steps; ``fail`` picks one to break: load, wrong, launch (its 3rd timed launch
    asks for too much), crash (its 3rd timed launch kills the context)."""

    def __init__(self, name: str, log: list, fail: str | None = None, ms: float = 0.01) -> None:
        self.name, self.log, self.fail, self.ms = name, log, fail, ms
        self.stage, self.launches = "load", 0

    def load(self):
        if self.fail == "load":
            raise LaunchError("cuModuleLoadData", "CUDA_ERROR_INVALID_IMAGE")

    def attach(self, family, problem, seed):
        self.log.append(f"attach {self.name}")

    def verify(self, family, problem):
        if self.fail == "wrong":
            return wrong(Validation(False, 0.5, 1e-3, "relative error 0.5")), None
        return None, Validation(True, 1e-4, 1e-3)

    def warm_up(self, warmup_ms):
        return self.ms

    def timed_launch(self, flush_l2):
        self.stage = "launch"
        self.launches += 1
        if self.launches == 3 and self.fail in ("launch", "crash"):
            error = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" if self.fail == "launch" else "CUDA_ERROR_ILLEGAL_ADDRESS"
            raise LaunchError("cuLaunchKernel", error)
        self.log.append(self.name)
        return self.launches, self.name

    @contextmanager
    def held(self):
        """A hold of the stream: ( and ) in the log around what is queued behind it."""
        self.log.append("(")
        yield
        self.log.append(")")
        if self.fail == "late":
            self.hold.timeouts += 1  # this hold timed out before the host released it

    def elapsed(self, pairs):
        return [self.ms * (1 + k / 100) for k in range(len(pairs))]


@pytest.fixture
def bench(monkeypatch):
    synchronize = SimpleNamespace(cuStreamSynchronize=lambda stream: (0,))
    monkeypatch.setattr(workers.retime, "driver_api", lambda: synchronize)
    fake = SimpleNamespace(dead=False, stream=None, residents=SimpleNamespace(changed=lambda: None),
                           hold=SimpleNamespace(timeouts=0))
    fake.classify = lambda exc, stage: GpuBench.classify(fake, exc, stage)
    return fake


def _run(bench, trials, **options):
    settings = dict(seed=0, rounds=30, max_seconds=2.0, warmup_ms=25.0, flush_l2=True)
    return interleave(bench, trials, None, None, **{**settings, **options})


def test_kernels_are_timed_round_robin_and_fail_alone(bench):
    log: list[str] = []
    trials = [FakeTrial("A", log), FakeTrial("B", log, "load"), FakeTrial("C", log, "wrong"),
              FakeTrial("D", log, "launch"), FakeTrial("E", log, ms=0.02)]
    results, rounds = _run(bench, trials, rounds=6)
    a, b, c, d, e = results
    assert rounds == 6 and not bench.dead
    assert log[:4] == ["attach A", "attach C", "attach D", "attach E"]  # B did not load
    assert launched(log[4:]) == "ADE" * 2 + "AE" * 4  # D left the race at its 3rd launch
    assert b.failure == "compile" and c.failure == "wrong" and c.error == 0.5
    assert d.failure == "resources" and "launch" in d.reason
    assert a.ok and e.ok and a.timing.repetitions == e.timing.repetitions == 6
    assert a.timing.min_ms == 0.01 and e.timing.median_ms == pytest.approx(0.02 * 1.025)
    assert a.error == 1e-4 and a.detail == "re-timed interleaved with 2 other kernels over 6 rounds"


def launched(log: list[str]) -> str:
    """The trials' launches in order, without the holds."""
    return "".join(entry for entry in log if entry not in "()")


def test_every_launch_is_queued_behind_a_hold_of_at_most_a_batch(bench):
    log: list[str] = []
    trials = [FakeTrial(name, log) for name in "ABC"]
    for trial in trials:
        trial.hold = bench.hold
    results, rounds = _run(bench, trials, rounds=30)
    assert rounds == 30 and all(m.ok for m in results)
    batches = "".join(log[3:]).split(")")
    assert batches[-1] == "" and all(b.startswith("(") and ")" not in b for b in batches[:-1])
    sizes = [len(b) - 1 for b in batches[:-1]]
    assert sum(sizes) == 90 and max(sizes) <= HOLD_BATCH and all(size % 3 == 0 for size in sizes)
    assert len(sizes) == 3  # 10 rounds of 3 kernels behind each hold of at most 32 launches
    assert "started before the host" not in results[0].detail


def test_a_hold_that_timed_out_is_said(bench):
    log: list[str] = []
    trial = FakeTrial("A", log, "late")
    trial.hold = bench.hold
    (result,), rounds = _run(bench, [trial], rounds=40)
    assert result.ok and rounds == 40 and bench.hold.timeouts == 2  # two holds: 32 + 8 launches
    assert result.detail.endswith("2 batches of repetitions started before the host had queued them "
                                  "(the stream's hold timed out): their times may include host time")


def test_a_dead_context_fails_every_kernel_left(bench):
    log: list[str] = []
    trials = [FakeTrial("A", log), FakeTrial("B", log, "crash"), FakeTrial("C", log, "wrong")]
    results, _ = _run(bench, trials)
    assert bench.dead and launched(log[3:]) == "ABAB" + "A"
    assert [m.failure for m in results] == ["crash", "crash", "wrong"]
    assert results[0].reason == "the CUDA context died during the re-timing"
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in results[1].reason


def test_an_input_written_into_fails_the_kernels_that_were_timed(bench):
    log: list[str] = []
    bench.residents.changed = lambda: "q"
    results, rounds = _run(bench, [FakeTrial("A", log), FakeTrial("B", log, "wrong")], rounds=5)
    assert rounds == 5 and [m.failure for m in results] == ["wrong", "wrong"]
    assert results[0].reason == "a kernel wrote into the input 'q'"
    assert results[1].reason == "relative error 0.5"


def test_nothing_left_to_time(bench):
    log: list[str] = []
    results, rounds = _run(bench, [FakeTrial("A", log, "wrong"), FakeTrial("B", log, "load")])
    assert rounds == 0 and [m.failure for m in results] == ["wrong", "compile"]


def test_round_count_keeps_to_the_time_budget():
    assert round_count(30, 2.0, 0.05) == 30  # 1.5 ms of rounds
    assert round_count(30, 2.0, 100.0) == 20  # 20 rounds of 100 ms fill 2 s
    assert round_count(30, 2.0, 1000.0) == MIN_ROUNDS  # never fewer, however slow
    assert round_count(3, 2.0, 1000.0) == 3  # unless fewer were asked for
