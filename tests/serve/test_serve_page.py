"""The page of `tuner serve` in headless Chromium (Debian's chromium and chromedriver, driven by
selenium with the driver's path given, so nothing is downloaded): a click on a study opens its
best-so-far curve and its trials, the tabs show the winners per GPU and the coverage, and a
screenshot is taken. Skips where chromium or chromedriver is not installed.

``TUNER_SCREENSHOT_DIR=docs/img`` keeps the screenshots there (docs/DEPLOY.md shows them)."""

from __future__ import annotations

import os
import shutil
import socket
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


@pytest.fixture(scope="module")
def server(served_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`tuner serve` on a free loopback port: its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen([sys.executable, "-m", "tuner", "serve", "--db", served_db, "--port", str(port)],
                               cwd=tmp_path_factory.mktemp("page"), env=env, stderr=subprocess.PIPE, text=True)
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
