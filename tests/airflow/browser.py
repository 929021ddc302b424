"""The tridentflow view in a real browser: Debian's Chromium driven by Playwright for Python.

Playwright cannot download its own browsers here, so it is pointed at the system Chromium
(``scripts/test.sh`` installs the Debian package when it is missing). Screenshots go to
``BROWSER_ARTIFACTS`` (test-artifacts/ at the project root).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BROWSER_ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_NAMES = ("chromium", "chromium-browser")


def chromium() -> str:
    """The system Chromium's path; a clear error if there is none."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(
        "no chromium on PATH: scripts/test.sh installs it (apt-get install chromium)"
    )


@contextmanager
def logged_in(base: str, password: str) -> Iterator[Any]:
    """A page of a fresh headless Chromium, signed in through Airflow's login form."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.set_default_timeout(60_000)
            page.goto(f"{base}/auth/login")
            page.locator("input:not([type=password])").first.fill("admin")
            page.locator("input[type=password]").fill(password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda url: "/auth/login" not in url)
            yield page
        finally:
            browser.close()


def frame_text(page: Any, selector: str) -> str:
    """The text of ``selector`` inside the plugin's frame, once it shows."""
    locator = page.frame_locator("iframe").locator(selector)
    locator.wait_for(state="visible")
    return locator.inner_text().strip()


def choose_pipeline(page: Any, name: str) -> None:
    """Pick ``name`` in the pipeline page's chooser and wait until the page shows it (the
    previous pipeline's tables stay on screen until its render lands: reading them races)."""
    page.frame_locator("iframe").locator("#pipeline").select_option(name)
    page.frame_locator("iframe").locator(f"#body[data-pipeline='{name}']").wait_for()


def screenshot(page: Any, name: str) -> Path:
    BROWSER_ARTIFACTS.mkdir(exist_ok=True)
    path = BROWSER_ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


RUN_TAB_FIELDS = """() => {
  const frame = document.querySelector("iframe");
  const doc = frame && frame.contentDocument;
  const fields = doc ? [...doc.querySelectorAll("dd[data-field]")] : [];
  return fields.length ? Object.fromEntries(fields.map(d => [d.dataset.field, d.innerText.trim()]))
                       : null;
}"""


def run_tab(
    page: Any, base: str, dag: str, run_id: str, encoded: bool | None = True
) -> dict[str, str]:
    """Open a DAG run's tridentflow tab; its fields (txid, status, records, keys...). Read
    through the frame's document (same origin): Playwright does not track the frame Airflow
    gives a DAG-run view (its frame_locator never sees the content). ``encoded``: whether
    Airflow puts the run id into the frame's URL encoded (3.3) or as it is (3.1); None:
    either."""
    quoted = urllib.parse.quote(run_id, safe="")
    page.goto(f"{base}/dags/{dag}/runs/{quoted}/plugin/tridentflow-run")
    src = page.locator("iframe").get_attribute("src")
    allowed = {True: [quoted], False: [run_id], None: [quoted, run_id]}[encoded]
    assert src in [f"tridentflow/run?dag_id={dag}&run_id={r}" for r in allowed], src
    return page.wait_for_function(RUN_TAB_FIELDS).json_value()


def xcom_shown(page: Any, base: str, dag: str, run_id: str, task_id: str) -> Any:
    """The ``return_value`` a task instance's Storage -> XCom tab shows a person, parsed.
    Airflow 3.3 shows a dict collapsed (``{ ... }``, read by a newcomer as empty: issue 66 item
    13) until "Expand all extra JSON" (or the row's arrow) is clicked: this clicks it and reads
    the JSON the page then shows."""
    quoted = urllib.parse.quote(run_id, safe="")
    page.goto(f"{base}/dags/{dag}/runs/{quoted}/tasks/{task_id}/xcom")
    cell = page.locator("tr", has_text="return_value").locator("[data-testid=xcom-value]")
    cell.wait_for()
    page.get_by_role("button", name="Expand all extra JSON").click()
    shown: list[Any] = []

    def opened() -> bool:  # the editor draws its lines as it opens: read until they parse
        with contextlib.suppress(ValueError):
            text = cell.inner_text().replace("\xa0", " ")  # the editor's spaces: no-break
            shown[:] = [json.loads(text.strip().removesuffix("Copy").strip())]
        return bool(shown) and shown[0] != {}

    wait_until(opened, 30)
    return shown[0]


def clear_from_the_ui(page: Any, base: str, dag: str, run_id: str, task_id: str) -> str:
    """Clear one finished task the way a user does: its task instance page, "Clear Task
    Instance" (the button, or its shortcut shift+c), then "Confirm" in the dialog once it
    lists the tasks it clears (Airflow fetches them after the dialog opens: "Affected Tasks:
    0" until then). Returns the dialog's text (its options: downstream is ticked by default)."""
    quoted = urllib.parse.quote(run_id, safe="")
    page.goto(f"{base}/dags/{dag}/runs/{quoted}/tasks/{task_id}")
    page.get_by_text("Success").first.wait_for()
    button = page.get_by_role("button", name=re.compile(r"^Clear Task Instance", re.I))
    if button.count():
        button.first.click()
    else:
        page.locator("body").press("Shift+C")
    dialog = page.get_by_role("dialog")
    dialog.wait_for()
    # the dialog lists the affected tasks once its dry run answered: confirm after that (if
    # it never does, the caller's check on the text says what it shows)
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: re.search(r"Affected Tasks: [1-9]", dialog.inner_text()), 30)
    text = dialog.inner_text()
    dialog.get_by_role("button", name=re.compile(r"^Confirm", re.I)).click()
    dialog.wait_for(state="hidden")
    return text


def wait_until(check: Callable[[], bool], timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(1)


def frame_locator_text(page: Any, selector: str, text: str, timeout_s: float = 30) -> None:
    """Until ``selector`` inside the plugin's frame shows exactly ``text`` (a page that
    replaces itself shows the first one's text for a moment)."""
    locator = page.frame_locator("iframe").locator(selector)
    wait_until(lambda: locator.count() > 0 and locator.first.inner_text().strip() == text,
               timeout_s)  # fmt: skip
