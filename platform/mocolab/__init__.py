"""mocolab: Momentum Contrast experiments that run on a laptop and, unchanged, on a Ray cluster.

The method layer (moco, queue, norm, models, augment, data, evaluation, config)
is plain PyTorch; Ray and MLflow enter only at the edges.
"""

__version__ = "0.1.0"
