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

Each loads torch, Ray or MLflow on first use, so ``import mocolab`` stays light. The method layer (moco,
queue, norm, models, augment, data, evaluation, config) is plain PyTorch; Ray and MLflow enter only at
the edges.
"""

import importlib
import sys
import types

__version__ = "0.2.0"

_API = ("build_config", "train", "sweep", "load_encoder", "evaluate")
__all__ = ["__version__", *_API]


class _TrainPackage(types.ModuleType):
    """``mocolab.train`` names both the subpackage (``mocolab.train.fit``, ``mocolab.train.launch``) and the API
    function: the subpackage, made callable as ``api.train``."""

    def __call__(self, *args, **kwargs):
        from .api import train

        return train(*args, **kwargs)


class _Package(types.ModuleType):
    """The import system binds a subpackage to its parent's attribute when it loads; for ``train`` it binds
    the callable form, whichever import comes first."""

    def __setattr__(self, name: str, value) -> None:
        if name == "train" and type(value) is types.ModuleType:
            value.__class__ = _TrainPackage
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name == "train":
        return importlib.import_module(".train", __name__)  # bound above as the callable subpackage
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
