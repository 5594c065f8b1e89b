"""The MLflow UI as a new user sees it after ``make run``: a real (tiny) momentum sweep, a real ``mlflow server``
on its store, and Debian's chromium driven headless by Playwright through the clicks README gives.

What it holds MLflow 3.17 to (checked by hand in its built UI, mlflow/server/js/build):
- a fresh browser opens an experiment (``#/experiments/<id>``) on the GenAI "Overview", not on the runs, and the
  experiment tag ``mlflow.experimentKind=custom_model_development`` does not change that: the UI takes the kind
  from its workflow switch (``?workflowType=`` in the URL, else localStorage ``mlflow.workflowType_v1``, else
  ``genai``);
- ``#/experiments/<id>?workflowType=machine_learning`` opens the runs list;
- the compare page is ``#/compare-runs?runs=[<ids as JSON>]&experiments=[<ids as JSON>]``;
- README's clicks: "Model training", Experiments, the experiment, [+] on the sweep's parent run, Columns
  (linear_top1, moco.m), tick the child runs, Compare, "Scatter Plot", X-axis moco.m, Y-axis linear_top1.

Screenshots go to tests/artifacts/ (gitignored): mlflow-runs.png, mlflow-compare.png, mlflow-linear-vs-m.png,
mlflow-view.png and feature-maps.png (the study report's; `make screenshots` copies the last two to docs/images/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import _free_port, mlflow_store, start_mlflow_server, stop_mlflow_server
from mocolab.data.sets import fashion_mnist_dir

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# As tests/tune/test_tune.py's TINY: two trials of 10 steps on 1,024 images (the queue must be below the subset).
TINY = {"data.subset": 1024, "eval.knn_bank": 1024, "eval.knn_test": 500, "eval.linear_train": 1024,
        "run.log_models": False, "eval.linear_steps": 20, "optim.max_steps": 10, "queue.size": 512}
MOMENTA = ("0.9", "0.99")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium executable (make chromium: apt-get install chromium)"),
    pytest.mark.skipif(fashion_mnist_dir() is None, reason="Fashion-MNIST not installed (make data)"),
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The store ``make run`` leaves, in small: the momentum study's parent run and its child runs."""
    tmp = tmp_path_factory.mktemp("ui")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.time()
    res = subprocess.run([sys.executable, str(REPO / "experiments/momentum_ablation.py"), "--preset", "smoke",
                          "--tracking-uri", mlflow_store(tmp), "--storage", str(tmp / "sweeps"),
                          *[f"--set={k}={v}" for k, v in TINY.items()], "--momenta", ",".join(MOMENTA),
                          "--workers-per-trial", "0"],
                         capture_output=True, text=True, timeout=1800, env=env, cwd=tmp)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    print(f"sweep: {time.time() - t0:.1f} s")
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    exp = client.get_experiment_by_name("momentum-ablation")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    children = sorted((r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id),
                      key=lambda r: float(r.data.params["moco.m"]))
    assert [r.data.params["moco.m"] for r in children] == list(MOMENTA)
    assert all(r.info.status == "FINISHED" and "linear_top1" in r.data.metrics for r in children)
    # the addresses the study prints for the UI (README tells users to open them)
    printed = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in res.stdout.splitlines()
               if line.startswith(("  runs:", "  compare:", "  view:"))}
    assert set(printed) == {"runs", "compare", "view"}, res.stdout[-2000:]
    report = next(tmp.glob("sweeps/*/report"))
    return {"db": tmp / "mlflow.db", "folder": tmp, "experiment_id": exp.experiment_id,
            "parent": parents[0], "children": children, "printed": printed, "report": report, "stdout": res.stdout}


def test_the_summary_sets_each_arms_1_percent_probe_beside_its_start_and_names_the_feature_maps(sweep):
    """What `make run` prints, in small: the 1 % probe of every arm and of the random-init encoder and raw pixels,
    read back from the runs MLflow holds, and the side-by-side feature maps by their path."""
    lines = sweep["stdout"].splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["m", "seeds"])
    assert "1 % labels %" in lines[head]
    rows = {line.split()[0]: line.split() for line in lines[head + 1:head + 1 + len(MOMENTA) + 2]}
    assert set(rows) == {f"{float(m):g}" for m in MOMENTA} | {"random-init", "raw-pixels"}, lines[head:head + 8]
    for name, row in rows.items():  # m, seeds, linear, 1 % labels: a number for every arm and both baselines
        assert 0 < float(row[3]) < 100 and row[3] != row[2], (name, row)
    logged = {f"{float(r.data.params['moco.m']):g}": 100 * r.data.metrics["linear_top1_1pct"]
              for r in sweep["children"]}
    assert {m: float(rows[m][3]) for m in logged} == pytest.approx(logged, abs=0.006)
    assert not [line for line in lines if "was not measured" in line]
    maps = [line for line in lines if line.startswith("Feature maps: ")]
    assert len(maps) == 1 and Path(maps[0].split()[2]).is_file() and maps[0].split()[2].endswith("feature_maps.png")


@pytest.fixture(scope="module")
def ui(sweep):
    """``mlflow server`` on the sweep's store, as ``mlflow ui --backend-store-uri sqlite:///mlflow.db`` runs it;
    yields its address once /health answers, and stops it (its own session: it and its workers, nothing else)."""
    port = _free_port()
    t0 = time.time()
    proc = start_mlflow_server(sweep["folder"], port, store=f"sqlite:///{sweep['db']}")
    print(f"mlflow server: /health after {time.time() - t0:.1f} s")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_mlflow_server(proc)


def _hash_route(page) -> str:
    """The hash route the app settled on (``/experiments/1/runs``), once it left the bare experiment URL."""
    page.wait_for_function("() => /\\/experiments\\/[^/?]+\\/[a-z]/.test(location.hash)")
    return urllib.parse.urlsplit(page.evaluate("location.hash")[1:]).path


def _close_assistant(page) -> None:
    """A fresh profile opens the "MLflow Assistant" panel over a third of the page; close it for the screenshots."""
    close = page.get_by_role("button", name="Close", exact=True)
    if close.count():
        close.first.click()


def _row_index(page, run_name: str) -> str:
    """AG Grid's row-index of the runs-table row that links to ``run_name``."""
    link = page.get_by_role("link", name=run_name, exact=True)
    link.first.wait_for()
    return page.locator(".ag-row", has=link).first.get_attribute("row-index")


def _cell(page, run_name: str, col_id: str) -> str:
    row = _row_index(page, run_name)
    return page.locator(f".ag-row[row-index='{row}'] [col-id='{col_id}']").first.inner_text().strip()


def test_a_new_user_finds_the_runs_and_plots_linear_top1_against_m(sweep, ui):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "mlflow-ui-failure.png").unlink(missing_ok=True)
    exp_id, parent, children = sweep["experiment_id"], sweep["parent"], sweep["children"]
    names = [r.info.run_name for r in children]
    ids = [r.info.run_id for r in children]
    page_errors: list[str] = []   # uncaught exceptions in the app: fail
    console: list[str] = []       # console errors and failed requests: reported, not failed on (MLflow's own)

    # The tag a training platform would set to say "this is model training": MLflow 3.17 ignores it (see below).
    MlflowClient(ui).set_experiment_tag(exp_id, "mlflow.experimentKind", "custom_model_development")

    t0 = time.time()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)

        def fresh_page():  # a fresh profile: no localStorage, as a new user's browser
            page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
            page.set_default_timeout(30_000)
            page.on("pageerror", lambda e: page_errors.append(f"{page.url}: {e}"))
            page.on("console", lambda m: console.append(f"console {m.type}: {m.text[:300]}") if m.type == "error"
                    else None)
            page.on("response", lambda r: console.append(f"HTTP {r.status} {r.request.method} {r.url}")
                    if r.status >= 400 else None)
            return page

        page = None
        try:
            # 1. The bare experiment URL opens the GenAI overview, tag or no tag; ?workflowType=machine_learning
            #    opens the runs list.
            page = fresh_page()
            page.goto(f"{ui}/#/experiments/{exp_id}")
            route = _hash_route(page)
            assert route == f"/experiments/{exp_id}/overview/usage", (
                f"MLflow now opens an experiment on {route}: README's 'Model training' step may be unneeded")
            # The runs address the study printed (its host is `mlflow ui`'s default; this server has its own port)
            printed = {k: v.replace("http://127.0.0.1:5000", ui) for k, v in sweep["printed"].items()}
            assert printed["runs"] == f"{ui}/#/experiments/{exp_id}?workflowType=machine_learning"
            page = fresh_page()
            page.goto(printed["runs"])
            assert _hash_route(page) == f"/experiments/{exp_id}/runs"
            page.get_by_role("link", name=parent.info.run_name, exact=True).wait_for()

            # 2. The compare address the study printed: every child run, from the ids alone.
            query = urllib.parse.parse_qs(printed["compare"].split("?", 1)[1])
            assert sorted(json.loads(query["runs"][0])) == sorted(ids)
            assert json.loads(query["experiments"][0]) == [exp_id]
            page.goto(printed["compare"])
            page.get_by_text(f"Comparing {len(ids)} Runs from 1 Experiment").wait_for()
            for name in names:
                page.get_by_text(name, exact=True).first.wait_for()

            # 3. README's clicks, from the front page of a fresh browser.
            page = fresh_page()
            page.goto(f"{ui}/")
            page.get_by_text("Model training", exact=True).click()
            page.get_by_role("link", name="Experiments", exact=True).first.click()
            page.get_by_role("link", name="momentum-ablation", exact=True).click()
            assert _hash_route(page) == f"/experiments/{exp_id}/runs"
            page.get_by_role("link", name=parent.info.run_name, exact=True).wait_for()
            _close_assistant(page)
            # the sweep is one parent row; its child runs are under its [+]
            assert page.get_by_role("link", name=names[0], exact=True).count() == 0
            page.locator(".ag-row", has=page.get_by_role("link", name=parent.info.run_name, exact=True)) \
                .get_by_role("button").first.click()
            # no metric or param is a column until chosen: Columns, search, tick
            page.get_by_role("button", name="Columns", exact=True).click()
            tree = page.get_by_test_id("column-selector-tree")
            for column in ("linear_top1", "moco.m"):
                page.get_by_placeholder("Search columns").fill(column)
                # the item named exactly so: typing moco.m also lists moco.m_schedule, its match highlighted
                tree.locator(f"xpath=.//*[normalize-space(.)='{column}' and normalize-space(..)='{column}']") \
                    .first.click()
            page.keyboard.press("Escape")
            for run in children:
                assert _cell(page, run.info.run_name, "params.`moco.m`") == run.data.params["moco.m"]
                shown = float(_cell(page, run.info.run_name, "metrics.`linear_top1`"))
                assert shown == pytest.approx(run.data.metrics["linear_top1"], abs=5e-5)
            html = page.content()
            assert all(name in html for name in names) and "linear_top1" in html and "moco.m" in html
            page.screenshot(path=str(ARTIFACTS / "mlflow-runs.png"), full_page=True)

            for name in names:
                page.locator(f".ag-row[row-index='{_row_index(page, name)}'] input[type=checkbox]").first.check()
            page.get_by_role("button", name="Compare", exact=True).click()
            page.get_by_text(f"Comparing {len(ids)} Runs from 1 Experiment").wait_for()
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(page.evaluate("location.hash")[1:]).query)
            assert sorted(json.loads(query["runs"][0])) == sorted(ids)
            assert json.loads(query["experiments"][0]) == [exp_id]
            _close_assistant(page)
            for name in names:
                page.get_by_text(name, exact=True).first.wait_for()
            text = page.inner_text("body")
            assert all(name in text for name in names) and "linear_top1" in text and "moco.m" in text
            page.screenshot(path=str(ARTIFACTS / "mlflow-compare.png"), full_page=True)
            # the page opens on a parallel-coordinates plot of the first three params that differ (sorted) and
            # the first metric: what the study varies is an axis, a trial's own name is not
            page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                                   ".some(g => g.data && g.data[0] && g.data[0].type === 'parcoords')")
            axes = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
                .map(g => g.data && g.data[0]).filter(d => d && d.type === 'parcoords')[0]
                .dimensions.map(d => d.label)""")
            assert "moco.m" in axes and "run.name" not in axes, axes

            page.get_by_text("Scatter Plot", exact=True).click()
            page.locator("#x-axis-selector").click()
            page.get_by_role("option", name="moco.m", exact=True).click()
            page.locator("#y-axis-selector").click()
            page.get_by_role("option", name="linear_top1", exact=True).click()
            page.wait_for_function("() => document.querySelector('.js-plotly-plot .ytitle')?.textContent"
                                   " === 'linear_top1'")
            plot = page.evaluate("""() => { const g = document.querySelector('.js-plotly-plot');
                return {x: g.data[0].x, y: g.data[0].y, xtitle: g.querySelector('.xtitle').textContent}; }""")
            assert plot["xtitle"] == "moco.m"
            points = sorted(zip(map(float, plot["x"]), map(float, plot["y"])))
            expected = sorted((float(r.data.params["moco.m"]), r.data.metrics["linear_top1"]) for r in children)
            assert [v for pt in points for v in pt] == pytest.approx([v for pt in expected for v in pt]), plot
            page.screenshot(path=str(ARTIFACTS / "mlflow-linear-vs-m.png"), full_page=True)
        except Exception:
            if page is not None:
                page.screenshot(path=str(ARTIFACTS / "mlflow-ui-failure.png"), full_page=True)
            raise
        finally:
            (ARTIFACTS / "mlflow-ui-console.txt").write_text("\n".join(console) + "\n")
            browser.close()
    print(f"browser: {time.time() - t0:.1f} s; console errors / failed requests: {len(console)}")
    assert not page_errors, page_errors


def test_the_printed_view_opens_on_linear_top1_against_m_drawn(sweep, ui):
    """The study's ``view:`` link (tracking/chart_view.py) in a fresh browser: the drawn chart's own axis titles
    (plotly's .xtitle / .ytitle elements) are moco.m and linear_top1, its points the child runs'; and each run
    logged its best_* / final_* keys and the features its map is made from."""
    from playwright.sync_api import sync_playwright

    children = sweep["children"]
    client = MlflowClient(f"sqlite:///{sweep['db']}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for run in children:
        assert {"best_knn_top1", "final_knn_top1"} <= set(run.data.metrics), sorted(run.data.metrics)
        assert "feature_map/features.npz" in {a.path for a in client.list_artifacts(run.info.run_id, "feature_map")}
    # the study's report drew one map per arm from those features
    assert (sweep["report"] / "feature_maps.png").exists()
    shutil.copyfile(sweep["report"] / "feature_maps.png", ARTIFACTS / "feature-maps.png")
    link = sweep["printed"]["view"].replace("http://127.0.0.1:5000", ui)
    assert "viewStateShareKey=" in link and "compareRunsMode=CHART" in link
    assert link in client.get_run(sweep["parent"].info.run_id).data.tags["mlflow.note.content"].replace(
        "http://127.0.0.1:5000", ui)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(60_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(link)
            page.wait_for_function("""() => [...document.querySelectorAll('.js-plotly-plot')].some(g =>
                g.querySelector('.xtitle')?.textContent === 'moco.m'
                && g.querySelector('.ytitle')?.textContent === 'linear_top1')""")
            plot = page.evaluate("""() => { const g = [...document.querySelectorAll('.js-plotly-plot')].find(g =>
                g.querySelector('.xtitle')?.textContent === 'moco.m');
                return g.data.map(t => [t.x, t.y]); }""")
            _close_assistant(page)
            page.screenshot(path=str(ARTIFACTS / "mlflow-view.png"))
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "mlflow-ui-failure.png"), full_page=True)
            raise
        finally:
            browser.close()
    points = sorted((float(x), float(y)) for xs, ys in plot for x, y in zip(xs, ys))
    expected = sorted((float(r.data.params["moco.m"]), r.data.metrics["linear_top1"]) for r in children)
    assert [v for pt in points for v in pt] == pytest.approx([v for pt in expected for v in pt]), plot
    assert not errors, errors
