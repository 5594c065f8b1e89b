"""mocolab: Momentum Contrast experiments that run on a laptop and, unchanged, on a Ray cluster.

The Python API (``mocolab.api``; what the ``mocolab`` command calls):

- ``build_config(preset, overrides, config_file=None)``: a validated Config, as ``--preset``, ``--config``
  and ``--set`` build it.
- ``train(config_or_preset, overrides, tracking_uri=None, in_process=False)``: one run, as ``mocolab train``;
  returns its outcome (``mlflow_run_id``, ``linear_top1``, ``knn_top1``, ...).
- ``sweep(grid, preset=..., seeds=1, search="grid")``: a Ray Tune sweep over any config fields, as
  ``mocolab sweep``: a parent MLflow run with one child run per trial, resumed by the same call.
- ``load_encoder(run_id | models:/ URI | export folder)``: the trained encoder as a torch module, float
  images in [0, 1] -> features.
- ``evaluate(source, data)``: kNN and linear probe of a trained encoder on any supported data set (a
  transfer test), logged as an MLflow run tagged with the source run.

Each loads torch, Ray or MLflow on first use, so ``import mocolab`` stays light. ``method/``, ``models/``,
``data/``, ``config/``, the loop in ``training/`` and the kNN and probe of ``evaluation/`` are plain PyTorch;
Ray and MLflow enter only at the edges (``training/``'s launch and worker, ``tune/``, ``tracking/``).
"""

_API = ("build_config", "train", "sweep", "load_encoder", "evaluate")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name == "__version__":  # pyproject.toml's, read on first use
        from mocolab.config.manifest import mocolab_version

        return mocolab_version()
    if name in _API:
        from mocolab import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
