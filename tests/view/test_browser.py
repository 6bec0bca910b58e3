"""The viewer in a real headless browser: Debian's Chromium driven by Playwright's Python client.

The app runs under uvicorn on a free loopback port, over a real replay run's
store; the tests click run -> task -> branches as a user does and check what
the page shows against the store: the side-by-side branches, the verdict
details, the diff of two final workspaces. Every test fails on a console
error, an uncaught page error or a request that leaves loopback (or, for the
static bundle, leaves its folder), and saves a screenshot under its temp dir.
Playwright's own browser download is never used: the tests skip, saying so,
where no ``chromium`` is installed (``make setup`` installs it).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest

from factory.errors import StoreLockedError
from factory.store import Store
from factory.view import ViewData, create_app, final_workspace, write_bundle

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH: install Debian's chromium package (make setup does) to run the browser tests",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the 'dev' extra) is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="uvicorn (the 'view' extra) is not installed")

#: Milliseconds a page element may take to appear (a loaded 2-core CI machine).
WAIT_MS = 15_000


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def store(view_db: Path) -> Iterator[Store]:
    with Store.open(view_db, read_only=True) as opened:
        yield opened


@contextlib.contextmanager
def serving(data: ViewData) -> Iterator[str]:
    """The app over ``data`` under uvicorn in a thread, on a free loopback port; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(create_app(data), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not served.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        served.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(view_db: Path) -> Iterator[str]:
    """The app as `factory view` serves it: by path (opened read-only per burst of requests)."""
    with serving(ViewData(path=view_db)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


class Watched:
    """A page whose console errors, page errors and requests are recorded."""

    def __init__(self, browser, allowed: tuple[str, ...]):
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.problems: list[str] = []
        self.requests: list[str] = []
        self.allowed = allowed
        self.page.on("console", lambda m: self.problems.append(f"console {m.type}: {m.text}")
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"request failed: {r.url}"))
        self.page.on("request", lambda r: self.requests.append(r.url))

    def check(self) -> None:
        assert self.problems == []
        outside = [url for url in self.requests if not url.startswith(self.allowed) and not url.startswith("data:")]
        assert outside == [], "requests left loopback"
        self.page.close()


@pytest.fixture
def watched(browser, server: str) -> Iterator[Watched]:
    host = urlparse(server).netloc
    page = Watched(browser, (f"http://{host}/",))
    yield page
    page.check()


def test_run_task_branches_side_by_side_as_stored(watched: Watched, server: str, store: Store, tmp_path: Path):
    page = watched.page
    page.goto(server)
    page.wait_for_selector("#runs", timeout=WAIT_MS)
    page.click("#runs a:text-is('r1')")
    page.wait_for_selector("#grid", timeout=WAIT_MS)
    assert page.url.endswith("#/run/r1")
    summary = page.inner_text("#run-summary")
    assert "5/12" in summary and "hacks detected\n1" in summary
    # the grid: one row per task, one cell per branch, the detected hack marked
    hack_cell = page.locator("#grid tr:has(a:text-is('fix-factorial')) a.cell[data-branch='2']")
    assert "hack" in hack_cell.get_attribute("class") and hack_cell.inner_text() == "!"
    page.screenshot(path=tmp_path / "run.png", full_page=True)

    page.click("#grid a:text-is('fix-factorial')")
    page.wait_for_selector("#side-by-side .branch", timeout=WAIT_MS)
    assert page.url.endswith("#/run/r1/task/fix-factorial")
    columns = page.locator("#side-by-side .branch")
    assert columns.count() == 4
    rows = {r["branch_index"]: r for r in store.branches("r1", "fix-factorial").iter_rows(named=True)}
    ranks = {r["branch_index"]: r for r in store.rankings("r1").filter(task_id="fix-factorial").iter_rows(named=True)}
    for index, row in rows.items():
        column = page.locator(f"#branch-{index}")
        assert column.locator("pre.final-answer").inner_text() == row["final_answer"]
        assert f"rank {ranks[index]['rank']} " in column.locator(".rankline").inner_text()
    # verdict details: the failing test with its message, the isolation mode, the monitor's evidence
    failing = page.locator("#branch-1 .verdict[data-verifier='tests']")
    text = failing.inner_text()
    assert "failed: test_solution.py::test_zero" in text and "assert factorial(0) == 1" in text
    assert "isolation: isolated / process" in text
    hacked = page.locator("#branch-2").inner_text()
    assert "hack detected" in hacked and "conftest_added" in hacked and "monitor evidence" in hacked
    # the trajectory turn by turn: the tool call with its arguments, its summarised result
    first = page.locator("#branch-0 .trajectory").inner_text()
    assert "→ write_file" in first and "return 1" in first and "wrote 82 bytes to solution.py" in first
    page.screenshot(path=tmp_path / "side-by-side.png")

    # the diff of two final workspaces, against the store's
    page.select_option("#diff-a", "0")
    page.select_option("#diff-b", "2")
    page.click("#diff-go")
    page.wait_for_selector("#diff .dfile[data-path='conftest.py']", timeout=WAIT_MS)
    spec = store.tasks("r1").filter(task_id="fix-factorial")["spec"].item()
    left, right = final_workspace(rows[0]["workspace"], spec), final_workspace(rows[2]["workspace"], spec)
    shown = [el.get_attribute("data-path") for el in page.locator("#diff .dfile").all()]
    assert shown == sorted(p for p in set(left) | set(right) if left.get(p) != right.get(p))
    solution = page.locator("#diff .dfile[data-path='solution.py'] pre.diff").inner_text()
    assert "-        return 1" in solution and "+        return n" in solution
    assert "+    items.clear()" in page.locator("#diff .dfile[data-path='conftest.py']").inner_text()
    page.locator("#diff").screenshot(path=tmp_path / "diff.png")


def test_deep_link_keyboard_and_search(watched: Watched, server: str, tmp_path: Path):
    page = watched.page
    page.goto(server + "#/run/r1/task/fix-factorial/branch/2")
    page.wait_for_selector("#side-by-side .branch.focus", timeout=WAIT_MS)
    assert page.locator(".branch.focus").get_attribute("data-branch") == "2"
    page.keyboard.press("u")  # up to the task
    page.wait_for_function("location.hash === '#/run/r1/task/fix-factorial'", timeout=WAIT_MS)
    page.keyboard.press("u")  # up to the run
    page.wait_for_selector("#grid", timeout=WAIT_MS)
    assert page.url.endswith("#/run/r1")
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("Enter")  # the second task
    page.wait_for_selector("#side-by-side .branch", timeout=WAIT_MS)
    assert page.url.endswith("#/run/r1/task/fix-factorial")
    page.keyboard.press("u")
    page.wait_for_selector("#grid", timeout=WAIT_MS)
    page.keyboard.press("/")
    page.keyboard.type("short test summary")
    page.keyboard.press("Enter")
    page.wait_for_selector("#hits li", timeout=WAIT_MS)
    assert page.url.endswith("#/run/r1/search/short%20test%20summary")
    hit = page.locator("#hits li").first
    assert "fix-factorial #1" in hit.inner_text() and "tool output" in hit.inner_text()
    page.screenshot(path=tmp_path / "search.png")
    hit.locator("a").click()
    page.wait_for_selector("#side-by-side .branch.focus", timeout=WAIT_MS)
    assert page.locator(".branch.focus").get_attribute("data-branch") == "1"


def test_static_bundle_opens_from_file_url(browser, store: Store, tmp_path: Path):
    site = tmp_path / "site"
    write_bundle(ViewData(store), site)
    page = Watched(browser, (site.as_uri() + "/",))
    page.page.goto((site / "index.html").as_uri() + "#/run/r1")
    page.page.wait_for_selector("#grid", timeout=WAIT_MS)
    page.page.click("#grid a:text-is('fix-factorial')")
    page.page.wait_for_selector("#diff .dfile", timeout=WAIT_MS)
    assert page.page.locator("#side-by-side .branch").count() == 4
    assert "failed: test_solution.py::test_zero" in page.page.locator("#branch-1").inner_text()
    assert page.page.inner_text("#mode") == "static bundle"
    page.page.goto((site / "index.html").as_uri() + "#/run/r1/search/final%3A%2042")
    page.page.wait_for_selector("#hits li", timeout=WAIT_MS)
    assert page.page.locator("#hits li").count() == 2
    page.page.screenshot(path=tmp_path / "bundle.png")
    page.check()


def test_a_running_run_shows_branches_as_they_land(browser, view_db: Path, tmp_path: Path):
    db = tmp_path / "running.duckdb"
    db.write_bytes(view_db.read_bytes())
    with Store.open(db) as writable:
        writable.update_run("r1", status="running")
    with serving(ViewData(path=db, hold_s=0.2)) as url:
        page = Watched(browser, (url,))
        page.page.goto(url + "#/run/r1")
        page.page.wait_for_selector("#grid", timeout=WAIT_MS)
        assert "live" in page.page.inner_text("h1")
        # a branch of a new task lands, written between two of the page's refreshes (same process: retry while
        # the viewer's read-only connection is open)
        deadline = time.monotonic() + 20
        while True:
            try:
                with Store.open(db) as writable:
                    writable.write_tasks([{"run_id": "r1", "task_id": "zz-late", "task_hash": "h", "prompt": "late",
                                           "verifiers": [], "spec": {"id": "zz-late", "prompt": "late"}}])
                    writable.write_branches([{"run_id": "r1", "task_id": "zz-late", "branch_index": 0,
                                              "session_id": "late-b0", "status": "ok", "final_answer": "landed"}])
                break
            except StoreLockedError:
                assert time.monotonic() < deadline, "the viewer never let go of the store"
                time.sleep(0.05)
        page.page.wait_for_selector("#grid a:text-is('zz-late')", timeout=WAIT_MS)
        assert "13" in page.page.locator(".stat:has(.label:text-is('branches')) .value").inner_text()
        page.page.screenshot(path=tmp_path / "live.png")
        page.check()


def drawn(image) -> int:
    """The width an image was drawn at, once it loaded (the page's CSP lets no polling script in: polled here)."""
    image.wait_for(timeout=WAIT_MS)
    deadline = time.monotonic() + WAIT_MS / 1000
    while not (width := image.evaluate("img => img.complete ? img.naturalWidth : 0")):
        assert time.monotonic() < deadline, "the plot never loaded"
        time.sleep(0.05)
    return width


def test_outputs_power_view_plots_and_export_manifest(browser, outputs_db: Path, tmp_path: Path):
    """The run's Outputs as recorded by rank --plot, power and export: the power view, the plots, the manifest."""
    with Store.open(outputs_db, read_only=True) as opened:
        rows = {row["kind"]: row for row in opened.artifacts("r1").iter_rows(named=True)}
    printed = json.loads((outputs_db.parent / "power.json").read_text())
    with serving(ViewData(path=outputs_db)) as url:
        watched = Watched(browser, (url,))
        page = watched.page
        page.goto(url + "#/run/r1")
        page.wait_for_selector("#outputs", timeout=WAIT_MS)
        listed = {el.get_attribute("data-kind"): el for el in page.locator("#outputs tbody tr").all()}
        assert sorted(listed) == ["export", "power", "rank_plot"]
        assert [el.locator("[data-status]").get_attribute("data-status") for el in listed.values()] == ["matches"] * 3
        listed["power"].locator("a").click()
        page.wait_for_selector("#power-verdict", timeout=WAIT_MS)
        assert page.url.endswith(f"#/run/r1/output/{rows['power']['artifact_id']}")
        assert page.inner_text("#power-verdict") == printed["verdict"]
        shown = page.inner_text("#power")
        assert f"{printed['delta_pp']:.1f} pp" in shown and f"{printed['tasks_needed']} paired tasks" in shown
        assert drawn(page.locator("img.plot"))
        page.screenshot(path=tmp_path / "power.png", full_page=True)

        page.goto(url + f"#/run/r1/output/{rows['export']['artifact_id']}")
        page.wait_for_selector("#export-manifest", timeout=WAIT_MS)
        manifest = json.loads(rows["export"]["meta"])["manifest"]
        assert manifest["file_sha256"] in page.inner_text("#export-manifest")
        files = {el.get_attribute("data-role"): el.locator("[data-status]").get_attribute("data-status")
                 for el in page.locator("#output-files tbody tr").all()}
        assert files == {"file": "matches", "manifest": "matches", "dataset card": "matches"}
        page.screenshot(path=tmp_path / "export.png", full_page=True)

        page.goto(url + "#/run/r1/rankings")
        assert drawn(page.locator("#rank-plots img.plot"))
        watched.check()
