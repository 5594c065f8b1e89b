"""Trained encoders as MLflow models: logged at a run's end, found by run id or ``models:/`` URI,
downloaded, exported, registered.

Format: ``mlflow.pytorch`` with ``serialization_format="pt2"``, a
``torch.export`` program. Why: it loads with torch alone, without
unpickling code (a pickled module needs our classes importable and runs
whatever the pickle says), it keeps a dynamic batch size, and MLflow gives
it a signature, an input example, the run's metrics at the final step and
a place in the Model Registry. The pip requirements are given, because
MLflow's own inference of them loads the model in a subprocess, which
costs far more than the logging (benchmarks/RESULTS.md, "MLflow as the hub:
what logging models and machine metrics costs").

Two models per finished run: ``encoder`` (images -> backbone features, the
features kNN and the probe read) and ``classifier`` (images -> the linear
probe's logits). Both take float32 images in [0, 1], N×C×H×W (models/exported.py).

``find_encoder`` only asks the store (no download), so ``mocolab eval`` refuses an unknown run or model
before any work; ``fetch_encoder`` then downloads the two files an encoder is rebuilt from: the run's
``config.yaml`` (which backbone, which image size) and the ``torch.export`` program whose state dict
holds the weights.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlflow.artifacts
import torch
import yaml
from mlflow.models import infer_signature
from mlflow.tracking._tracking_service.utils import _use_tracking_uri

from mocolab.models.exported import backbone_state
from mocolab.tracking.source import DIRTY_TAG
from mocolab.tracking.store import RUN_NAME_TAG, Store
from mocolab.tracking.uri import redact_uri

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no progress bars in logs and tests

ENCODER = "encoder"
CLASSIFIER = "classifier"
MODEL_URI_FORMS = "models:/<model id>, models:/<registered name>/<version> or models:/<registered name>@<alias>"


def _tracking_uri(uri: str):
    """MLflow's model logging and loading speak the fluent API's global URI: set it for the call only
    (MLflow's own context manager for this; it restores whatever was set before)."""
    return _use_tracking_uri(uri)


def log_models(uri: str, run_id: str, modules: dict[str, torch.nn.Module], example: torch.Tensor, step: int,
               say: Callable[[str], None] = print) -> dict[str, str]:
    """Log each module as a pt2 MLflow model of ``run_id`` (in the run's experiment); {name: models:/ URI}.

    Best-effort like the metrics: a store that fails here leaves the run and its checkpoint intact, and
    says so.
    """
    import mlflow.pytorch

    store = Store(uri)
    out: dict[str, str] = {}
    try:
        run = store.client.get_run(run_id)
        experiment_id = run.info.experiment_id
        requirements = [f"torch=={torch.__version__.split('+')[0]}"]
        with _tracking_uri(store.uri):
            for name, module in modules.items():
                try:  # a finished run started again (same name) evaluates again: its models are already there
                    out[name] = model_uri(store.uri, run_id, name)
                    continue
                except ValueError:
                    pass
                module = module.eval()
                with torch.no_grad():
                    output = module(example)
                model = store.client.create_logged_model(experiment_id=experiment_id, name=name,
                                                         source_run_id=run_id)
                try:
                    info = mlflow.pytorch.log_model(
                        module, name=name, serialization_format="pt2", input_example=example.numpy(),
                        signature=infer_signature(example.numpy(), output.numpy()), pip_requirements=requirements,
                        model_id=model.model_id, run_id=run_id, step=step,
                        # MLflow would load the model back to run the example (1.5 s a model, every run);
                        # its failure is only a warning, and the exported program was just run above
                        validate_serving_input=False)
                except BaseException:
                    try:  # no half-logged model left in the experiment's Models list
                        store.client.delete_logged_model(model.model_id)
                    except Exception:  # noqa: BLE001 - the store itself may be what failed
                        pass
                    raise
                out[name] = info.model_uri
    except Exception as err:  # noqa: BLE001 - the checkpoint still holds the weights
        say(f"MLflow: could not log the trained model(s) ({type(err).__name__}: {err}); the run's checkpoint "
            f"still holds the weights")
    return out


def model_uri(uri: str | None, run_id: str, name: str = ENCODER) -> str:
    """``models:/<id>`` of the model ``name`` a run logged; a clear error when it has none."""
    store = Store(uri)
    try:
        run = store.client.get_run(run_id)
    except Exception as err:  # noqa: BLE001 - MLflow's own exception types
        raise ValueError(f"RUN_ID: {run_id!r} is not a run in {store.uri}") from err
    outputs = run.outputs.model_outputs if run.outputs is not None else []
    for out in outputs:
        model = store.client.get_logged_model(out.model_id)
        if model.name == name:
            return f"models:/{model.model_id}"
    raise ValueError(f"run {run_id} has no '{name}' model: only runs that finished log one (status "
                     f"{run.data.tags.get('mocolab.status', run.info.status.lower())}); its checkpoints are at "
                     f"{run.data.tags.get('mocolab.checkpoint', run.data.tags.get('mocolab.checkpoint_dir', '?'))}")


def load_encoder(run_id: str, tracking_uri: str | None = None, name: str = ENCODER) -> torch.nn.Module:
    """The run's encoder (or ``name="classifier"``) as a torch module: float [0, 1] images in, features out."""
    import mlflow.pytorch

    uri = model_uri(tracking_uri, run_id, name)
    with _tracking_uri(Store(tracking_uri).uri):
        return mlflow.pytorch.load_model(uri)


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


def export_run(run_id: str, out: str | Path, tracking_uri: str | None = None) -> Path:
    """``mocolab export``: the run's backbone weights, its pt2 programs, config, metrics and a README in ``out``."""
    store = Store(tracking_uri)
    enc_uri = model_uri(store.uri, run_id, ENCODER)
    run = store.client.get_run(run_id)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out: {out} exists and is not empty; choose a new folder")
    with tempfile.TemporaryDirectory() as tmp, _tracking_uri(store.uri):
        out.mkdir(parents=True, exist_ok=True)
        try:
            files = {}
            for name in (ENCODER, CLASSIFIER):
                try:
                    local = Path(mlflow.artifacts.download_artifacts(model_uri(store.uri, run_id, name),
                                                                     dst_path=str(Path(tmp) / name)))
                except ValueError:
                    continue
                program = next(local.rglob("*.pt2"))
                shutil.copy(program, out / f"{name}.pt2")
                files[name] = program
            ep = torch.export.load(str(files[ENCODER]))
            torch.save(backbone_state(dict(ep.state_dict)), out / "backbone.pt")
            config = store.client.download_artifacts(run_id, "config.yaml", tmp)
            shutil.copy(config, out / "config.yaml")
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)  # nothing half-written
            raise
    metrics = {k: v for k, v in sorted(run.data.metrics.items()) if not k.startswith("system/")}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    (out / "README.md").write_text(_readme(run, enc_uri, metrics, yaml.safe_load((out / "config.yaml").read_text()),
                                           has_classifier=(out / f"{CLASSIFIER}.pt2").exists()))
    return out


def _readme(run, enc_uri: str, metrics: dict, config: dict, has_classifier: bool) -> str:
    tags = run.data.tags
    model, data, moco = config.get("model", {}), config.get("data", {}), config.get("moco", {})
    optim = config.get("optim", {})
    pct = lambda k: f"{100 * metrics[k]:.2f}%" if k in metrics else "—"  # noqa: E731
    lines = [
        f"# MoCo encoder from run {tags.get('mocolab.run_name', run.info.run_name)}",
        "",
        f"MLflow run `{run.info.run_id}` (experiment {run.info.experiment_id}), model `{enc_uri}`, "
        f"code {tags.get('mlflow.source.git.commit', 'unknown')}"
        + (" with uncommitted changes" if tags.get(DIRTY_TAG) == "true" else "") + ".",
        "",
        f"Trained by MoCo (m = {moco.get('m')}, tau = {moco.get('tau')}, K = {config.get('queue', {}).get('size')}) "
        f"on {data.get('name')} for {optim.get('epochs')} epochs"
        + (f" (at most {optim['max_steps']} steps)" if optim.get("max_steps") else "")
        + f" at batch {optim.get('batch_size')}: "
        f"linear top-1 {pct('linear_top1')}, kNN top-1 {pct('knn_top1')}.",
        f"Backbone `{model.get('backbone')}` (width {model.get('width')}).",
        "",
        "## Files",
        "- `backbone.pt`: the backbone's state dict (`torch.load(..., weights_only=True)`), for",
        "  `mocolab.models.backbones.build_backbone(name, channels, width).load_state_dict(...)`.",
        "- `encoder.pt2`: images -> features, a `torch.export` program that needs torch only:",
        "  `torch.export.load('encoder.pt2').module()(images)`, images float32 in [0, 1], N x C x H x W",
        "  (normalisation is inside).",
    ]
    if has_classifier:
        lines.append("- `classifier.pt2`: images -> the linear probe's class logits, the same way.")
    lines += ["- `config.yaml`: the run's whole configuration; `metrics.json`: its final metrics.", ""]
    return "\n".join(lines)


def register_model(run_id: str, name: str, tracking_uri: str | None = None, *,
                   description: str = "") -> tuple[str, int]:
    """Register the run's encoder under ``name`` in the Model Registry; (name, version)."""
    store = Store(tracking_uri)
    uri = model_uri(store.uri, run_id, ENCODER)
    client = store.client
    with _tracking_uri(store.uri):  # the registry resolves models:/ URIs through the global URI
        try:
            client.get_registered_model(name)
        except Exception:  # noqa: BLE001 - MLflow raises RESOURCE_DOES_NOT_EXIST
            client.create_registered_model(name, description="MoCo encoders registered by mocolab")
        version = client.create_model_version(name, uri, run_id=run_id, description=description or None,
                                              model_id=uri.split("/", 1)[1].lstrip("/"))
    return name, int(version.version)


__all__ = ["CLASSIFIER", "ENCODER", "MODEL_URI_FORMS", "LoggedEncoder", "export_run", "fetch_encoder", "find_encoder",
           "load_encoder", "log_models", "model_uri", "register_model"]
