"""mocolab: Momentum Contrast experiments that run on a laptop and, unchanged, on a Ray cluster.

The method layer (moco, queue, norm, models, augment, data, evaluation, config)
is plain PyTorch; Ray and MLflow enter only at the edges.
"""

__version__ = "0.1.0"


def load_encoder(run_id: str, tracking_uri: str | None = None, name: str = "encoder"):
    """A finished run's encoder from MLflow as a torch module: float images in [0, 1] (N×C×H×W) -> features.

    ``name="classifier"`` gives the linear probe's logits instead. Loaded here on first use, so that
    ``import mocolab`` stays free of MLflow.
    """
    from .tracking.models import load_encoder as _load

    return _load(run_id, tracking_uri, name)
