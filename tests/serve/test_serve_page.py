"""The page of `tuner serve` in headless Chromium (Debian's chromium and chromedriver, driven by
selenium with the driver's path given, so nothing is downloaded): a click on a study opens its
best-so-far curve and its trials, the tabs show the winners per GPU and the coverage, a job
submitted through the form is listed with its problems and cancelled with its button, and
screenshots are taken. Skips where chromium or chromedriver is not installed.

``TUNER_SCREENSHOT_DIR=docs/img`` keeps the screenshots there (docs/DEPLOY.md shows them)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from serve_data import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                                reason="headless Chromium needs Debian's chromium and chromium-driver")


def _serve(db: str, cwd: Path) -> Iterator[str]:
    """`tuner serve` over ``db`` on a free loopback port (queueing jobs, running none): its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen([sys.executable, "-m", "tuner", "serve", "--db", db, "--port", str(port)],
                               cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(base + "/families", timeout=5).close()
            break
        except (urllib.error.URLError, ConnectionError):
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
            time.sleep(0.3)
    yield base
    process.terminate()
    process.communicate(timeout=30)


@pytest.fixture(scope="module")
def server(served_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _serve(served_db, tmp_path_factory.mktemp("page"))


@pytest.fixture(scope="module")
def job_server(served_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`tuner serve` over a copy of ``served_db`` holding a write token: (base URL, token)."""
    from tuner.jobs.tokens import create_token

    where = tmp_path_factory.mktemp("jobs")
    copy = where / "jobs.db"
    with sqlite3.connect(served_db.removeprefix("sqlite:///")) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    url = f"sqlite:///{copy}"
    token = create_token(url, "write")
    for base in _serve(url, where):
        yield base, token


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1360,900", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait(driver: object, what: str, timeout: float = 30) -> list:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: d.find_elements(By.CSS_SELECTOR, what) or False)


def _wait_text(driver: object, what: str, text: str, timeout: float = 30) -> str:
    """The text of the element ``what`` once it holds ``text`` (found anew each time: the page
    redraws its panels when they are loaded again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def holds(d: object) -> str | bool:
        found = [e.text for e in d.find_elements(By.CSS_SELECTOR, what)]
        return next((t for t in found if text in t), False)

    return WebDriverWait(driver, timeout, ignored_exceptions=[StaleElementReferenceException]).until(holds)


def _shot(driver: object, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    assert driver.save_screenshot(str(path))
    keep = os.environ.get("TUNER_SCREENSHOT_DIR")
    if keep:
        shutil.copy(path, Path(keep) / name)
    return path


def test_a_click_on_a_study_opens_its_curve_and_trials(server, browser, client, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    rows = _wait(browser, "#study-list tbody tr.pick")
    studies = client.get("/studies").json()
    assert len(rows) == len(studies) == 2
    assert browser.find_element(By.ID, "study-detail").get_attribute("hidden") is not None  # nothing open yet
    target = studies[0]
    row = browser.find_element(By.CSS_SELECTOR, f'#study-list tbody tr[data-id="{target["id"]}"]')
    assert "2x8x1024x64-fp16-causal" in row.text and "12 / 12" in row.text
    row.click()
    _wait(browser, "#curve-svg #best-line")
    trials = _wait(browser, "#trials tbody tr")
    shown = client.get(f"/studies/{target['id']}").json()["trials"]
    assert len(trials) == len(shown) == 12
    assert [int(t.get_attribute("data-number")) for t in trials] == [t["number"] for t in shown]
    assert "2x8x1024x64-fp16-causal on NVIDIA H200" in browser.find_element(By.ID, "detail-title").text
    dots = browser.find_elements(By.CSS_SELECTOR, "#curve-svg circle")
    assert len(dots) == sum(t["status"] == "ok" for t in shown)
    best = min(t["median_ms"] for t in shown if t["status"] == "ok")
    assert f"best {best:.4f} ms" in browser.find_element(By.ID, "curve-note").text
    assert "chosen" in browser.find_element(
        By.CSS_SELECTOR, f'#study-list tbody tr[data-id="{target["id"]}"]').get_attribute("class")
    picture = _shot(browser, tmp_path, "serve-studies.png")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 20_000


def test_the_tabs_show_winners_per_gpu_and_coverage(server, browser, client, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    _wait(browser, "#study-list tbody tr.pick")
    browser.find_element(By.ID, "tab-winners").click()
    coverage = client.get("/coverage", params={"family": "attention"}).json()
    panel = _wait_text(browser, "#winner-panels .winners", "NVIDIA H200")
    assert panel.splitlines()[0] == "NVIDIA H200" and len(_wait(browser, "#winner-panels .winners")) == 1
    for row in coverage["rows"]:
        assert row["problem"] in panel and f"{row['median_ms']:.4f} re-timed" in panel
    assert len(browser.find_elements(By.CSS_SELECTOR, "#winner-panels .winners tbody tr")) == len(coverage["rows"]) == 2
    assert browser.find_element(By.ID, "studies").is_displayed() is False
    _shot(browser, tmp_path, "serve-winners.png")
    browser.find_element(By.ID, "tab-coverage").click()
    shown = _wait_text(browser, '#coverage-panels .coverage[data-family="attention"]', "stored best(s)")
    assert "2 stored best(s): 2 on NVIDIA H200" in shown
    assert f"leave-one-out over {len(coverage['rule']['held'])} problem(s)" in shown


def _jobs(base: str) -> list:
    with urllib.request.urlopen(base + "/jobs", timeout=10) as answer:
        return json.loads(answer.read())


def test_a_job_submitted_on_the_page_is_listed_and_cancelled(job_server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tuner.jobs.routes import NEEDS_WRITE

    base, token = job_server
    browser.get(base + "/")
    browser.find_element(By.ID, "tab-jobs").click()
    _wait_text(browser, "#job-list tbody", "no jobs queued")
    _wait(browser, "#job-family option")
    Select(browser.find_element(By.ID, "job-family")).select_by_value("attention")
    for field, text in (("job-trials", "6"), ("job-priority", "2"),
                        ("job-problems", "2,8,1024,64 fp16 causal\n4,8,512,64 bf16")):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(text)

    browser.find_element(By.ID, "job-submit").click()  # no token yet: the server's one line
    assert _wait_text(browser, "#job-error", "write scope") == NEEDS_WRITE
    assert _jobs(base) == []

    browser.find_element(By.ID, "job-token").send_keys(token)
    assert browser.execute_script("return sessionStorage.getItem('tuner-token')") == token
    browser.find_element(By.ID, "job-submit").click()
    [job] = _wait_until(lambda: _jobs(base))
    row = _wait_text(browser, f'#job-list tbody tr[data-id="{job["id"]}"]', "queued")
    assert "2x8x1024x64-fp16-causal 0 / 6" in row and "4x8x512x64-bf16 0 / 6" in row and "0 / 12" in row
    assert [(p["shape"], p["dtype"], p["flags"]) for p in job["problems"]] == [
        ([2, 8, 1024, 64], "fp16", {"causal": True}), ([4, 8, 512, 64], "bf16", {"causal": False})]
    assert job["priority"] == 2 and job["trials"] == 6
    assert browser.find_element(By.ID, "job-error").text == ""
    _shot(browser, tmp_path, "serve-jobs.png")

    browser.find_element(By.CSS_SELECTOR, f'#job-list button.cancel[data-id="{job["id"]}"]').click()
    _wait_text(browser, f'#job-list tbody tr[data-id="{job["id"]}"]', "cancelled")
    assert [j["state"] for j in _jobs(base)] == ["cancelled"]
    assert not browser.find_elements(By.CSS_SELECTOR, "#job-list button.cancel")


def _wait_until(what, timeout: float = 15):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (found := what()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return found
