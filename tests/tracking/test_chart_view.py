"""The chart view a study's link opens (tracking/chart_view.py): MLflow's own shared-view format, checked
against the UI this MLflow ships (its built JavaScript), and written to a real store.

The format is MLflow's internal one: a new MLflow that renames a field fails here, before a user's link opens
on an empty page (tests/tracking/test_mlflow_ui.py then checks the drawn chart in Chromium).
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import mlflow_store
from mocolab.tracking.chart_view import (NOTE_LINE, TAG_PREFIX, publish_sweep_view, saved_view, studied_param,
                                         view_key, view_link, view_state)
from mocolab.tracking.store import SweepRun, Store

REPO = Path(__file__).resolve().parents[2]
UI_JS = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"


@pytest.fixture(scope="module")
def ui_code() -> str:
    """Every built JavaScript file of MLflow's UI, joined."""
    files = sorted(UI_JS.glob("*.js"))
    assert files, f"no built UI under {UI_JS}"
    return "\n".join(f.read_text(errors="replace") for f in files)


def test_mlflow_is_pinned_to_the_minor_version_whose_ui_format_this_writes():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if d.startswith("mlflow"))
    major, minor = mlflow.__version__.split(".")[:2]
    assert f">={major}.{minor}" in pin and f"<{major}.{int(minor) + 1}" in pin, (pin, mlflow.__version__)


def test_the_ui_reads_the_view_in_the_format_written(ui_code):
    """Each name the view uses, where the UI defines it: the tag prefix and URL parameter, the saved view's
    envelope, the search facets and UI state it restores, the chart cards' types and axes."""
    assert 'U="viewStateShareKey",$="mlflow.sharedViewState."' in ui_code
    assert TAG_PREFIX == "mlflow.sharedViewState."
    assert 'o="compareRunsMode"' in ui_code  # the charts/table switch, read from the address
    # the envelope "Save view" writes and the shared view reads
    assert "JSON.stringify({name:e,createdAt:i,updatedAt:a,state:t})" in ui_code
    assert "expected an object with a string `name`, number `createdAt`, and string `state`" in ui_code
    facets = re.search(r'const a=\["searchFilter",[^\]]*\]', ui_code)
    assert facets and all(f'"{k}"' in facets.group(0) for k in ("searchFilter", "orderByKey", "orderByAsc"))
    ui_state = re.search(r'const a=\["selectedColumns",[^\]]*\]', ui_code)
    state = view_state("moco.m", "p" * 32)
    restored = {k for k in state if k not in ("searchFilter", "orderByKey", "orderByAsc")}
    assert ui_state and all(f'"{k}"' in ui_state.group(0) for k in restored), (ui_state, restored)
    assert 'e.SHOWALL="SHOW_ALL"' in ui_code and state["runsHiddenMode"] == "SHOW_ALL"
    assert 'e.SCATTER="SCATTER"' in ui_code and 'e.LINE="LINE"' in ui_code
    assert 'this.type=c.SCATTER,this.xaxis={key:"",type:"METRIC"},this.yaxis={key:"",type:"METRIC"}' in ui_code
    assert '(0,v.GF)("PARAM",e)' in ui_code  # a param on a scatter axis
    assert 'this.type=c.LINE,this.metricKey=""' in ui_code
    assert 'const a=()=>({searchFilter:"",orderByKey:' in ui_code  # defaults fill what the view leaves out
    # the column / sort key form: params.`moco.m`
    assert 'I=(e,t)=>e+".`"+t+"`"' in ui_code


def test_the_view_charts_the_studied_param_against_linear_top1():
    state = view_state("moco.m", "abc")
    scatter = state["compareRunCharts"][0]
    assert scatter["type"] == "SCATTER" and scatter["xaxis"] == {"key": "moco.m", "type": "PARAM"}
    assert scatter["yaxis"] == {"key": "linear_top1", "type": "METRIC"}
    assert {c["metricSectionId"] for c in state["compareRunCharts"]} == {s["uuid"] for s in
                                                                       state["compareRunSections"]}
    assert state["searchFilter"] == "tags.`mlflow.parentRunId` = 'abc'"
    envelope = json.loads(saved_view("v", state, created_ms=5))
    assert envelope["name"] == "v" and envelope["createdAt"] == envelope["updatedAt"] == 5
    assert json.loads(envelope["state"]) == state
    link = view_link("7", view_key("abc"), "http://h:1/")
    assert link == ("http://h:1/#/experiments/7/runs?workflowType=machine_learning&viewStateShareKey=mocolab-abc"
                    "&compareRunsMode=CHART")
    assert "searchFilter" not in link  # a facet in the address makes the UI drop the shared state
    with pytest.raises(ValueError, match="at most 20000"):
        saved_view("v", {"x": "y" * 20_000})


def test_the_studied_param_is_what_the_trials_vary_beside_their_seeds():
    trials = pd.DataFrame({"params.run.seed": ["0", "1"], "params.augment.jitter": ["0.4", "0.5"],
                           "params.moco.m": ["0.9", "0.99"], "params.moco.tau": ["0.2", "0.2"]})
    assert studied_param(trials) == "augment.jitter"
    assert studied_param(trials, prefer=["run.seed", "moco.m"]) == "moco.m"
    assert studied_param(trials[["params.run.seed", "params.moco.tau"]]) is None


def test_a_sweep_writes_its_view_and_names_it_in_its_description(tmp_path):
    store = Store(mlflow_store(tmp_path))
    parent = SweepRun.open(store, "momentum-ablation", "s", description="a grid over moco.m", params={}, tags={})
    trials = pd.DataFrame({"params.moco.m": ["0.9", "0.99"]})
    link = publish_sweep_view(parent, trials, "http://127.0.0.1:5000")
    again = publish_sweep_view(parent, trials, "http://127.0.0.1:5000")  # the same command once more
    assert link == again == view_link(parent.experiment_id, view_key(parent.run_id))
    client = MlflowClient(store.uri)
    tags = client.get_experiment(parent.experiment_id).tags
    views = {k: v for k, v in tags.items() if k.startswith(TAG_PREFIX)}
    assert list(views) == [TAG_PREFIX + view_key(parent.run_id)]
    state = json.loads(json.loads(views[TAG_PREFIX + view_key(parent.run_id)])["state"])
    assert state["compareRunCharts"][0]["xaxis"]["key"] == "moco.m"
    note = client.get_run(parent.run_id).data.tags["mlflow.note.content"]
    assert note == f"a grid over moco.m\n\n{NOTE_LINE}{link}"
    assert publish_sweep_view(parent, trials[[]].assign(**{"params.moco.m": ["0.9", "0.9"]})) is None
