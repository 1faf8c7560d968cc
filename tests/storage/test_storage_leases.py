"""A lease per config (``Repository.claim_trial``): one holder at a time, never a measured config,
never past the study's trial count, stale leases taken over; on SQLite and PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text

from storage import ClaimRefused, TrialOutcome, config_key, open_repository
from storage.models import utcnow


def _refused(call) -> str:
    with pytest.raises(ClaimRefused) as caught:
        call()
    return caught.value.why


def test_a_config_has_one_lease_and_is_never_claimed_once_measured(repo, study_args):
    study = repo.open_study("s", **study_args())
    number = repo.claim_trial(study.id, {"a": 1}, owner="h:1")
    assert _refused(lambda: repo.claim_trial(study.id, {"a": 1}, owner="h:2")) == "held"
    assert repo.claim_trial(study.id, {"a": 2}, owner="h:2") == number + 1
    repo.record_trial(study.id, number, {"a": 1}, TrialOutcome(status="ok", median_ms=1.0), owner="h:1")
    assert _refused(lambda: repo.claim_trial(study.id, {"a": 1}, owner="h:2")) == "measured"
    assert [r.params for r in repo.running(study.id)] == [{"a": 2}]


def test_the_trial_count_counts_measured_and_running_trials(repo, study_args):
    study = repo.open_study("s", **study_args())
    first = repo.claim_trial(study.id, {"a": 0}, owner="h:1", limit=2)
    repo.record_trial(study.id, first, {"a": 0}, TrialOutcome(status="failed", failure="crash"))
    repo.claim_trial(study.id, {"a": 1}, owner="h:2", limit=2)
    assert _refused(lambda: repo.claim_trial(study.id, {"a": 2}, owner="h:1", limit=2)) == "full"
    assert repo.claim_trial(study.id, {"a": 2}, owner="h:1", limit=3) == 2


def test_trials_are_counted_only_where_a_batch_may_reach_the_count_and_gaps_still_count(repo, study_args):
    """A claim bounds the study's trials by the span of their numbers and scans them only when
    the batch may pass the limit: far from it, no count is run; near it, trials dropped from
    the middle (gaps in the numbers) leave room that is granted, and no more."""
    from sqlalchemy import event

    study = repo.open_study("s", **study_args())
    counts: list[str] = []

    def seen(conn, cursor, statement, *args) -> None:
        if "count(" in statement.lower():
            counts.append(statement)

    event.listen(repo.engine, "before_cursor_execute", seen)
    try:
        assert repo.claim_trials(study.id, [{"a": i} for i in range(5)], owner="h:1", limit=100) == [0, 1, 2, 3, 4]
        assert counts == []  # 0 + 5 and then 5 + 5 are far from 100
        assert repo.claim_trials(study.id, [{"a": 5}], owner="h:1", limit=100) == [5]
        assert counts == []
        assert repo.drop_trial(study.id, 1) and repo.drop_trial(study.id, 3)  # numbers 0-5 hold 4
        granted = repo.claim_trials(study.id, [{"a": i} for i in range(6, 10)], owner="h:1", limit=7)
        assert counts  # 6 (the span) + 4 passes 7: counted
        assert granted[:3] == [6, 7, 8] and isinstance(granted[3], ClaimRefused) and granted[3].why == "full"
    finally:
        event.remove(repo.engine, "before_cursor_execute", seen)
    assert len(repo.running(study.id)) == 7


def test_a_stale_or_abandoned_lease_is_taken_over_and_its_owner_cannot_store(repo, study_args, url):
    study = repo.open_study("s", **study_args())
    old = repo.claim_trial(study.id, {"a": 1}, owner="killed:1")
    left = repo.claim_trial(study.id, {"a": 2}, owner="h:1")
    repo.leave_trial(study.id, left)  # Ctrl-C: no owner
    assert _refused(lambda: repo.claim_trial(study.id, {"a": 1}, owner="h:2")) == "held"
    engine = create_engine(url)
    with engine.begin() as connection:  # killed:1 stopped renewing two minutes ago
        connection.execute(text("UPDATE tuner_running_trials SET heartbeat_at = :t WHERE owner = 'killed:1'"),
                           {"t": (utcnow() - timedelta(minutes=2)).replace(tzinfo=None)})
    engine.dispose()
    taken = repo.claim_trial(study.id, {"a": 1}, owner="h:2")
    again = repo.claim_trial(study.id, {"a": 2}, owner="h:2")
    assert taken not in (old, left) and again not in (old, left)
    assert {(r.owner, r.params["a"]) for r in repo.running(study.id)} == {("h:2", 1), ("h:2", 2)}
    late = TrialOutcome(status="ok", median_ms=1.0)
    assert _refused(lambda: repo.record_trial(study.id, old, {"a": 1}, late, owner="killed:1")) == "lost"
    assert repo.trials(study.id) == []


def test_renewing_keeps_a_lease_and_an_owners_own_leftover_is_its_to_take(repo, study_args):
    study = repo.open_study("s", **study_args())
    number = repo.claim_trial(study.id, {"a": 1}, owner="h:1")
    before = repo.running(study.id)[0].heartbeat_at
    assert repo.renew_leases(study.id, "h:1") == 1 and repo.renew_leases(study.id, "h:9") == 0
    assert repo.running(study.id)[0].heartbeat_at >= before
    assert _refused(lambda: repo.claim_trial(study.id, {"a": 1}, owner="h:2", ttl_s=3600)) == "held"
    repo.claim_trial(study.id, {"a": 1}, owner="h:1")  # an earlier run's, in this process: taken anew
    assert [(r.owner, r.params) for r in repo.running(study.id)] == [("h:1", {"a": 1})]
    assert number == 0


def test_coordinators_claiming_together_get_each_config_once_and_stop_at_the_count(url, study_args):
    with open_repository(url) as repo:
        study = repo.open_study("shared", **study_args())

    def claim_all(owner: int) -> list[int]:
        won = []
        with open_repository(url) as mine:  # one repository per coordinator, like one per process
            for a in range(40):
                try:
                    won.append(mine.claim_trial(study.id, {"a": a}, owner=f"h:{owner}", limit=30))
                except ClaimRefused as refused:
                    assert refused.why in ("held", "full")
        return won

    with ThreadPoolExecutor(3) as pool:
        numbers = [n for won in pool.map(claim_all, range(3)) for n in won]
    with open_repository(url) as repo:
        running = repo.running(study.id)
    assert len(numbers) == len(set(numbers)) == len(running) == 30
    assert len({config_key(r.params) for r in running}) == 30


def test_a_batch_stores_every_trial_once_and_returns_what_reads_back(repo, study_args):
    """``claim_trials`` and ``record_trials`` insert a batch's rows in one statement each: every
    trial is stored once, under its number, and the records they return are those read back
    (ids, values, NaN as None, tuples as lists); a lost lease in the middle stores nothing."""
    study = repo.open_study("s", **study_args())
    configs = [{"a": i, "b": "x", "t": (1, 2) if i == 3 else True} for i in range(6)]
    numbers = repo.claim_trials(study.id, configs, owner="h:1")
    assert numbers == list(range(6)) and len(repo.running(study.id)) == 6
    repo.drop_trial(study.id, numbers[2])  # its lease lost
    state = {"name": "g", "sm_clock_mhz": 1980, "temp_c": 41.5}
    outcomes = [TrialOutcome(status="ok", median_ms=1.0 + n, iqr_ms=float("nan"), registers=96, gpu_state=state,
                             gpu_uuid="GPU-0", gpu_index=0) if n != 4 else
                TrialOutcome(status="failed", failure="wrong", reason="NaN output") for n in numbers]
    stored = repo.record_trials(study.id, list(zip(numbers, configs, outcomes)), owner="h:1")
    assert isinstance(stored[2], ClaimRefused) and stored[2].why == "lost"
    kept = [s for s in stored if not isinstance(s, ClaimRefused)]
    assert sorted(kept, key=lambda t: t.number) == repo.trials(study.id)
    read = {t.number: t for t in repo.trials(study.id)}
    assert sorted(read) == [0, 1, 3, 4, 5] and len({t.id for t in read.values()}) == 5
    assert read[3].params == {"a": 3, "b": "x", "t": [1, 2]} and read[0].params == {"a": 0, "b": "x", "t": True}
    assert read[0].iqr_ms is None and read[0].gpu_state == state and read[4].failure == "wrong"
    assert repo.running(study.id) == []
    assert repo.best("attention", [4, 16, 4096, 128], "fp16", {"causal": True}).median_ms == 1.0
    again = repo.claim_trials(study.id, configs, owner="h:2")  # measured, or (2) free again
    assert [g if isinstance(g, int) else g.why for g in again] == [
        "measured", "measured", 6, "measured", "measured", "measured"]


def test_batches_of_one_size_keep_their_answers_once_the_server_prepares_them(repo, study_args):
    """psycopg prepares a statement on its fifth run (PostgreSQL may then run one generic plan
    for any parameters): ten batches of one size, each half new configs and half measured ones,
    with one lease lost, get every answer a first run would give, on SQLite and PostgreSQL."""
    study = repo.open_study("s", **study_args())
    measured: list[dict] = []
    for batch in range(10):
        new = [{"a": batch, "i": i} for i in range(2)]
        granted = repo.claim_trials(study.id, new + measured[-2:], owner="h:1")
        assert [g if isinstance(g, int) else g.why for g in granted[2:]] == ["measured"] * len(measured[-2:])
        numbers = granted[:2]
        assert all(isinstance(n, int) for n in numbers)
        if batch == 7:
            repo.drop_trial(study.id, numbers[1])  # its lease lost
        stored = repo.record_trials(study.id, [(n, c, TrialOutcome(status="ok", median_ms=1.0 + n))
                                               for n, c in zip(numbers, new)], owner="h:1")
        assert [isinstance(s, ClaimRefused) for s in stored] == [False, batch == 7]
        measured += new if batch != 7 else new[:1]
    assert sorted(config_key(t.params) for t in repo.trials(study.id)) == sorted(map(config_key, measured))
    assert repo.running(study.id) == []


def test_the_claim_that_takes_a_study_past_each_doubling_analyzes_the_trial_tables(repo, study_args, monkeypatch):
    """PostgreSQL plans a claim's lookups from its statistics of the trial tables: they are taken
    again by the claim whose trials pass ANALYZE_FROM, twice it, four times it..., and by no
    other (PostgreSQL's row estimate, pg_class.reltuples, changes only then). SQLite: none."""
    from storage import batches

    monkeypatch.setattr(batches, "ANALYZE_FROM", 4)
    study = repo.open_study("s", **study_args())
    postgres = repo.engine.dialect.name == "postgresql"

    def estimates() -> tuple[float, float] | None:
        with repo.engine.connect() as connection:
            if not postgres:
                stat = connection.execute(text("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'"))
                assert stat.scalar() == 0  # never analyzed
                return None
            return tuple(connection.execute(text(
                "SELECT (SELECT reltuples FROM pg_class WHERE oid = 'tuner_trials'::regclass), "
                "(SELECT reltuples FROM pg_class WHERE oid = 'tuner_running_trials'::regclass)")).one())

    def batch(first: int) -> None:  # three configs claimed, then stored: trials first..first+2
        configs = [{"a": first + i} for i in range(3)]
        numbers = repo.claim_trials(study.id, configs, owner="h:1")
        assert numbers == [first, first + 1, first + 2]
        repo.record_trials(study.id, [(n, c, TrialOutcome(status="ok", median_ms=1.0 + n))
                                      for n, c in zip(numbers, configs)], owner="h:1")

    never = estimates()
    batch(0)  # 0-2: below 4
    assert estimates() == never
    batch(3)  # 3-5 passes 4: analyzed after the claim, when 3 were stored and 3 running
    assert estimates() == ((3.0, 3.0) if postgres else None)
    batch(6)  # 6-8 passes 8: 6 stored, 3 running
    assert estimates() == ((6.0, 3.0) if postgres else None)
    batch(9)  # 9-11: no doubling passed
    assert estimates() == ((6.0, 3.0) if postgres else None)
    assert len(repo.trials(study.id)) == 12 and repo.running(study.id) == []
