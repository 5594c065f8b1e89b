"""A logged encoder found by what a user copies from the UI: a run id or a ``models:/`` URI.

``find_encoder`` only asks the store (no download), so ``mocolab eval`` refuses an unknown run or model
before any work; ``fetch_encoder`` then downloads the two files an encoder is rebuilt from: the run's
``config.yaml`` (which backbone, which image size) and the ``torch.export`` program whose state dict
holds the weights (tracking/logged_models.py logs it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlflow.artifacts

from mocolab.tracking.logged_models import ENCODER, _tracking_uri, model_uri
from mocolab.tracking.store import RUN_NAME_TAG, Store
from mocolab.tracking.uri import redact_uri

MODEL_URI_FORMS = "models:/<model id>, models:/<registered name>/<version> or models:/<registered name>@<alias>"


@dataclass(frozen=True)
class LoggedEncoder:
    """Where a logged encoder came from: the run that trained it, its experiment, its model URI."""

    run_id: str
    run_name: str
    experiment_id: str
    experiment: str
    model_uri: str  # models:/<model id>


def find_encoder(source: str, tracking_uri: str | None = None) -> LoggedEncoder:
    """The encoder a run id or a ``models:/`` URI names; a ValueError naming the source when there is none."""
    store = Store(tracking_uri)
    if source.startswith("models:/"):
        model_id = _model_id(store, source)
        try:
            model = store.client.get_logged_model(model_id)
        except Exception as err:  # noqa: BLE001 - MLflow's own exception types
            raise ValueError(f"MODEL_URI: {source!r} names no logged model in {redact_uri(store.uri)}") from err
        if model.name != ENCODER:
            raise ValueError(f"MODEL_URI: {source!r} is the run's {model.name!r} model; give its "
                             f"'{ENCODER}' model or the run id {model.source_run_id}")
        run_id, uri = model.source_run_id, f"models:/{model.model_id}"
    else:
        if not store.run_exists(source):
            raise ValueError(f"SOURCE: {source!r} is not a folder, a models:/ URI or a run in "
                             f"{redact_uri(store.uri)}")
        run_id, uri = source, model_uri(store.uri, source, ENCODER)
    run = store.client.get_run(run_id)
    experiment = store.client.get_experiment(run.info.experiment_id)
    return LoggedEncoder(run_id, run.data.tags.get(RUN_NAME_TAG, run.info.run_name), run.info.experiment_id,
                         experiment.name, uri)


def _model_id(store: Store, source: str) -> str:
    """The logged model's id behind any of the ``models:/`` forms."""
    rest = source[len("models:/"):].strip("/")
    try:
        if "@" in rest:
            name, alias = rest.split("@", 1)
            version = store.client.get_model_version_by_alias(name, alias)
        elif "/" in rest:
            name, number = rest.split("/", 1)
            version = store.client.get_model_version(name, number)
        else:
            return rest
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"MODEL_URI: {source!r} names no registered model version in "
                         f"{redact_uri(store.uri)} (forms: {MODEL_URI_FORMS})") from err
    # a version keeps the logged model's id, or (as some stores return it) only its models:/ source
    model_id = version.model_id or (version.source[len("models:/"):] if str(version.source).startswith("models:/")
                                    else None)
    if not model_id:
        raise ValueError(f"MODEL_URI: {source!r} is a registered version without a logged model "
                         f"(its source is {version.source!r})")
    return model_id


def fetch_encoder(found: LoggedEncoder, folder: str | Path, tracking_uri: str | None = None) -> tuple[Path, Path]:
    """(the encoder's ``.pt2`` program, the run's ``config.yaml``), downloaded into ``folder``."""
    store = Store(tracking_uri)
    folder = Path(folder)
    with _tracking_uri(store.uri):
        local = Path(mlflow.artifacts.download_artifacts(found.model_uri, dst_path=str(folder / ENCODER)))
    program = next(local.rglob("*.pt2"), None)
    if program is None:
        raise ValueError(f"{found.model_uri}: the logged model holds no torch.export program (.pt2)")
    config = Path(store.client.download_artifacts(found.run_id, "config.yaml", str(folder)))
    return program, config
