"""The job routes of `tuner serve` in process, on an empty database of each backend: only a
token of the write scope submits or cancels, a bad job is refused in one line before anything
is queued, bodies are bounded; the queue hands jobs out by priority and in turn among equals."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Iterator

import pytest

from tuner.cli.commands import main

JOB = {"family": "attention", "trials": 6, "priority": 1,
       "problems": [{"shape": "2,8,1024,64", "dtype": "fp16", "flags": {"causal": True}}]}


def _token(capsys: pytest.CaptureFixture[str], url: str, scope: str) -> str:
    capsys.readouterr()
    assert main(["token", "create", "--scope", scope, "--db", url]) == 0
    text = capsys.readouterr().out.strip()
    assert text.startswith("tkn_") and len(text.splitlines()) == 1
    return text


@pytest.fixture
def served(url: str, capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[object, dict[str, str], object]]:
    """(client, {scope: token}, writer) over an empty database of ``url``'s backend."""
    from fastapi.testclient import TestClient

    from storage import open_repository, open_writer
    from tuner.answers.reader import open_reader
    from tuner.answers.serve import create_app
    from tuner.jobs.routes import Access

    open_repository(url).close()
    made = {scope: _token(capsys, url, scope) for scope in ("read", "write")}
    with open_reader(url) as reader, open_writer(url) as writer:
        yield TestClient(create_app(reader, Access(writer=writer)), raise_server_exceptions=False), made, writer


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _one_line(answer: object, status: int) -> str:
    assert answer.status_code == status, answer.text
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and "\n" not in detail and "Traceback" not in detail
    return detail


def test_only_a_write_token_submits_and_cancels(served):
    client, made, writer = served
    assert "write scope" in _one_line(client.post("/jobs", json=JOB), 401)
    assert client.post("/jobs", json=JOB).headers["www-authenticate"] == "Bearer"
    assert "read scope" in _one_line(client.post("/jobs", json=JOB, headers=_auth(made["read"])), 403)
    forged = made["write"][:-4] + ("AAAA" if not made["write"].endswith("AAAA") else "BBBB")
    assert "not known" in _one_line(client.post("/jobs", json=JOB, headers=_auth(forged)), 401)
    assert _one_line(client.post("/jobs", json=JOB, headers={"Authorization": made["write"]}), 401)
    assert client.get("/jobs").json() == []  # nothing refused was queued
    answer = client.post("/jobs", json=JOB, headers=_auth(made["write"]))
    assert answer.status_code == 201
    job = answer.json()
    assert job["state"] == "queued" and job["budget"] == 6 and job["measured"] == 0 and job["eta_s"] is None
    assert job["problems"] == [{"shape": [2, 8, 1024, 64], "dtype": "fp16", "flags": {"causal": True},
                                "state": "waiting", "reason": None, "study": None, "measured": 0,
                                "best_median_ms": None}]
    assert client.get(f"/jobs/{job['id']}").json() == job  # reads are open on loopback
    assert [j["id"] for j in client.get("/jobs").json()] == [job["id"]]
    assert _one_line(client.delete(f"/jobs/{job['id']}", headers=_auth(made["read"])), 403)
    cancelled = client.delete(f"/jobs/{job['id']}", headers=_auth(made["write"]))
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["eta_s"] == 0.0
    assert _one_line(client.delete("/jobs/999", headers=_auth(made["write"])), 404) == "no job 999"
    assert _one_line(client.get("/jobs/999"), 404) == "no job 999"


BAD_JOBS = [
    ({"family": "nope"}, "unknown family 'nope'"),
    ({"family": "../templates/attention"}, "unknown family"),
    ({"trials": 0}, "trials must be"),
    ({"trials": True}, "trials must be"),
    ({"priority": 1000}, "priority must be"),
    ({"sampler": "best"}, "unknown sampler"),
    ({"problems": []}, "problems must be a list of 1 to 64"),
    ({"problems": [{"shape": "2,8,1024,64"}] * 65}, "problems must be a list of 1 to 64"),
    ({"problems": [{"shape": "2,8,1024,63", "dtype": "fp16"}]}, "problem 1:"),
    ({"problems": [{"shape": "2,8,1024,64", "dtype": "fp99"}]}, "problem 1:"),
    ({"problems": [{"shape": "2,8,1024,64", "dtype": "fp16", "flags": {"nope": 1}}]}, "problem 1:"),
    ({"problems": [{"shape": "2,8,1024,64", "dtype": "fp16", "size": 1}]}, "problem 1: unknown key 'size'"),
    ({"extra": 1}, "unknown field 'extra'"),
]


def test_a_bad_job_is_refused_in_one_line_and_nothing_is_queued(served):
    client, made, _ = served
    for change, says in BAD_JOBS:
        detail = _one_line(client.post("/jobs", json={**JOB, **change}, headers=_auth(made["write"])), 422)
        assert says in detail, (change, detail)
    assert client.get("/jobs").json() == []


def test_bodies_are_bounded_and_must_be_json(served):
    client, made, _ = served
    big = {**JOB, "problems": [{"shape": "2,8,1024,64", "dtype": "fp16", "flags": {"causal": True}}] * 2000}
    assert "over 65536 bytes" in _one_line(client.post("/jobs", json=big, headers=_auth(made["write"])), 413)
    assert "not JSON" in _one_line(client.post("/jobs", content=b"{", headers=_auth(made["write"])), 422)
    assert _one_line(client.post("/jobs", json=[1], headers=_auth(made["write"])), 422)
    assert client.get("/jobs").json() == []


def test_off_loopback_every_read_needs_a_token(url, capsys):
    from fastapi.testclient import TestClient

    from storage import open_repository
    from tuner.answers.reader import open_reader
    from tuner.answers.serve import create_app
    from tuner.jobs.routes import Access

    open_repository(url).close()
    read = _token(capsys, url, "read")
    with open_reader(url) as reader:
        client = TestClient(create_app(reader, Access(open_reads=False)), raise_server_exceptions=False)
        for path in ("/studies", "/jobs", "/families"):
            assert "token" in _one_line(client.get(path), 401)
            assert client.get(path, headers=_auth(read)).status_code == 200
        assert "token" in _one_line(client.get("/studies", headers=_auth("tkn_forged")), 401)
        for path in ("/", "/page.js"):  # the page itself holds no data: it sends the token typed into it
            assert client.get(path).status_code == 200
        # a server that writes no jobs says so, once a write token passes
        write = _token(capsys, url, "write")
        assert "read-only" in _one_line(client.post("/jobs", json=JOB, headers=_auth(write)), 503)


def test_serve_off_loopback_without_a_token_is_refused_in_one_line(tmp_path, capsys):
    from storage import open_repository

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    open_repository(url).close()
    assert main(["serve", "--db", url, "--host", "0.0.0.0", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tuner: error: refusing to serve on 0.0.0.0 without a token") and len(err.splitlines()) == 1


def test_the_queue_runs_by_priority_and_in_turn_among_equals(url):
    from storage import JobSpec, open_repository

    problem = ([2, 8, 1024, 64], "fp16", {"causal": True})
    live = lambda runner, heartbeat: False  # noqa: E731 - every other runner is alive
    with open_repository(url) as repo:
        low = repo.submit_job(JobSpec("attention", [problem], trials=6, priority=0))
        later = repo.submit_job(JobSpec("attention", [problem], trials=6, priority=0))
        high = repo.submit_job(JobSpec("attention", [problem], trials=6, priority=5))
        taken = []
        for _ in range(5):
            job = repo.take_job("here:1", live)
            taken.append(job.id)
            repo.release_job(job.id, "here:1", state="done" if job.id == high else None)
        assert taken == [high, low, later, low, later]  # the higher first; then equals in turn
        held = {repo.take_job("here:1", live).id, repo.take_job("there:2", live).id}
        assert held == {low, later} and repo.take_job("third:3", live) is None  # each held by a live runner
        assert repo.take_job("third:3", lambda runner, heartbeat: True).id in held  # its runner gone
        assert repo.cancel_job(low).state == "cancelled" and repo.cancel_job(low).reason == "cancelled by a client"
        repo.release_job(low, "there:2", state="done")  # a slice ending after the cancel: stays cancelled
        assert repo.job(low).state == "cancelled"
        assert {j.id for j in repo.jobs(["queued", "running"])} == {later}
        assert repo.job(later).started_at - repo.job(later).submitted_at < timedelta(minutes=1)


def test_jobs_are_taken_several_at_once_of_the_highest_priority_open(url):
    from storage import JobSpec, open_repository
    from tuner.jobs.scheduler import split

    problem = ([2, 8, 1024, 64], "fp16", {"causal": True})
    live = lambda runner, heartbeat: False  # noqa: E731 - every other runner is alive
    with open_repository(url) as repo:
        first, second, third = (repo.submit_job(JobSpec("attention", [problem], trials=6)) for _ in range(3))
        assert [j.id for j in repo.take_jobs("here:1", live, most=2)] == [first, second]
        # those running here are not taken again
        assert [j.id for j in repo.take_jobs("here:1", live, most=2, running=[first, second])] == [third]
        repo.release_job(third, "here:1")
        repo.release_job(first, "here:1")
        assert [j.id for j in repo.take_jobs("here:1", live, most=2, running=[second])] == [third, first]
        high = repo.submit_job(JobSpec("attention", [problem], trials=6, priority=5))
        for job in (first, second, third):
            repo.release_job(job, "here:1")
        taken = repo.take_jobs("here:1", live, most=4)
        assert [j.id for j in taken] == [high] and taken[0].state == "running"
        # while the higher priority runs here, the lower ones wait, though GPUs are free
        assert repo.take_jobs("here:1", live, most=3, running=[high]) == []
    assert split(2, 1) == [2] and split(2, 2) == [1, 1] and split(3, 2) == [2, 1] and split(4, 3) == [2, 1, 1]


def test_a_jobs_progress_comes_as_server_sent_events_until_it_is_over(served):
    client, made, _ = served
    job = client.post("/jobs", json=JOB, headers=_auth(made["write"])).json()
    client.delete(f"/jobs/{job['id']}", headers=_auth(made["write"]))
    with client.stream("GET", f"/jobs/{job['id']}/events") as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
        text = "".join(answer.iter_text())
    event, data = text.strip().split("\n")
    assert event == "event: progress" and json.loads(data.removeprefix("data: "))["state"] == "cancelled"
    assert _one_line(client.get("/jobs/0/events"), 422)


def test_submitting_with_a_write_token_answers_as_the_schema_says(tmp_path, capsys):
    """schemathesis against POST /jobs and DELETE /jobs/{id} with a write token: generated jobs,
    valid and not, are queued (201, the job's documented shape) or refused in one line."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import positive_data_acceptance

    from storage import open_repository, open_writer
    from tuner.answers.reader import open_reader
    from tuner.answers.serve import create_app
    from tuner.jobs.routes import Access

    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    open_repository(url).close()
    write = _token(capsys, url, "write")
    with open_reader(url) as reader, open_writer(url) as writer:
        schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(reader, Access(writer=writer)))
        for path, method in (("/jobs", "POST"), ("/jobs/{job_id}", "DELETE")):
            strategy = schema[path][method].as_strategy()

            @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            @given(case=strategy)
            def run(case: schemathesis.Case) -> None:
                answer = case.call_and_validate(headers=_auth(write), excluded_checks=[positive_data_acceptance])
                assert answer.status_code < 500
                if answer.status_code >= 400:
                    assert "\n" not in answer.json()["detail"]

            run()
