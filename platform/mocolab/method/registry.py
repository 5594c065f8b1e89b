"""The one place that picks a method for a config: a registry of the methods method/protocol.py describes.

``build_method`` picks by ``moco.version`` where the version names a method of
its own (v3), else by ``moco.negatives``.  Adding a method (BYOL, say) is one
file with its module and a ``from_config(cfg, parts)``, one line in
``METHODS`` and its name in config/choices.py; tests/method/test_method_contract.py then checks it
with the other four.
"""

from __future__ import annotations

from typing import Callable

from mocolab.config import Config
from mocolab.method.protocol import Method, MethodParts
from mocolab.method.moco import MoCo, MoCoV3
from mocolab.method.negative_sources import InBatchContrast, MemoryBankContrast

__all__ = ["METHODS", "build_method", "method_name"]

# name -> builder; one line a method
METHODS: dict[str, Callable[[Config, MethodParts], Method]] = {
    "queue": MoCo.from_config,  # method/moco.py: v1 and v2
    "v3": MoCoV3.from_config,  # method/moco.py
    "memory_bank": MemoryBankContrast.from_config,  # negatives.py
    "in_batch": InBatchContrast.from_config,  # negatives.py
}


def method_name(cfg: Config) -> str:
    """The registry's name for a config: ``moco.version`` where it names a method (v3), else ``moco.negatives``
    (v1 and v2 differ in their recipe, not their algorithm)."""
    return cfg.moco.version if cfg.moco.version in METHODS else cfg.moco.negatives


def build_method(cfg: Config, parts: MethodParts) -> Method:
    """The method the config asks for, on the CPU (the trainer moves it)."""
    name = method_name(cfg)
    if name not in METHODS:
        raise ValueError(f"moco.negatives: {name!r} names no method; allowed {', '.join(METHODS)}")
    return METHODS[name](cfg, parts)
