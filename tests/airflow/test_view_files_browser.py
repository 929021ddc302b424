"""The tridentflow page in Debian's Chromium for a FileSource pipeline (issue 69 goal 6): a
person sees the files each commit took, the lag counted in files and the files waiting -
each figure read off the page and compared with the view's own REST answer. The view's app
runs under uvicorn with its authentication dependency overridden (the live stack's browser
test, test_airflow_runs.py, covers Airflow's login and frame)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.airflow import browser
from tests.airflow.test_view import as_connection
from tests.test_file_source import ENGINE, batch, pipeline, runtime_of, write
from tridentflow.devtools.devredis import free_port
from tridentflow.steps.driver import run_batches
from tridentflow_airflow import view


@pytest.fixture
def served(redis_url, home, monkeypatch) -> Iterator[str]:
    """The view's app on a free port (no login); its base URL."""
    import uvicorn

    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("AIRFLOW_CONN_REDIS_DEFAULT", as_connection(redis_url))
    monkeypatch.setenv("TRIDENTFLOW_HOME", str(home))
    view.app.dependency_overrides[view.AUTHENTICATED] = lambda: None
    view.app.dependency_overrides[view.current_user] = lambda: None
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(view.app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        view.app.dependency_overrides.clear()


def test_the_page_shows_the_files_each_commit_took_and_those_waiting(
    served, redis_url, home, tmp_path, monkeypatch
):
    from playwright.sync_api import sync_playwright

    landing = tmp_path / "landing"
    for i in range(3):
        write(landing, f"{i}.parquet", batch(i), mtime=1_700_000_000 + i)
    built = pipeline(landing, batch_size=2)
    rt = runtime_of(built, redis_url, home)
    run_batches(rt, ENGINE)  # txid 1 takes 0 and 1, txid 2 takes 2
    for i in range(3, 15):  # twelve files waiting: the page shows the first ten
        write(landing, f"{i:02d}.parquet", batch(i), mtime=1_700_000_000 + i)
    monkeypatch.setattr(view, "known_pipelines", lambda: {built.name: built})
    rest = TestClient(view.app).get(f"/api/pipelines/{built.name}?history=30").json()
    assert [e["took"] for e in rest["history"]] == [
        [str(landing / "2.parquet")],
        [str(landing / "0.parquet"), str(landing / "1.parquet")],
    ]
    assert (rest["lag"], rest["lag_unit"], len(rest["waiting"])) == (12, "files", 10)

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=browser.chromium(), headless=True)
        try:
            page = chromium.new_page(viewport={"width": 1400, "height": 1100})
            page.set_default_timeout(60_000)
            page.goto(f"{served}/ui?pipeline={built.name}")
            page.locator(f"#body[data-pipeline='{built.name}']").wait_for()
            assert page.locator("#lag").inner_text().strip() == f"{rest['lag']} files"
            header = page.locator("#commits tr").first.locator("th").all_inner_texts()
            took_column = header.index("took")
            rows = page.locator("#commits tr").all()[1:]
            shown = {
                row.locator("td").nth(0).inner_text().strip(): row.locator("td")
                .nth(took_column)
                .inner_text()
                .strip()
                for row in rows
            }
            assert shown == {str(e["txid"]): ", ".join(e["took"]) for e in rest["history"]}
            waiting = page.locator("#waiting li").all_inner_texts()
            assert waiting == rest["waiting"]
            assert waiting[0] == str(landing / "03.parquet")
            heading = page.get_by_role("heading", name="Waiting").inner_text()
            assert heading == "Waiting (12 files)"
            browser.screenshot(page, "tridentflow-files")
        finally:
            chromium.close()
