"""MLflow's own pages on a large store, as a researcher opens them: headless Chromium (Debian's, driven by
Playwright as tests/tracking/test_mlflow_ui.py drives it) timed from the address to the drawn page.

- the experiment's runs list (``?workflowType=machine_learning``) until its table shows rows;
- one sweep's chart view, as the ``view`` link a study prints opens it (``tracking/chart_view.py``: its 100
  runs, ``moco.m`` against ``linear_top1`` and two curves), until the scatter has drawn its points. The
  experiment's own chart view charts the rows its runs list shows, the sweeps' parent runs, which log no
  metrics: it draws no chart at any size, so it is not timed;
- the compare page of one sweep's 100 trials until its parallel-coordinates plot is drawn.

Each in a fresh browser profile, so no cache helps. The store is served by ``server`` (an address) or, given
none, by an ``mlflow server`` of this module's own on the sqlite ``store``, stopped at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

COMPARED = 100  # runs on the compare page
TIMEOUT_MS = 180_000  # a page not drawn by then is recorded as such
PLOT_DRAWN = """() => [...document.querySelectorAll('.js-plotly-plot')].some(g => g.data && g.data.length
    && g.querySelector('.plot-container'))"""
SCATTER_DRAWN = """() => [...document.querySelectorAll('.js-plotly-plot')].some(g =>
    g.querySelector('.xtitle')?.textContent === 'moco.m' && g.data && g.data.some(t => t.x && t.x.length))"""
PARCOORDS_DRAWN = """() => [...document.querySelectorAll('.js-plotly-plot')].some(g => g.data && g.data[0]
    && g.data[0].type === 'parcoords' && g.querySelector('.parcoords, .plot-container'))"""


def _serve(folder: Path, store: str) -> tuple[subprocess.Popen, str]:
    from store_scale import _free_port

    port = _free_port()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port",
                             str(port), "--workers", "1", "--backend-store-uri", store],
                            stdout=subprocess.DEVNULL, stderr=open(folder / "pages-mlflow.log", "a"),
                            start_new_session=True, cwd=folder,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(1)
    _stop(proc)
    raise SystemExit(f"mlflow server did not answer: {(folder / 'pages-mlflow.log').read_text()[-2000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers, started here only
        proc.wait(timeout=60)


def time_pages(server: str | None, folder: Path, store: str, experiment: str) -> list[tuple[str, str]]:
    """(what, seconds) of each page, drawn."""
    from mlflow.tracking import MlflowClient
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    from mocolab.tracking.chart_view import publish_view
    from mocolab.tracking.store import PARENT_ID_TAG, PARENT_TAG, Store

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("--pages: no chromium executable (make chromium: apt-get install chromium)")
    proc = None
    if server is None:
        proc, server = _serve(folder, store)
    rows = []
    try:
        st = Store(server)
        exp = st.experiment_id(experiment)
        parent = sorted(st.search_all([exp], f"tags.`{PARENT_TAG}` != ''"), key=lambda r: r.info.start_time)[-1]
        ids = [r.info.run_id for r in st.search_all([exp], f"tags.`{PARENT_ID_TAG}` = '{parent.info.run_id}'")]
        ids = ids[:COMPARED]
        MlflowClient(server).set_experiment_tag(exp, "mlflow.experimentKind", "custom_model_development")
        query = urllib.parse.urlencode({"runs": json.dumps(ids), "experiments": json.dumps([exp])})
        pages = [
            ("MLflow's experiment page, runs table drawn",
             f"{server}/#/experiments/{exp}?workflowType=machine_learning",
             lambda page: page.locator(".ag-row").first.wait_for()),
            (f"a sweep's chart view ({len(ids)} runs: the `view` link a study prints), its scatter drawn",
             publish_view(MlflowClient(server), exp, parent.info.run_id, "moco.m", "benchmark view", server),
             lambda page: page.wait_for_function(SCATTER_DRAWN, timeout=TIMEOUT_MS)),
            (f"MLflow's compare page of {len(ids)} runs, parallel coordinates drawn",
             f"{server}/#/compare-runs?{query}",
             lambda page: (page.get_by_text(f"Comparing {len(ids)} Runs").first.wait_for(),
                           page.wait_for_function(PARCOORDS_DRAWN, timeout=TIMEOUT_MS))),
        ]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True)
            try:
                for what, address, drawn in pages:
                    page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
                    page.set_default_timeout(TIMEOUT_MS)
                    t0 = time.perf_counter()
                    page.goto(address)
                    try:
                        drawn(page)
                        took = f"{time.perf_counter() - t0:.1f} s"
                    except PlaywrightTimeout:
                        took = f"not drawn in {TIMEOUT_MS / 1000:.0f} s"
                    page.screenshot(path=str(folder / f"page-{len(rows)}.png"))
                    rows.append((what, took))
                    print(f"  {what}: {took} (load {', '.join(f'{x:.1f}' for x in os.getloadavg())})", flush=True)
                    page.context.close()
            finally:
                browser.close()
    finally:
        if proc is not None:
            _stop(proc)
    return rows
