"""`tuner serve`: every answer equals the matching command's, bad queries get one line and a 4xx,
the server never writes, creates or migrates a database, and its cache never outlives a best."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from serve_data import ROOT, TUNED, UNTUNED
from tuner.cli.commands import main


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def query(spec: tuple[str, str, dict]) -> dict[str, str]:
    shape, dtype, flags = spec
    return {"family": "attention", "shape": shape, "dtype": dtype,
            **{name: str(value).lower() for name, value in flags.items()}}


def cli_problem(spec: tuple[str, str, dict]) -> list[str]:
    shape, dtype, flags = spec
    return ["attention", "--shape", shape, "--dtype", dtype, *[f"--{n}" for n, on in flags.items() if on]]


@pytest.mark.parametrize("spec", [TUNED[0], TUNED[1], UNTUNED], ids=["tuned", "tuned-2", "untuned"])
def test_best_is_what_best_json_prints(client, served_db, capsys, spec):
    answer = client.get("/best", params=query(spec))
    assert answer.status_code == 200
    assert answer.json() == cli_json(capsys, "best", *cli_problem(spec), "--json", "--db", served_db)
    assert answer.json()["measured"] is (spec is not UNTUNED)
    if spec is UNTUNED:  # the rule's pick, from a tuned problem, says so
        assert answer.json()["source"] in {"2x8x1024x64-fp16-causal", "4x8x512x64-fp16-causal"}
    else:
        assert answer.json()["median_ms"] > 0 and answer.json()["device"]["name"] == "NVIDIA H200"


def test_export_is_what_export_writes(client, served_db, tmp_path, capsys):
    answer = client.get("/export", params=query(TUNED[0]))
    assert answer.status_code == 200
    assert main(["export", *cli_problem(TUNED[0]), "-o", str(tmp_path), "--db", served_db]) == 0
    cu = tmp_path / answer.json()["name"]
    assert answer.json()["source"] == cu.read_text()
    assert answer.json()["launch"] == json.loads(cu.with_suffix(".launch.json").read_text())
    assert "__global__" in answer.json()["source"] and answer.json()["launch"]["grid"]


def test_studies_show_and_coverage_are_what_the_commands_print(client, served_db, capsys):
    studies = client.get("/studies").json()
    assert studies == cli_json(capsys, "studies", "--json", "--db", served_db)
    assert len(studies) == 2 and all(s["n_trials"] == 12 and s["settings"]["trials"] == 12 for s in studies)
    for ref in (studies[0]["name"], str(studies[1]["id"])):
        shown = client.get(f"/studies/{ref}")
        assert shown.status_code == 200
        assert shown.json() == cli_json(capsys, "show", ref, "--json", "--db", served_db)
        assert len(shown.json()["trials"]) == 12
    served = client.get("/coverage", params={"family": "attention"}).json()
    printed = cli_json(capsys, "coverage", "attention", "--json", "--db", served_db)
    for rows in (served["rows"], printed["rows"]):  # the age is counted at the call
        for row in rows:
            assert row.pop("age_s") >= 0
    assert served == printed and len(served["rows"]) == 2


@pytest.mark.parametrize("path, params, status, says", [
    ("/best", {"family": "nope", "shape": "1,1,1,64", "dtype": "fp16"}, 400, "unknown family 'nope'"),
    ("/best", {"family": "/etc/passwd", "shape": "1", "dtype": "fp16"}, 400, "unknown family"),
    ("/best", {"family": "attention:FAMILY", "shape": "1", "dtype": "fp16"}, 400, "unknown family"),
    ("/best", {**query(TUNED[0]), "shape": "2,8,x,64"}, 400, "malformed shape"),
    ("/best", {**query(TUNED[0]), "dtype": "fp64"}, 400, "fp64"),
    ("/best", {**query(TUNED[0]), "causal": "maybe"}, 400, "causal='maybe'"),
    ("/best", {**query(TUNED[0]), "colour": "red"}, 400, "unknown problem flag 'colour'"),
    ("/best", {"family": "gemm", "shape": "64,64,64", "dtype": "fp16", "causal": "true"}, 400,
     "gemm: unknown problem flag 'causal'"),
    ("/best", {"family": "gemm", "shape": "64,64,64", "dtype": "fp16"}, 404, "no validated result stored for gemm"),
    ("/best", {"family": "attention", "dtype": "fp16"}, 422, "shape: Field required"),
    ("/best", {**query(TUNED[0]), "device": "NVIDIA B200"}, 404, "on NVIDIA B200"),
    ("/export", {**query(UNTUNED)}, 404, "no validated result stored"),
    ("/studies/nothing-of-that-name", {}, 404, "no study named 'nothing-of-that-name'"),
    ("/studies", {"limit": "3"}, 400, "unknown query parameter 'limit'"),
    ("/coverage", {}, 422, "family: Field required"),
    ("/coverage", {"family": "nope"}, 400, "unknown family"),
    ("/no/such/page", {}, 404, "Not Found"),
])
def test_a_bad_query_gets_one_line_and_a_4xx(client, path, params, status, says):
    answer = client.get(path, params=params)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    detail = answer.json()["detail"]
    assert isinstance(detail, str) and says in detail and "\n" not in detail and "Traceback" not in detail


def test_a_repeated_flag_is_refused(client):
    answer = client.get("/best?family=attention&shape=2,8,1024,64&dtype=fp16&causal=true&causal=false")
    assert answer.status_code == 400 and "more than once" in answer.json()["detail"]


def test_a_cached_answer_never_outlives_a_new_best(db_copy):
    """/best is answered from a cache; a faster trial stored meanwhile (another process's study)
    is served at the next request, and so is a re-timing that moves the best."""
    from fastapi.testclient import TestClient

    from storage import RetimeEntry, TrialOutcome, open_repository
    from tuner.answers.reader import open_reader
    from tuner.answers.serve import create_app

    with open_reader(db_copy) as reader:
        client = TestClient(create_app(reader))
        before = client.get("/best", params=query(TUNED[0])).json()
        assert client.get("/best", params=query(TUNED[0])).json() == before  # from the cache
        with open_repository(db_copy) as writer:
            study = next(s for s in writer.studies() if s.name == before["study"])
            faster = before["median_ms"] / 2
            writer.record_trial(study.id, 1000, before["params"], TrialOutcome("ok", median_ms=faster, tflops=1.0))
            now = client.get("/best", params=query(TUNED[0])).json()
            assert now["median_ms"] == faster and now["trial_number"] == 1000
            writer.record_retiming(study.id, [RetimeEntry(1000, median_ms=faster * 3, repetitions=30)])
            moved = client.get("/best", params=query(TUNED[0])).json()
            assert moved["median_ms"] == faster * 3 and moved["retime"]["rank"] == 1
        assert client.get("/export", params=query(TUNED[0])).json()["launch"]["measured"]["median_ms"] == faster * 3


def test_a_new_best_drops_its_problems_answers_and_the_rules_and_keeps_the_others(db_copy):
    """A study running stores new bests of its own problem: the stored winners of the other
    problems stay cached; the rule's answers (which read every best) are read again."""
    from fastapi.testclient import TestClient

    from storage import TrialOutcome, open_repository
    from tuner.answers.reader import open_reader
    from tuner.answers.serve import create_app

    with open_reader(db_copy) as reader:
        client = TestClient(create_app(reader))
        specs = (*TUNED, UNTUNED)
        answers = [client.get("/best", params=query(spec)).json() for spec in specs]
        held = [reader.cached("best", "attention", *spec) for spec in specs]
        assert held == answers
        moved = TUNED[0]
        with open_repository(db_copy) as writer:
            study = next(s for s in writer.studies() if s.name == answers[0]["study"])
            faster = answers[0]["median_ms"] / 2
            writer.record_trial(study.id, 1000, answers[0]["params"], TrialOutcome("ok", median_ms=faster, tflops=1.0))
        assert reader.cached("best", "attention", *moved) is None
        assert reader.cached("best", "attention", *UNTUNED) is None
        for index, spec in enumerate(TUNED[1:], start=1):  # the same answer, not read again
            assert reader.cached("best", "attention", *spec) is held[index]
        assert client.get("/best", params=query(moved)).json()["median_ms"] == faster
        assert client.get("/best", params=query(UNTUNED)).json()["measured"] is False


def test_coverage_reads_the_rule_score_once_a_version_of_the_bests(db_copy, monkeypatch):
    """/coverage's rule score (every tuned problem's trials read) is kept while the bests stay;
    a new best reads it again, and its rows always show the study's trials now."""
    from fastapi.testclient import TestClient

    from storage import TrialOutcome, open_repository
    from tuner.answers import covered
    from tuner.answers.reader import open_reader
    from tuner.answers.serve import create_app

    reads = []
    score = covered.rule_score_in
    monkeypatch.setattr(covered, "rule_score_in", lambda repo, fam: reads.append(fam.name) or score(repo, fam))
    with open_reader(db_copy) as reader:
        client = TestClient(create_app(reader))
        first = client.get("/coverage", params={"family": "attention"}).json()
        assert client.get("/coverage", params={"family": "attention"}).json()["rule"] == first["rule"]
        assert reads == ["attention"]
        best = client.get("/best", params=query(TUNED[0])).json()
        with open_repository(db_copy) as writer:
            study = next(s for s in writer.studies() if s.name == best["study"])
            slower = dict(best["params"], _unused=1)  # a trial that moves no best
            writer.record_trial(study.id, 1001, slower, TrialOutcome("ok", median_ms=best["median_ms"] * 5, tflops=1.0))
            counted = client.get("/coverage", params={"family": "attention"}).json()
            assert reads == ["attention"]
            assert [r["trials"] for r in counted["rows"]] != [r["trials"] for r in first["rows"]]
            writer.record_trial(study.id, 1002, best["params"], TrialOutcome("ok", median_ms=best["median_ms"] / 2, tflops=1.0))
            client.get("/coverage", params={"family": "attention"})
            assert reads == ["attention", "attention"]


def _revision(path: str) -> str:
    with sqlite3.connect(path) as connection:
        return connection.execute("SELECT version_num FROM tuner_alembic_version").fetchone()[0]


def test_the_reader_refuses_to_write(db_copy):
    from storage import StorageError
    from tuner.answers.reader import open_reader

    with open_reader(db_copy) as reader:
        with pytest.raises(StorageError, match="readonly|read-only|read only"):
            reader.repo.set_study_status(1, "interrupted")


@pytest.mark.parametrize("revision, says", [("0005", "older than this version"), ("ffff9999", "newer than")])
def test_serve_refuses_another_versions_schema_and_migrates_nothing(db_copy, tmp_path, capsys, revision, says):
    path = db_copy.removeprefix("sqlite:///")
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE tuner_alembic_version SET version_num = ?", (revision,))
    assert main(["serve", "--db", db_copy, "--port", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tuner: error: cannot open database") and says in err and len(err.splitlines()) == 1
    assert _revision(path) == revision


def test_serve_refuses_a_missing_file_and_creates_none(tmp_path, capsys):
    missing = tmp_path / "none.db"
    assert main(["serve", "--db", f"sqlite:///{missing}"]) == 2
    assert capsys.readouterr().err.strip() == (f"tuner: error: no database at {missing}: nothing is stored there "
                                              "(check --db or $TUNER_DB, or tune first)")
    assert not missing.exists()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_tuner_serve_listens_on_loopback_and_answers_as_the_app_does(served_db, client, tmp_path):
    """The command itself: uvicorn on 127.0.0.1 by default; SIGTERM ends it."""
    port = _free_port()
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    server = subprocess.Popen([sys.executable, "-m", "tuner", "serve", "--db", served_db, "--port", str(port)],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/best?family=attention&shape=2,8,1024,64&dtype=fp16&causal=true"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    served = json.loads(answer.read())
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()
                time.sleep(0.3)
        assert served == client.get("/best", params=query(TUNED[0])).json()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url.replace("fp16", "fp99"), timeout=5)
        assert refused.value.code == 400 and "fp99" in json.loads(refused.value.read())["detail"]
        with socket.socket() as listening:  # bound to loopback alone: not on another address of this host
            other = socket.gethostbyname(socket.gethostname())
            if not other.startswith("127."):
                assert listening.connect_ex((other, port)) != 0
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert f"on http://127.0.0.1:{port}/ (read-only" in err
    assert "Traceback" not in err


def test_serve_without_fastapi_says_what_to_install(tmp_path):
    """Where the [serve] extra is not installed: one line naming it."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nclass _No:\n    def find_spec(self, name, *a):\n"
                       "        if name in ('fastapi', 'uvicorn'):\n            raise ImportError(f'No module named {name!r}')\n"
                       "sys.meta_path.insert(0, _No())\n")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "tuner", "serve", "--db", "sqlite:///x.db"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("tuner: error: tuner serve needs FastAPI and uvicorn: "
                                  "pip install 'kernel-tuner-service[serve]'")
    assert len(done.stderr.strip().splitlines()) == 1


def test_serve_on_a_port_in_use_says_so_in_one_line(served_db, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--db", served_db, "--port", str(port)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"tuner: error: cannot listen on 127.0.0.1:{port}: Address already in use")


def test_the_api_page_needs_no_network(client):
    """/docs is Swagger UI with its script and style served here (no CDN), over our schema."""
    page = client.get("/docs")
    assert page.status_code == 200 and "/openapi.json" in page.text
    assets = [part.split('"')[0] for part in page.text.split('="')[1:] if part.startswith("/docs-assets/")]
    assert {a.rsplit("/", 1)[1] for a in assets} >= {"swagger-ui-bundle.js", "swagger-ui.css"}
    assert "cdn." not in page.text and "://" not in " ".join(assets)
    for asset in assets:
        served = client.get(asset)
        assert served.status_code == 200 and len(served.content) > 1000
    assert client.get("/openapi.json").json()["openapi"].startswith("3.")


def test_warming_answers_every_stored_best_and_the_rule_reads_its_inputs_once(db_copy, monkeypatch):
    """``Reader.warm`` (run as the server starts) answers each stored best once, so the first
    query of a tuned problem is kept already; shapes never tuned read the rule's inputs (every
    best of the family) once a version of the bests, not once a shape."""
    from tuner import api
    from tuner.answers.reader import open_reader

    reads = []
    inputs = api.rule_inputs
    monkeypatch.setattr(api, "rule_inputs", lambda repo, fam, device: reads.append(device) or inputs(repo, fam, device))
    with open_reader(db_copy) as reader:
        assert reader.cached("best", "attention", *TUNED[0]) is None
        assert reader.warm() == 2
        for spec in TUNED:
            assert reader.cached("best", "attention", *spec)["measured"] is True
        first = reader.best("attention", "3,8,1000,64", "fp16", {"causal": "true"})
        again = reader.best("attention", "5,8,1500,64", "fp16", {"causal": "true"})
        assert not first["measured"] and not again["measured"] and reads == [None]
