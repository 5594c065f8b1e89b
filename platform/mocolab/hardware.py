"""Where a run computes and in which precision: ``run.device`` and ``run.precision``."""

from __future__ import annotations

import torch

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "auto")


def resolve_precision(name: str, device: torch.device) -> torch.dtype | None:
    """None for float32; bfloat16 for 'bf16', or for 'auto' where the hardware computes it natively
    (AVX-512 BF16 / AMX on CPU, Ampere+ on GPU) - elsewhere emulated bf16 would be slower than fp32."""
    if name not in PRECISIONS:
        raise ValueError(f"run.precision: unknown value {name!r}; choose one of {list(PRECISIONS)}")
    if name == "fp32":
        return None
    if name == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    try:
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        native = False
    return torch.bfloat16 if native else None


def resolve_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise ValueError(f"run.device: unknown value {name!r}; choose one of {list(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("run.device: 'cuda' was asked for but no GPU is visible; use 'auto' or 'cpu'")
    return torch.device(name)
