"""The dashboard page in a real headless Chromium against a real running job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from adminkit import Job

from monarch.admin import AdminServer
from monarch.admin._stacks import pyspy_path

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
"""Screenshots kept after the run (.gitignore'd)."""
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="chromium and chromium-driver are not installed (tools/system-packages.sh)",
    ),
]


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1600,1000")
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def rows(browser: WebDriver, state: str | None = None) -> list[str]:
    """The actor rows' text, read in one script: the page redraws its tables as it polls."""
    texts = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(row => row.innerText)",
        "tr.actor" + (f"[data-state='{state}']" if state else ""),
    )
    return [" ".join(text.split()) for text in texts]


def cells_of(browser: WebDriver, starting: str) -> list[list[str]]:
    """The cells of the actor rows whose first cell is ``starting`` (in one script)."""
    return list(
        browser.execute_script(
            "return [...document.querySelectorAll('tr.actor')]"
            ".filter(row => row.cells[0].innerText === arguments[0])"
            ".map(row => [...row.cells].map(cell => cell.innerText))",
            starting,
        )
    )


def text_of(browser: WebDriver, element_id: str) -> str:
    script = "return document.getElementById(arguments[0]).innerText"
    return str(browser.execute_script(script, element_id))


def click_proc(browser: WebDriver, starting: str) -> bool:
    """Click the first proc row whose text starts with ``starting`` (in one script)."""
    return bool(
        browser.execute_script(
            "const row = [...document.querySelectorAll('tr.proc')]"
            ".find(row => row.innerText.startsWith(arguments[0]));"
            "if (row) row.click(); return !!row;",
            starting,
        )
    )


def test_the_page_shows_the_actors_and_their_failure(job: Job, browser: WebDriver) -> None:
    browser.get(f"{job.url}/?token={job.token}&interval=300")
    wait = WebDriverWait(browser, 30, poll_frequency=0.1)
    wait.until(lambda _: len(rows(browser)) == 3)
    assert browser.title == "Monarch job"
    assert len(rows(browser, "running")) == 3
    assert any(text.startswith("workers {'gpus': 1/2}") for text in rows(browser))
    summary = text_of(browser, "summary")
    assert summary.startswith("1 hosts, 4 procs, 3 actors, 0 failed")
    assert text_of(browser, "failures") == "none"

    # Per actor: messages per second, handled and queued.
    job.command("ping-one 50")

    def counted() -> bool:
        [cells] = cells_of(browser, "workers {'gpus': 1/2}")
        _, _, rate, handled, queued, *_ = cells
        return float(rate) > 0 and handled == "51" and queued == "0"

    wait.until(lambda _: counted())

    job.command("fail")
    wait.until(lambda _: len(rows(browser, "failed")) == 1)
    [failed] = rows(browser, "failed")
    assert failed.startswith("workers {'gpus': 1/2} failed") and "disk on fire" in failed
    wait.until(lambda _: "disk on fire" in text_of(browser, "failures"))
    assert "1 failed" in text_of(browser, "summary")

    job.command("hang")
    wait.until(lambda _: any("hang for" in text for text in rows(browser)))
    assert click_proc(browser, "workers[0]")
    wait.until(lambda _: "Thread actor-workers" in text_of(browser, "stacks-text"))
    assert "hang" in text_of(browser, "stacks-text")

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000


def test_the_page_without_the_token_shows_the_refusal(job: Job, browser: WebDriver) -> None:
    status, _ = job.get("/", token="")
    assert status == 401
    browser.get(f"{job.url}/?token={job.token}&interval=300")
    WebDriverWait(browser, 30).until(lambda _: len(rows(browser)) == 3)
    # The page keeps its token; a server that goes away is said so, and the page stays.
    job.close()
    WebDriverWait(browser, 30, poll_frequency=0.1).until(
        lambda _: "admin server:" in text_of(browser, "status")
    )
    assert len(rows(browser)) == 3


def test_the_sql_box_shows_the_telemetry_rows(browser: WebDriver) -> None:
    """With telemetry tables (a query function), the page offers SQL and shows the rows."""
    asked: list[str] = []

    def query(sql: str) -> dict[str, Any]:
        asked.append(sql)
        return {"rows": [{"actor": "trainers[0]", "messages": 3}]}

    with AdminServer("127.0.0.1:0", query=query) as server:
        browser.get(f"{server.url}/?token={server.token}&interval=300")
        wait = WebDriverWait(browser, 30, poll_frequency=0.1)
        shown = "return !document.getElementById('sql').hidden"
        wait.until(lambda _: browser.execute_script(shown))
        browser.execute_script(
            "document.getElementById('sql-text').value = arguments[0];"
            "document.getElementById('sql-run').click();",
            "SELECT actor, count(*) AS messages FROM messages GROUP BY 1",
        )
        wait.until(lambda _: "trainers[0]" in text_of(browser, "sql-result"))
        assert asked == ["SELECT actor, count(*) AS messages FROM messages GROUP BY 1"]


def test_a_profiles_flame_graph_opens_in_chromium(
    browser: WebDriver, job: Job, tmp_path: Path
) -> None:
    """``monarch profile`` of a job with a stuck actor (no telemetry tables): its flame graph
    draws in Chromium, the stuck endpoint (``Worker.hang``) among the frames, every frame a
    box of some width."""
    if pyspy_path() is None:
        pytest.skip("py-spy is not installed (pyspy_bin, PYSPY_BIN, PATH)")
    job.command("hang")
    prefix = tmp_path / "prof"
    where = ["--addr", job.addr, "--token", job.token, "-o", str(prefix)]
    done = subprocess.run(
        [sys.executable, "-m", "monarch.core", "profile", "--seconds", "1", "--idle", *where],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    browser.get(f"file://{prefix}.svg")
    frames = browser.execute_script(
        "return [...document.querySelectorAll('g.frame')].map(g => "
        "[g.querySelector('title').textContent, g.querySelector('rect').getBBox().width])"
    )
    assert frames and all(width > 0 for _, width in frames)
    assert any("hang (" in title for title, _ in frames), [t for t, _ in frames]
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "flamegraph.png"))
    # The dashboard links that profile's trace, for ui.perfetto.dev.
    browser.get(f"{job.url}/?token={job.token}&interval=300")
    link = WebDriverWait(browser, 60, poll_frequency=0.2).until(
        lambda b: b.execute_script(
            "return document.getElementById('profile').hidden ? null"
            " : document.getElementById('profile-link').href"
        )
    )
    with urllib.request.urlopen(link, timeout=30) as response:
        trace = json.load(response)
    written = json.loads(Path(f"{prefix}.json").read_text())
    assert trace["traceEvents"] and len(trace["traceEvents"]) == len(written["traceEvents"])


def test_the_plots_draw_the_jobs_last_minutes(browser: WebDriver, job: Job) -> None:
    """Time series of the job while the page is open: messages per second and queue depth,
    a CPU and an RSS line per proc, each an SVG line whose points are the snapshots seen."""
    browser.get(f"{job.url}/?token={job.token}&interval=300")
    wait = WebDriverWait(browser, 60, poll_frequency=0.2)
    job.command("ping 50")

    def lines() -> dict[str, dict[str, int]]:
        found: dict[str, dict[str, int]] = browser.execute_script(
            "const out = {};"
            "for (const div of document.querySelectorAll('#plots .plot')) {"
            "  out[div.id] = {};"
            "  for (const l of div.querySelectorAll('polyline'))"
            "    out[div.id][l.dataset.name] = Number(l.dataset.count); }"
            "return out;"
        )
        return found

    wait.until(lambda _: min(lines().get("plot-rss", {"": 0}).values()) >= 5)
    job.command("ping 50")
    plots = lines()
    assert {"plot-messages", "plot-queue", "plot-cpu", "plot-rss"} <= set(plots)
    assert "plot-latency" not in plots  # no telemetry tables in this job
    procs = {"client[0]", "workers[0]", "workers[1]", "loopers[0]"}
    assert procs <= set(plots["plot-cpu"]) and procs <= set(plots["plot-rss"])
    assert plots["plot-messages"]["all actors"] >= 5
    top = browser.execute_script(
        "const l = document.querySelector('#plot-messages polyline');"
        "return Math.min(...l.getAttribute('points').split(' ').map(p => Number(p.split(',')[1])));"
    )
    assert top < 98  # some snapshot saw messages per second above zero
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "dashboard-plots.png"))
