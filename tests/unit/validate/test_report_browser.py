"""The report page in a real browser: Debian's Chromium, headless, driven by Playwright's Python
package with the system executable (nothing is downloaded). The page loads with no console
error and no request beyond its own file; the pool, status, check and fault-code filters and
the sorting work; a failed node's row leads to its fault and the operator action; pages of 100
nodes turn.

The report is the real-capture fleet of real_fleet.py beside it. It and the screenshots stay
in ``reports/test-browser/<run-id>/`` (``GPUREADY_TEST_REPORTS`` overrides the root) after the
test: ``screenshot-table.png`` and ``screenshot-node.png`` beside ``index.html``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, ConsoleMessage, Page, Request, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.conftest import REPO_ROOT
from tests.unit.validate import real_fleet
from validate import runinfo
from validate.actions import ACTIONS
from validate.model import CheckResult
from validate.report import write_report

CHROMIUM = Path("/usr/bin/chromium")  # Debian's package `chromium` (make setup installs it)
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
ARTIFACTS = Path(os.environ.get("GPUREADY_TEST_REPORTS", REPO_ROOT / "reports" / "test-browser"))


@dataclasses.dataclass
class Browser:
    context: BrowserContext
    errors: list[str]
    foreign: list[str]

    def open(self, index: Path) -> Page:
        page = self.context.new_page()
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("request", lambda r: self._request(r, index))
        page.goto(index.as_uri())
        try:
            page.wait_for_selector("#nodes tbody tr[data-node]", timeout=20_000)
        except PlaywrightTimeout:
            raise AssertionError(f"the page drew no node table: {self.errors}") from None
        _watch_draws(page)
        return page

    def _console(self, msg: ConsoleMessage) -> None:
        if msg.type in ("error", "warning"):
            self.errors.append(f"console {msg.type}: {msg.text}")

    def _request(self, req: Request, index: Path) -> None:
        if not req.url.startswith((index.as_uri(), "data:")):
            self.foreign.append(req.url)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs Debian's chromium")
    with tempfile.TemporaryDirectory(prefix="gpuready-chromium-") as profile, \
            sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            yield Browser(context, [], [])
        finally:
            context.close()


@pytest.fixture(scope="module")
def fleet(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[list[CheckResult], runinfo.RunInfo]:
    inventory = real_fleet.write_inventory(tmp_path_factory.mktemp("browser") / "inventory")
    nodes = real_fleet.fleet_nodes(inventory)
    rows = real_fleet.fleet_rows(fixtures_dir, nodes)
    info = runinfo.start(run_id=real_fleet.RUN_ID, environment=real_fleet.ENVIRONMENT,
                         inventory=inventory, limit=None, checks_requested=None,
                         checks=sorted({r.check for r in rows}), nodes=nodes)
    return rows, dataclasses.replace(info, finished=runinfo.now_utc())


def _report(rows: list[CheckResult], info: runinfo.RunInfo, run_id: str) -> Path:
    shutil.rmtree(ARTIFACTS / run_id, ignore_errors=True)
    report = write_report(rows, ARTIFACTS, run_id, update_latest=False,
                          run_info=dataclasses.replace(info, run_id=run_id))
    return report.run_dir / "index.html"


def _watch_draws(page: Page) -> None:
    """The page redraws on hashchange, a task after the hash itself changes. A listener added
    after the page's own runs after it: once it has seen a hash, the page has drawn that hash.
    Added once per document (a load draws the hash it was opened with)."""
    page.evaluate("() => { if (!window.__watching) { window.__watching = true; "
                  "window.__drawn = location.hash; window.addEventListener('hashchange', "
                  "() => { window.__drawn = location.hash; }); } }")


def _drawn(page: Page, condition: str) -> None:
    """Wait until the hash meets ``condition`` (a JavaScript expression) and the page has drawn
    that hash, not merely had it set."""
    page.wait_for_function(f"() => window.__drawn === location.hash && ({condition})")


def _shown(page: Page) -> list[str]:
    return page.locator("#nodes tbody tr[data-node]").evaluate_all(
        "rows => rows.map(r => r.dataset.node)")


def _say(request: pytest.FixtureRequest, text: str) -> None:
    # Shown even without -s: where the screenshots are is what a reader of `make test` needs.
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\n{text}")


def test_filters_sorting_and_a_failed_node_leads_to_its_action(
        browser: Browser, fleet: tuple[list[CheckResult], runinfo.RunInfo],
        request: pytest.FixtureRequest) -> None:
    rows, info = fleet
    index = _report(rows, info, real_fleet.RUN_ID)
    started = time.monotonic()
    page = browser.open(index)
    # header: environment label, exit code and meaning, counts
    assert real_fleet.ENVIRONMENT in page.inner_text("#environment")
    assert "unreachable hosts" in page.inner_text("#exit")
    assert "fail 3" in page.inner_text("#counts")
    assert len(_shown(page)) == 10
    assert _shown(page)[:2] == ["gpu-a100-04", "gpu-h100-06"]  # worst first (error)

    page.select_option("#f-pool", "pool_a100_sxm")
    _drawn(page, "location.hash.includes('pool=pool_a100_sxm')")
    assert sorted(_shown(page)) == ["gpu-a100-01", "gpu-a100-02", "gpu-a100-03", "gpu-a100-04"]
    page.select_option("#f-status", "fail")
    _drawn(page, "location.hash.includes('status=fail')")
    assert _shown(page) == ["gpu-a100-03"]
    page.click("#f-clear")
    _drawn(page, "location.hash === '' || location.hash === '#'")
    assert len(_shown(page)) == 10

    # a check chosen: status is that check's status on each node
    page.select_option("#f-check", "gpu.topology")
    page.select_option("#f-status", "warn")
    _drawn(page, "location.hash.includes('status=warn')")
    assert sorted(_shown(page)) == [f"gpu-h100-0{i}" for i in range(1, 6)]
    page.select_option("#f-check", "gpu.ecc")
    page.select_option("#f-status", "fail")
    _drawn(page, "location.hash.includes('check=gpu.ecc') && "
                           "location.hash.includes('status=fail')")
    assert _shown(page) == ["gpu-h100-05"]
    page.click("#f-clear")
    page.select_option("#f-code", "gpu.throttle.hw_slowdown")
    _drawn(page, "location.hash.includes('code=')")
    assert _shown(page) == ["gpu-h100-04"]
    page.click("#f-clear")
    page.fill("#f-q", "a100-0")
    _drawn(page, "location.hash.includes('q=a100-0')")
    assert len(_shown(page)) == 4
    page.click("#f-clear")

    # sorting by a column, both ways
    page.click("#nodes th[data-key='node'] button")
    _drawn(page, "location.hash.includes('sort=node')")
    names = _shown(page)
    assert names == sorted(names)
    page.click("#nodes th[data-key='node'] button")
    _drawn(page, "location.hash.includes('dir=desc')")
    assert _shown(page) == sorted(names, reverse=True)
    assert page.get_attribute("#nodes th[data-key='node']", "aria-sort") == "descending"
    page.click("#nodes th[data-key='nccl_busbw_gbps'] button")
    _drawn(page, "location.hash.includes('sort=nccl_busbw_gbps')")
    assert set(_shown(page)[:3]) == {"gpu-a100-01", "gpu-a100-02", "gpu-a100-03"}

    # the failed nodes, then one of them: its fault row and the action for its code
    page.goto(index.as_uri() + "#status=fail")
    page.wait_for_function("document.querySelectorAll('#nodes tbody tr[data-node]').length == 3")
    _watch_draws(page)
    assert sorted(_shown(page)) == ["gpu-a100-03", "gpu-h100-04", "gpu-h100-05"]
    page.screenshot(path=str(index.parent / "screenshot-table.png"), full_page=True)
    page.click("#nodes tbody tr[data-node='gpu-h100-05'] a")
    page.wait_for_selector("#node-rows")
    assert page.is_visible("#node-view") and not page.is_visible("#table-view")
    fault = page.locator("#node-rows tr", has_text="gpu.ecc.remap_pending")
    assert fault.count() == 1
    cells = fault.locator("td").all_inner_texts()
    assert cells[:3] == ["gpu.ecc", "remapped_rows_pending", "1"]
    assert cells[5:8] == ["0", "fail", "gpu.ecc.remap_pending"]  # fail threshold, status, code
    actions = page.inner_text("#node-actions")
    assert ACTIONS["gpu.ecc.remap_pending"].action in actions
    assert page.locator("#node-actions a", has_text="Memory Error Management").get_attribute(
        "href") == ACTIONS["gpu.ecc.remap_pending"].source.url
    assert "RESET_GPU" in actions  # Xid 63's action from the Xid catalog, also on this node
    page.screenshot(path=str(index.parent / "screenshot-node.png"), full_page=True)
    page.click("#back")
    page.wait_for_selector("#table-view", state="visible")
    assert len(_shown(page)) == 3  # back to the filtered table

    # the fault-code table links filter the node table
    page.click("#fault-codes a[href='#code=gpu.nvlink.down']")
    _drawn(page, "location.hash === '#code=gpu.nvlink.down'")
    assert _shown(page) == ["gpu-a100-03"]
    took = time.monotonic() - started
    assert browser.errors == [] and browser.foreign == []
    _say(request, f"browser test: {took:.1f} s; report and screenshots in {index.parent}")


def test_pages_of_a_larger_fleet(browser: Browser,
                                 fleet: tuple[list[CheckResult], runinfo.RunInfo]) -> None:
    """30 copies of the fleet (300 nodes, the same real-capture rows under new names)."""
    rows, info = fleet
    many = [dataclasses.replace(r, node=f"{r.node}-{k:02d}") for k in range(30) for r in rows]
    index = _report(many, info, "pages")
    page = browser.open(index)
    assert len(_shown(page)) == 100
    assert page.inner_text("#shown") == "Showing 1-100 of 300 nodes"
    first = _shown(page)
    page.click("#next")
    _drawn(page, "location.hash.includes('p=1')")
    assert page.inner_text("#shown") == "Showing 101-200 of 300 nodes"
    assert not set(_shown(page)) & set(first)
    page.select_option("#f-status", "error")
    _drawn(page, "location.hash.includes('status=error')")
    assert page.inner_text("#shown") == "Showing 1-60 of 60 nodes (filtered from 300)"
    assert page.is_disabled("#next") and page.is_disabled("#prev")
    assert browser.errors == [] and browser.foreign == []
