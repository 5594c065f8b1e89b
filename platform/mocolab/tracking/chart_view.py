"""A view of the MLflow UI that opens on a study's result: the studied parameter against ``linear_top1``.

MLflow opens its chart view on what it picks (the first metric every run shares, in the order the server
returns them); a link cannot carry plot state. What it can carry is ``viewStateShareKey``: the UI then reads
the experiment tag ``mlflow.sharedViewState.<key>`` and restores the runs page from it. Its format is the
UI's own (MLflow 3.17, read in mlflow/server/js/build: the "Save view" dialog writes it, ``useSharedViewState``
reads it), which is why pyproject.toml pins MLflow's minor version and tests/tracking/test_chart_view.py reads
the built UI for each name used here:

- the tag's value is an envelope, ``{"name", "createdAt", "updatedAt", "state"}`` (times in ms), whose
  ``state`` is a JSON string of the page's search facets (``searchFilter``, ``orderByKey``, ...) and UI state
  (``compareRunCharts``, ``compareRunSections``, ``selectedColumns``, ``runsHiddenMode``, ...); what it leaves
  out the UI fills with its defaults;
- ``#/experiments/<id>/runs?viewStateShareKey=<key>&compareRunsMode=CHART`` opens it on the charts; a search
  facet in the address (``searchFilter=``) would make the UI ignore the shared state, so the filter to the
  sweep's trials lives in the state;
- a chart card is ``{"uuid", "type", "metricSectionId", "isGenerated", "deleted", ...}``; a scatter card's axes
  are ``{"key": <name>, "type": "PARAM" | "METRIC"}``; a line card charts ``metricKey`` against the step.

The UI lists these tags as the experiment's saved views and refuses to save a 41st by hand: one per sweep.
"""

from __future__ import annotations

import json
import time
from typing import Iterable
from urllib.parse import quote, urlencode

from mocolab.tracking.store import PARENT_ID_TAG
from mocolab.tracking.uri import UI_URL

TAG_PREFIX = "mlflow.sharedViewState."
SHARE_PARAM = "viewStateShareKey"
MODE_PARAM, CHART_MODE = "compareRunsMode", "CHART"
MAX_TAG_CHARS = 20_000  # the UI refuses to save a larger view
RESULT = "linear_top1"
CURVES = ("online_linear_top1", "knn_top1")  # per-epoch series drawn beside the result, where runs log them
SECTION = "mocolab result"


def column(kind: str, key: str) -> str:
    """A runs-table column and sort key as the UI names them: ``params.`moco.m```, ``metrics.`linear_top1```."""
    return f"{kind}.`{key}`"


def _card(uuid: str, kind: str, **fields) -> dict:
    return {"uuid": uuid, "type": kind, "metricSectionId": SECTION, "isGenerated": False, "deleted": False,
            "runsCountToCompare": 100, **fields}


def view_state(param: str, parent_run_id: str | None = None, metric: str = RESULT,
               curves: tuple[str, ...] = CURVES) -> dict:
    """The runs page charting ``param`` against ``metric`` (scatter, one point per run) first, and the
    per-epoch ``curves`` below it; the runs of the sweep ``parent_run_id`` only (None: every run), best first,
    every one of them shown (the UI's default hides all but the first ten)."""
    charts = [_card("mocolab-result", "SCATTER", displayName=f"{metric} against {param}",
                    xaxis={"key": param, "type": "PARAM"}, yaxis={"key": metric, "type": "METRIC"})]
    charts += [_card(f"mocolab-{key}", "LINE", metricKey=key, displayName=key, xAxisKey="step",
                     selectedXAxisMetricKey="", lineSmoothness=0, scaleType="linear", useGlobalXaxisKey=False,
                     useGlobalLineSmoothing=False) for key in curves]
    return {
        "searchFilter": f"tags.`{PARENT_ID_TAG}` = '{parent_run_id}'" if parent_run_id else "",
        "orderByKey": column("metrics", metric), "orderByAsc": False,
        "selectedColumns": [column("params", param), column("metrics", metric)],
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": charts,
        "compareRunSections": [{"uuid": SECTION, "name": f"{param} and {metric}", "display": True,
                                "isReordered": False, "deleted": False, "isGenerated": False}],
        "isAccordionReordered": True,  # MLflow adds its generated sections after ours, not before
        "hideEmptyCharts": True,
    }


def saved_view(name: str, state: dict, created_ms: int | None = None) -> str:
    """The tag's value: the envelope the UI's "Save view" writes, ``state`` as a JSON string inside."""
    created = int(time.time() * 1000) if created_ms is None else created_ms
    text = json.dumps({"name": name, "createdAt": created, "updatedAt": created,
                       "state": json.dumps(state, separators=(",", ":"))}, separators=(",", ":"))
    if len(text) > MAX_TAG_CHARS:
        raise ValueError(f"MLflow view {name!r}: {len(text)} characters, the UI takes at most {MAX_TAG_CHARS}")
    return text


def view_key(parent_run_id: str) -> str:
    """One key per sweep, so the same command run again rewrites its view rather than add one."""
    return f"mocolab-{parent_run_id}"


def view_link(experiment_id: str, key: str, base: str = UI_URL) -> str:
    """The address that opens the view on its charts, in the UI's model-training mode."""
    query = urlencode({"workflowType": "machine_learning", SHARE_PARAM: key, MODE_PARAM: CHART_MODE},
                      quote_via=quote)
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def publish_view(client, experiment_id: str, parent_run_id: str, param: str, name: str,
                 base: str = UI_URL) -> str:
    """Write the sweep's view as an experiment tag (``client``: an ``MlflowClient``); its link."""
    key = view_key(parent_run_id)
    client.set_experiment_tag(experiment_id, TAG_PREFIX + key, saved_view(name, view_state(param, parent_run_id)))
    return view_link(experiment_id, key, base)


NOTE_TAG = "mlflow.note.content"  # the run's description on its page
NOTE_LINE = "Chart view of the result: "


def studied_param(trials, prefer: Iterable[str] = ()) -> str | None:
    """What a sweep varies, from its trials table (``params.<key>`` columns): the first of ``prefer`` (the
    keys its trials override, in order), else of the table, other than the run's own settings (seed, name),
    that takes more than one value; None where nothing varies."""
    for col in [*(f"params.{k}" for k in prefer), *trials.columns]:
        if col.startswith("params.") and not col.startswith("params.run.") and col in trials \
                and trials[col].nunique(dropna=True) > 1:
            return col[len("params."):]
    return None


def publish_sweep_view(sweep_run, trials, base: str = UI_URL, prefer: Iterable[str] = (),
                       say=print) -> str | None:
    """The sweep's chart view (its studied param against ``linear_top1``) written to its experiment, its link
    added to the parent run's description; the link, or None where nothing varies or the store refused
    (said, not raised: the study's results are logged already). ``sweep_run``: a ``store.SweepRun``."""
    param = studied_param(trials, prefer)
    if param is None:
        return None
    client = sweep_run.store.client
    try:
        link = publish_view(client, sweep_run.experiment_id, sweep_run.run_id, param,
                            f"{RESULT} against {param} (sweep {sweep_run.run_id[:8]})", base)
        note = client.get_run(sweep_run.run_id).data.tags.get(NOTE_TAG, "")
        kept = "\n".join(line for line in note.splitlines() if not line.startswith(NOTE_LINE)).rstrip()
        client.set_tag(sweep_run.run_id, NOTE_TAG, f"{kept}\n\n{NOTE_LINE}{link}".lstrip())
    except Exception as err:  # noqa: BLE001 - a view is a convenience; the study's results are logged
        say(f"MLflow: the chart view was not written ({type(err).__name__}: {err})")
        return None
    return link
