"""Evaluation in full float32: training may trade float32 matrix products for TF32 (``config/hardware.py``
turns it on for a GPU run), but the kNN and the L-BFGS probe (tolerance 1e-12) must score the same features
the same way on a GPU and a CPU, so every evaluation entry point runs inside ``full_fp32``."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

__all__ = ["full_fp32", "precision_flags"]


def _matmul_precision() -> str | None:
    """torch's float32 matmul precision; None where its backends were set apart (torch then refuses to say)."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:  # torch >= 2.9: the legacy and per-backend TF32 settings were mixed
        return None


def precision_flags() -> tuple[str | None, bool, bool]:
    """(float32 matmul precision, cuBLAS TF32, cuDNN TF32): process-wide, so readable on any device."""
    return _matmul_precision(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@contextmanager
def full_fp32() -> Iterator[None]:
    """Float32 products in IEEE float32 (no TF32, no reduced-precision CPU kernels) inside, the caller's
    settings restored after, also on an error.  Also a decorator.  Autocast is left alone: a backbone that
    runs at the run's precision (``run.precision``) keeps doing so; what reads its features is float32.

    Only torch's legacy setters are used, each flag set back only where it differs: in torch 2.14 a legacy
    setter over a state the per-backend API made (``set_float32_matmul_precision("medium")`` then
    ``allow_tf32``) leaves a state torch refuses to read back.
    """
    precision, matmul_tf32, cudnn_tf32 = precision_flags()
    if precision is not None:
        torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        if precision is not None:
            torch.set_float32_matmul_precision(precision)  # also sets cuBLAS TF32 as that precision implies
        if torch.backends.cuda.matmul.allow_tf32 != matmul_tf32:
            torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        if torch.backends.cudnn.allow_tf32 != cudnn_tf32:
            torch.backends.cudnn.allow_tf32 = cudnn_tf32
