"""Timed work is queued behind a hold of the stream before the GPU may start on it: a trial's
repetitions and a peer's calls alike (no GPU here: recording doubles of the driver, torch and
the hold; tests/gpu/test_timing_gpu.py holds a real stream)."""

from __future__ import annotations

import itertools
import shutil
from types import SimpleNamespace
from typing import Any

import pytest

import workers.kernel_run
from templates.family import KernelArg, Launch, TemplateError
from workers.device_checks import pack_params
from workers.hold import FLUSH_KERNEL, HOLD_BATCH, KERNEL, compile_hold
from workers.peers import HeldTimer
from workers.kernel_run import KernelRun, repeat_in_turns


class RecordingHold:
    """StreamHold's interface: "hold" when the spin kernel is queued, "release" when let go."""

    def __init__(self, log: list[str], late: bool = False) -> None:
        self.log, self.late, self.timeouts, self.stream = log, late, 0, "stream"

    def __enter__(self) -> "RecordingHold":
        self.log.append("hold")
        return self

    def __exit__(self, *exc) -> None:
        self.log.append("release")
        self.timeouts += self.late


def batches(log: list[str]) -> list[list[str]]:
    """What was queued behind each hold, in order; asserts nothing was queued outside one."""
    out, current = [], None
    for entry in log:
        if entry == "hold":
            assert current is None, "a hold inside a hold"
            current = []
        elif entry == "release":
            out.append(current)
            current = None
        elif current is not None:
            current.append(entry)
    return out


def test_peer_calls_are_queued_whole_behind_a_hold_then_read():
    log: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self) -> None:
            log.append("event")

        def elapsed_time(self, other: "Event") -> float:
            log.append("read")
            return 0.25

    torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event, synchronize=lambda: log.append("sync")))
    timer = HeldTimer(torch, RecordingHold(log), lambda index: log.append(f"flush {index}"))
    samples, late = timer.time(lambda: log.append("call"), reps=HOLD_BATCH + 8)
    assert samples == [0.25] * (HOLD_BATCH + 8) and late == 0
    queued = batches(log)
    assert [len(b) for b in queued] == [4 * HOLD_BATCH, 4 * 8]
    # each repetition: the flush, then the start event, the call and the end event, in that order
    expected = [[f"flush {i}", "event", "call", "event"] for i in range(HOLD_BATCH + 8)]
    assert queued[0] + queued[1] == list(itertools.chain(*expected))
    last_release = len(log) - 1 - log[::-1].index("release")
    assert log[last_release + 1] == "sync" and set(log[last_release + 2:]) == {"read"}  # read after


def test_runs_timed_in_turns_alternate_inside_each_held_batch_and_keep_their_own_times():
    log: list[str] = []
    ticks = itertools.count()

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            self.at = None

        def record(self) -> None:
            self.at = next(ticks)
            log.append("event")

        def elapsed_time(self, other: "Event") -> float:
            return float(other.at - self.at)

    torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event, synchronize=lambda: log.append("sync")))
    timer = HeldTimer(torch, RecordingHold(log), lambda index: log.append(f"flush {index}"))
    reps = HOLD_BATCH  # two runs: HOLD_BATCH // 2 repetitions of both a batch
    samples, late = timer.time_each({"ours": lambda: log.append("ours"), "peer": lambda: log.append("peer")}, reps)
    assert late == 0 and set(samples) == {"ours", "peer"}
    assert len(samples["ours"]) == len(samples["peer"]) == reps
    assert set(samples["ours"]) == set(samples["peer"]) == {1.0}  # each its own pair of events
    queued = batches(log)
    assert [len(b) for b in queued] == [8 * (HOLD_BATCH // 2)] * 2
    one = [[f"flush {i}", "event", "ours", "event", f"flush {i}", "event", "peer", "event"] for i in range(reps)]
    assert queued[0] + queued[1] == list(itertools.chain(*one))


def test_a_peer_timed_while_its_hold_timed_out_says_so():
    torch = SimpleNamespace(cuda=SimpleNamespace(
        Event=lambda enable_timing: SimpleNamespace(record=lambda: None, elapsed_time=lambda other: 1.0),
        synchronize=lambda: None))
    timer = HeldTimer(torch, RecordingHold([], late=True), lambda index: None)
    _, late = timer.time(lambda: None, reps=2 * HOLD_BATCH + 1)
    assert late == 3


@pytest.fixture
def trial(monkeypatch):
    """A KernelRun on a recording driver and a bench double: what it queues, in order, in ``log``."""
    log: list[str] = []
    driver = SimpleNamespace(
        cuEventRecord=lambda event, stream: (log.append("event"), (0,))[1],
        cuLaunchKernel=lambda *args: (log.append("launch"), (0,))[1],
        cuStreamSynchronize=lambda stream: (log.append("sync"), (0,))[1],
        cuEventElapsedTime=lambda start, stop: (log.append("read"), (0, 0.5))[1],
    )
    monkeypatch.setattr(workers.kernel_run, "driver_api", lambda: driver)
    bench = SimpleNamespace(stream="stream", hold=RecordingHold(log), last_event=None,
                            event=lambda: object(), flush_l2=lambda: log.append("flush"))
    launch = Launch("k", (1, 1, 1), (32, 1, 1), 0, ())
    trial = KernelRun(bench, None, launch)
    trial.functions, trial._params = ["function"], {"first": [(pack_params([]), [])]}
    return trial, log


def test_a_trials_repetitions_are_queued_behind_holds_and_read_after(trial):
    trial, log = trial
    times = repeat_in_turns([trial], HOLD_BATCH + 3, True)[0]
    assert times == [0.5] * (HOLD_BATCH + 3)
    queued = batches(log)
    # each batch: an event marking the hold's end, then per repetition flush, event, launch, event
    assert [b[0] for b in queued] == ["event", "event"]
    assert queued[0][1:] == ["flush", "event", "launch", "event"] * HOLD_BATCH
    assert len(queued[1]) == 1 + 4 * 3
    assert log[log.index("sync") - 1] == "release" and "read" not in log[:log.index("sync")]
    # every flush is counted from the event before it, the first of a batch from the hold's mark
    assert trial.flush_ms == pytest.approx(0.5 * (HOLD_BATCH + 3)) and trial.late_batches == 0


def test_two_kernels_in_turns_share_each_hold_and_keep_their_own_times(trial):
    """A trial and the anchor beside it (``workers.paired``): each round launches both, in
    order, each behind its own flush; a hold takes half as many rounds; each gets its times."""
    trial, log = trial
    anchor = KernelRun(trial.bench, None, trial.launch)
    anchor.functions, anchor._params = ["anchor"], {"first": [(pack_params([]), [])]}
    mine, theirs = repeat_in_turns([trial, anchor], HOLD_BATCH // 2 + 1, True)
    assert mine == theirs == [0.5] * (HOLD_BATCH // 2 + 1)
    queued = batches(log)
    assert len(queued) == 2 and queued[0][1:] == ["flush", "event", "launch", "event"] * HOLD_BATCH
    assert trial.flush_ms + anchor.flush_ms == pytest.approx(0.5 * (HOLD_BATCH + 2))


def test_a_trial_counts_holds_that_timed_out(trial):
    trial, log = trial
    trial.bench.hold.late = True
    repeat_in_turns([trial], 5, True)
    assert trial.late_batches == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_hold_and_flush_kernels_compile(tmp_path):
    binary = compile_hold((9, 0), cache_dir=tmp_path)
    assert KERNEL.encode() in binary.cubin and FLUSH_KERNEL.encode() in binary.cubin
    assert binary.resources is not None and binary.resources.stack_bytes == 0


def test_a_run_of_several_kernels_queues_them_in_order_between_one_pair_of_events(monkeypatch):
    """A split-K reduction after its products: one timed run is every kernel of the launch, each
    with its own geometry and arguments, a workspace buffer among them."""
    log: list[Any] = []
    driver = SimpleNamespace(
        cuEventRecord=lambda event, stream: (log.append("event"), (0,))[1],
        cuLaunchKernel=lambda function, *rest: (log.append((function, rest[:7])), (0,))[1],
    )
    monkeypatch.setattr(workers.kernel_run, "driver_api", lambda: driver)
    bench = SimpleNamespace(stream="stream", last_event=None, event=lambda: object())
    reduce = Launch("reduce", (8, 1, 1), (128, 1, 1), 0, (KernelArg("buffer", "c"), KernelArg("buffer", "partials")))
    launch = Launch("products", (8, 4, 1), (256, 1, 1), 1024, (KernelArg("buffer", "partials"),), then=(reduce,),
                    workspace=(("partials", 4096),))
    trial = KernelRun(bench, None, launch)
    trial.functions = ["products_fn", "reduce_fn"]
    buffers = {"c": (111, 64), "partials": (222, 4096)}
    trial._params = {"first": [trial._pack(step, buffers) for step in launch.kernels]}
    trial._timed_run("first")
    assert log == ["event", ("products_fn", (8, 4, 1, 256, 1, 1, 1024)), ("reduce_fn", (8, 1, 1, 128, 1, 1, 0)),
                   "event"]
    assert [v.value for v in trial._params["first"][1][1]] == [111, 222]  # reduce's arguments: c, partials
    assert Launch.from_json(launch.to_json()) == launch
    with pytest.raises(TemplateError, match="a later kernel has its own"):
        Launch("k", (1, 1, 1), (1, 1, 1), 0, (), then=(launch,))


def test_a_persistent_launch_is_capped_at_the_devices_sms_and_its_workspace_zeroed(monkeypatch):
    """A persistent kernel's grid counts its tiles; the launch takes at most blocks_per_sm_cap
    blocks per SM of the device it runs on. Its tile counter (a workspace buffer) starts at zero."""
    log: list[Any] = []
    driver = SimpleNamespace(
        cuEventRecord=lambda event, stream: (log.append("event"), (0,))[1],
        cuLaunchKernel=lambda function, *rest: (log.append((function, rest[:3])), (0,))[1],
        cuMemAlloc=lambda nbytes: (log.append(("alloc", nbytes)), (0, 333))[1],
        cuMemsetD8=lambda ptr, value, count: (log.append(("memset", ptr, value, count)), (0,))[1],
    )
    monkeypatch.setattr(workers.kernel_run, "driver_api", lambda: driver)
    info = SimpleNamespace(sm_count=4)
    bench = SimpleNamespace(stream="stream", last_event=None, event=lambda: object(), device_info=lambda: info)
    launch = Launch("persistent", (1000, 1, 1), (384, 1, 1), 0, (KernelArg("buffer", "tile_counter"),),
                    workspace=(("tile_counter", 8),), blocks_per_sm_cap=2)
    trial = KernelRun(bench, None, launch)
    trial.resident = None
    trial._allocate_workspace()
    assert log == [("alloc", 8), ("memset", 333, 0, 8)]
    trial.functions = ["fn"]
    trial._params = {"first": [trial._pack(launch, dict(trial._workspace))]}
    trial._timed_run("first")
    assert log[-2] == ("fn", (8, 1, 1))  # 2 blocks x 4 SMs of 1000 tiles
    info.sm_count = 1000
    trial._timed_run("first")
    assert log[-2] == ("fn", (1000, 1, 1))  # never more blocks than tiles


def test_runs_in_turns_share_the_target_and_the_launches_and_stop_early_together(trial):
    """``time_in_turns``: the rounds take about ``target_ms`` for all the runs, a trial alone at
    most ``max_reps`` launches and two in turns as many in all; a first median above
    ``abort_above_ms`` ends both after EARLY_REPS rounds."""
    from workers.kernel_run import EARLY_REPS, time_in_turns
    from workers.timing_options import TimingOptions

    trial, _ = trial
    anchor = KernelRun(trial.bench, None, trial.launch)
    anchor.functions, anchor._params = ["anchor"], {"first": [(pack_params([]), [])]}
    warmed = []
    for run in (trial, anchor):
        run.warm_up = lambda ms, run=run: (warmed.append((run, ms)), 0.5)[1]  # 0.5 ms a launch
    alone = time_in_turns([trial], TimingOptions(warmup_ms=20.0, target_ms=30.0, max_reps=40))
    assert [len(s) for s in alone] == [40] and warmed == [(trial, 20.0)]  # 60 wanted, 40 at most
    both = time_in_turns([trial, anchor], TimingOptions(warmup_ms=20.0, target_ms=30.0, max_reps=40))
    assert [len(s) for s in both] == [20, 20] and warmed[1:] == [(trial, 10.0), (anchor, 10.0)]
    stopped = time_in_turns([trial, anchor], TimingOptions(target_ms=30.0, abort_above_ms=0.1))
    assert [len(s) for s in stopped] == [EARLY_REPS] * 2 and trial.stopped_early
    assert trial.clocks == {"before": {}, "after": {}}
