"""Honest winners: a study's fastest trials re-timed interleaved at its end, the winner chosen by
those medians (fake pools whose re-timing disagrees with the search; replay through Ray)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

import tuner
from tuner.study import final_best
import tuner.api
from storage import open_repository, params_key
from tuner.answers.exporter import launch_path
from tuner.cli.commands import main
from tuner.study.final_best import candidates
from tuner_doubles import PROBLEM, RETIME_AFTER, RETIME_BEFORE, FakePool, latency_ms
from workers.results import Measurement

SHAPE = ["--shape", PROBLEM[0], "--dtype", PROBLEM[1]]
REAL_OPEN_POOL, REAL_RAY = tuner.api._open_pool, tuner.api._ray  # before `pools` replaces them


class SlowerWhenRetimed(FakePool):
    """Re-timed, the search's fastest config is slower than its runner-up (``by`` ms more)."""

    def __init__(self, by: float | Measurement = 0.05, **kwargs) -> None:
        super().__init__(**kwargs)
        self.by = by
        self.changed: dict[str, float | Measurement] = {}

    def retime(self, kernels, *, rounds, max_seconds):
        first, second = kernels[0][0], kernels[1][0]
        slower = self.by if isinstance(self.by, Measurement) else latency_ms(second) + self.by
        self.changed = {params_key(first): slower}
        return super().retime(kernels, rounds=rounds, max_seconds=max_seconds)

    def retime_ms(self, params):
        return self.changed.get(params_key(params), latency_ms(params))


def _fastest(trials, n):
    ok = sorted((t for t in trials if t.status == "ok"), key=lambda t: (t.median_ms, t.number))
    return ok[:n]


def _logged(caplog):
    caplog.set_level(logging.INFO, logger="tuner")
    handler = caplog.handler
    logging.getLogger("tuner").addHandler(handler)  # the CLI tests may have stopped propagation
    return handler


def test_the_winner_is_chosen_by_the_retimed_medians(toy, db, pools, caplog, tmp_path):
    pool = SlowerWhenRetimed()
    pools.queued.append(pool)
    handler = _logged(caplog)
    try:
        result = tuner.tune("toy", *PROBLEM, trials=20, db=db, seed=0, sampler="random")
    finally:
        logging.getLogger("tuner").removeHandler(handler)
    detail = tuner.show(result.study, db=db)
    first, second, *rest = _fastest(detail.trials, 5)
    assert [params_key(p) for p in pool.retimed[0]] == [
        params_key(t.params) for t in (first, second, *rest)]  # the top 5, fastest first
    assert first.median_ms <= second.median_ms  # the search ranked `first` ahead

    slower = second.median_ms + 0.05
    assert [(r.trial_number, r.rank) for r in result.retimed][:2] == [(second.number, 1), (first.number, 2)]
    assert result.retimed[1].median_ms == pytest.approx(slower)
    for record in result.retimed:
        assert record.repetitions == 30 and record.ok and not record.replayed
        assert record.gpu_state == {"before": RETIME_BEFORE, "after": RETIME_AFTER, "rounds": 30}
        assert record.search_median_ms == latency_ms(
            next(t.params for t in detail.trials if t.number == record.trial_number))
    assert detail.retimes == list(result.retimed)

    winner = tuner.best("toy", *PROBLEM, db=db)
    assert winner.params == second.params and winner.trial_number == second.number
    assert winner.median_ms == pytest.approx(second.median_ms) and winner.retime.rank == 1
    assert winner.search_median_ms == second.median_ms and winner.repetitions == 30
    assert result.best == winner
    assert first.median_ms == latency_ms(first.params)  # the trials keep the search's numbers

    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("re-timed"))
    assert line.startswith("re-timed top 5 interleaved (30 rounds): ")
    assert f"#{second.number} {second.median_ms:.4f} ms (search {second.median_ms:.4f})" in line
    assert f"winner #{second.number} (the search's was #{first.number})" in line
    assert line.endswith("SM 1980->1755 MHz, 41->58 C")

    launch = json.loads(launch_path(tuner.export("toy", *PROBLEM, out_dir=tmp_path / "out", db=db))
                        .read_text())
    assert launch["params"] == second.params and launch["measured"]["retimed"]
    assert launch["measured"]["median_ms"] == winner.median_ms


def test_a_candidate_that_fails_when_retimed_cannot_win(toy, db, pools):
    wrong = Measurement.failed("wrong", "relative error 0.5 > 2e-2", error=0.5)
    pool = SlowerWhenRetimed(by=wrong)
    pools.queued.append(pool)
    result = tuner.tune("toy", *PROBLEM, trials=20, db=db, seed=0, sampler="random")
    first, second, *_ = _fastest(tuner.show(result.study, db=db).trials, 5)
    failed = [r for r in result.retimed if not r.ok]
    assert [(r.trial_number, r.rank, r.failure) for r in failed] == [(first.number, None, "wrong")]
    assert failed[0].reason == "relative error 0.5 > 2e-2" and result.retimed[-1] == failed[0]
    assert tuner.best("toy", *PROBLEM, db=db).trial_number == second.number
    trial = next(t for t in tuner.show(result.study, db=db).trials if t.number == first.number)
    assert trial.status == "ok"  # a re-timing never changes a stored trial


def test_retime_zero_keeps_the_search_winner(toy, db, pools):
    pools.queued.append(SlowerWhenRetimed())
    result = tuner.tune("toy", *PROBLEM, trials=20, db=db, seed=0, sampler="random", retime=0)
    assert pools.used[0].retimed == [] and result.retimed == ()
    first = _fastest(tuner.show(result.study, db=db).trials, 1)[0]
    winner = tuner.best("toy", *PROBLEM, db=db)
    assert winner.trial_number == first.number and winner.retime is None
    with pytest.raises(tuner.UsageError, match="0 or more"):
        tuner.tune("toy", *PROBLEM, trials=3, db=db, retime=-1)


def test_interrupted_runs_and_runs_with_nothing_new_are_not_retimed(toy, db, pools):
    pools.queued.append(FakePool(per_poll=1, interrupt_after_polls=5))
    first = tuner.tune("toy", *PROBLEM, trials=12, db=db, seed=0)
    assert first.status == "interrupted" and pools.used[0].retimed == [] and first.retimed == ()
    second = tuner.tune("toy", *PROBLEM, trials=12, db=db, seed=0)  # resumes, then re-times
    retimed = pools.used[1].retimed  # the top 5; then those within the leader's noise, again
    assert second.status == "finished" and len(retimed[0]) == 5
    assert len(retimed) <= 1 + final_best.TIE_ROUNDS and all(1 < len(r) < 5 and r[0] in retimed[0] for r in retimed[1:])
    assert len(second.retimed) == 5 and second.best.retime == second.retimed[0]
    third = tuner.tune("toy", *PROBLEM, trials=12, db=db, seed=0)  # the same top 5
    assert third.measured == 0 and pools.used[2].retimed == [] and third.retimed == ()
    record = next(s for s in tuner.studies(db=db) if s.name == first.study)
    assert len(open_repository(db).retimes(record.id, every=True)) == 5


def test_candidates_are_the_fastest_ok_trials_with_distinct_cubins():
    def trial(number, ms, cubin, status="ok"):
        return SimpleNamespace(number=number, median_ms=ms, cubin_hash=cubin, ok=status == "ok")

    trials = [trial(0, 1.3, "a"), trial(1, 1.0, "b"), trial(2, 1.0, "b"), trial(3, 0.5, "c", "failed"),
              trial(4, 1.1, None), trial(5, 1.2, None), trial(6, 1.0, "d")]
    assert [t.number for t in candidates(trials, 5)] == [1, 6, 4, 5, 0]
    assert [t.number for t in candidates(trials, 2)] == [1, 6]
    assert candidates(trials[3:4], 5) == []


def _run(argv):
    try:
        return main(argv)
    except SystemExit as exit:
        return int(exit.code)


def test_cli_retime_option_and_output(toy, db, pools, capsys):
    pools.queued.append(SlowerWhenRetimed())
    assert _run(["tune", "toy", *SHAPE, "--trials", "12", "--seed", "1", "--db", db]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("re-timed  "))
    assert line.startswith("re-timed  top 5 interleaved (30 rounds): winner #")
    assert _run(["best", "toy", *SHAPE, "--db", db]) == 0
    out = capsys.readouterr().out
    assert " ms re-timed (min " in out and "30 reps" in out
    assert "rank 1 of the study's fastest, interleaved (30 rounds); search median" in out
    assert "SM 1980->1755 MHz, 41->58 C" in out
    assert _run(["show", tuner.studies(db=db)[0].name, "--db", db]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 13 and sum(" | re-timed " in line for line in shown) == 5
    assert _run(["tune", "toy", *SHAPE, "--trials", "12", "--retime", "-1", "--db", db]) == 2
    assert "must be 0 or more" in capsys.readouterr().err


def test_a_replayed_study_is_retimed_from_the_landscape(toy, db, pools, tmp_path, monkeypatch):
    """The whole flow through real Ray actors and ReplayBench, as ``tune --replay`` runs it."""
    recorded = tuner.tune("toy", *PROBLEM, trials=20, db=db, seed=0, sampler="random")
    path = tuner.record_landscape(recorded.study, tmp_path / "toy.json", db=db)
    monkeypatch.setattr(tuner.api, "_open_pool", REAL_OPEN_POOL)  # a WorkerPool on ReplayBench
    monkeypatch.setattr(tuner.api, "_ray", REAL_RAY)  # and the study writer in a Ray actor
    replay_db = f"sqlite:///{tmp_path / 'replay.db'}"
    result = tuner.tune("toy", *PROBLEM, trials=8, db=replay_db, seed=1, replay=path)
    assert result.status == "finished" and result.retimed
    ok = [r for r in result.retimed if r.ok]
    assert ok and all(r.replayed and r.median_ms == r.search_median_ms for r in ok)
    assert all(r.gpu_state == {"before": {}, "after": {}, "rounds": 0} for r in result.retimed)
    winner = tuner.best("toy", *PROBLEM, db=replay_db)
    assert winner.retime.replayed and winner.replayed
    assert winner.median_ms == min(t.median_ms for t in tuner.show(result.study, db=replay_db).trials
                                   if t.status == "ok")



class _Trial:
    def __init__(self, number, registers, params):
        self.number, self.registers, self.smem_static, self.params = number, registers, 0, params


class _TimesAgain:
    """A pool whose re-timings answer each kernel's params' ``ms`` (with a small IQR)."""

    def __init__(self):
        self.calls = []

    def retime(self, kernels, *, rounds, max_seconds):
        from workers.results import Measurement, Retiming, Timing

        self.calls.append([k[0]["ms"] for k in kernels])
        return Retiming(tuple(Measurement(ok=True, timing=Timing(k[0]["ms"], k[0]["ms"], k[0]["ms"],
                                                                 k[0]["ms"] * 0.001, 100)) for k in kernels), rounds)


def _decided(toy, timings):
    """(trial number, median, registers) re-timed once: the decision and the pool's extra calls."""
    from storage import RetimeEntry

    problem = toy.parse_problem(*PROBLEM)
    entries = {n: RetimeEntry(n, median_ms=ms, iqr_ms=ms * 0.001, repetitions=100) for n, ms, _ in timings}
    by_number = {n: (_Trial(n, regs, {"BLOCK_M": 64}), ({"ms": ms}, "src", None, ())) for n, ms, regs in timings}
    pool = _TimesAgain()
    decided = final_best._decide(toy, problem, pool, entries, by_number, final_best._Again(30, 5.0, False))
    return decided, pool.calls


def test_a_tie_within_the_noise_is_timed_again_then_broken_by_fewer_registers(toy):
    decided, calls = _decided(toy, [(3, 1.000, 128), (7, 1.001, 96), (9, 1.10, 64)])
    assert calls == [[1.000, 1.001]] * final_best.TIE_ROUNDS  # the leader and its tie, again; not #9 (10% off)
    assert decided.tied == [7, 3] and decided.broken_by == "registers" and decided.order == [7, 3, 9]
    assert "winner #7 by registers" in decided.text() and decided.state()["tie_retimings"] == 2


def test_a_leader_apart_from_the_rest_wins_without_more_timing(toy):
    decided, calls = _decided(toy, [(3, 1.000, 255), (7, 1.05, 96)])
    assert calls == [] and decided.tied == [] and decided.order == [3, 7] and decided.state() == {}


def test_the_candidates_grow_with_the_noise_up_to_three_times_top():
    """Past the top, trials still within the leader's noise are re-timed too (3x top at most);
    a trial outside it stops the list."""
    def trial(number, ms, interval):
        return SimpleNamespace(number=number, ok=True, normalized_ms=None, median_ms=ms, cubin_hash=f"c{number}",
                               interval_ms=interval)

    quiet = [trial(n, 1.0 + 0.01 * n, 0.001) for n in range(12)]
    assert [t.number for t in final_best.candidates(quiet, 3)] == [0, 1, 2]  # 1.03 is out of 1.00's noise
    noisy = [trial(n, 1.0 + 0.01 * n, 0.05) for n in range(12)]  # +-5%: 1.00 to 1.09 overlap
    assert [t.number for t in final_best.candidates(noisy, 3)] == list(range(9))  # capped at 3 x 3
    assert [t.number for t in final_best.candidates(noisy, 5)] == list(range(10))  # 1.10 and past: not within 0.10
