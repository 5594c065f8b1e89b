"""``mocolab baselines``: the random-init encoder of every seed and the raw pixels, logged as MLflow runs.

One run per (set name, kind, seed) in the experiment ``baselines``; the same command skips what is
logged already, and refuses to mix settings under one name as a sweep does.
"""

from __future__ import annotations

from typing import Callable, Sequence

from mocolab.training.baselines import Baseline, measure
from mocolab.config import Config, build_config, check_name, check_same_config
from mocolab.data.roots import check_data
from mocolab.config.hardware import provenance, resolve_device, resolve_precision
from mocolab.tracking import STATUS_TAG, Store, source_tags
from mocolab.tracking.store import BASELINE_KIND_TAG as KIND_TAG
from mocolab.tracking.store import BASELINE_SET_TAG as SET_TAG
from mocolab.tracking.store import BASELINES_EXPERIMENT as EXPERIMENT


def _run_name(name: str, kind: str, seed: int | None) -> str:
    return f"{name} {kind}" + ("" if seed is None else f" seed={seed}")


def log_baselines(name: str, preset: str, overrides: Sequence[str], seeds: Sequence[int], *,
                  tracking_uri: str | None = None, say: Callable[[str], None] = print) -> list[Baseline]:
    """Measure and log what is missing; return every baseline of the set (logged before or now)."""
    check_name("--name", name)
    configs = {s: check_data(build_config(preset, [*overrides, f"run.seed={s}"])) for s in seeds}
    store = Store(tracking_uri)
    exp_id = store.experiment_id(EXPERIMENT, create=True)
    assert exp_id is not None
    out: list[Baseline] = []
    for i, seed in enumerate(seeds):
        cfg = configs[seed]
        kinds = ["random-init"] + (["raw-pixels"] if i == 0 else [])
        logged = {k: _find(store, exp_id, name, k, seed if k == "random-init" else None) for k in kinds}
        for kind, run in logged.items():
            if run is not None:
                check_same_config(f"baseline '{run.info.run_name}' (MLflow run {run.info.run_id})",
                                  _identity(run.data.params, kind), _identity(cfg.flatten(), kind),
                                  "use another --name, or delete that run")
        missing = [k for k, run in logged.items() if run is None]
        if missing:
            say(f"baselines '{name}' seed {seed}: measuring {' and '.join(missing)} ...")
            measured = {b.kind: b for b in measure(cfg, pixels="raw-pixels" in missing)}
            for kind in missing:
                _log(store, exp_id, name, cfg, measured[kind])
        for kind, run in logged.items():
            b = (Baseline(kind, seed if kind == "random-init" else None, run.data.metrics["knn_top1"],
                          run.data.metrics["linear_top1"], _extra(run.data.metrics)) if run is not None
                 else measured[kind])
            out.append(b)
            say(f"  {kind:<11}" + (f" seed {seed}" if kind == "random-init" else "       ")
                + f": linear top-1 {100 * b.linear_top1:.2f}%  kNN top-1 {100 * b.knn_top1:.2f}%"
                + (" (logged before)" if run is not None else ""))
    return out


def _extra(metrics: dict[str, float]) -> dict[str, float]:
    """A logged baseline's scores besides the kNN and the full probe (none where it was logged without them)."""
    return {k: v for k, v in metrics.items() if k not in ("knn_top1", "linear_top1")}


def _identity(params, kind: str) -> dict:
    """What makes two baselines the same measurement: the config less what training alone reads."""
    skip = ("optim.", "run.threads", "run.name", "run.output_dir", "queue.", "moco.m")
    out = {k: v for k, v in params.items() if not k.startswith(skip)}
    if kind == "raw-pixels":  # no encoder: only the data and the evaluation matter
        out = {k: v for k, v in out.items() if k.startswith(("data.", "eval."))}
    return out


def _find(store: Store, exp_id: str, name: str, kind: str, seed: int | None):
    query = f"tags.`{SET_TAG}` = '{name}' and tags.`{KIND_TAG}` = '{kind}' and attributes.status = 'FINISHED'"
    runs = store.search_all([exp_id], query)
    for run in runs:
        if seed is None or str(run.data.params.get("run.seed")) == str(seed):
            return run
    return None


def _log(store: Store, exp_id: str, name: str, cfg: Config, b: Baseline) -> None:
    device = resolve_device(cfg.run.device)
    tags = {SET_TAG: name, KIND_TAG: b.kind, STATUS_TAG: "finished", **source_tags(tracking_uri=store.uri),
            **provenance(device, resolve_precision(cfg.run.precision, device))}
    run = store.client.create_run(exp_id, tags=tags, run_name=_run_name(name, b.kind, b.seed))
    rid = run.info.run_id
    try:
        store.log_params(rid, cfg.flatten())
        for key, value in b.metrics().items():
            store.client.log_metric(rid, key, value)
    except BaseException:
        store.client.delete_run(rid)  # no half-logged baseline: the next command measures it again
        raise
    store.client.set_terminated(rid, "FINISHED")
