"""The one place that picks a method for a config: the built-in methods, and plugins from outside the package.

``build_method`` builds the method ``method.name`` names where it is set (method/plugins.py: mocolab's own
``supervised``, an installed entry point of the group ``mocolab.methods``, or a ``module:Class`` path), else
a built-in: by
``moco.version`` where the version names a method of its own (v3), else by ``moco.negatives``.  Every method
implements the protocol of method/protocol.py, and tests/method/test_method_contract.py checks each, the
installed plugins with the built-ins.

A method of your own needs no change here: write it as a plugin (docs/methods.md, "Your own method";
examples/plugins/mocolab-byol is one).  A new built-in is one file with its module and a
``from_config(cfg, parts)``, one line in ``METHODS`` and its name in config/choices.py.
"""

from __future__ import annotations

from typing import Callable

from mocolab.config import Config
from mocolab.method import plugins
from mocolab.method.protocol import Method, MethodParts
from mocolab.method.moco import BatchKeysMoCo, MoCo, MoCoV3
from mocolab.method.negative_sources import InBatchContrast, MemoryBankContrast

__all__ = ["METHODS", "build_method", "method_name"]

# name -> builder; one line a method
METHODS: dict[str, Callable[[Config, MethodParts], Method]] = {
    "queue": MoCo.from_config,  # method/moco.py: v1 and v2
    "v3": MoCoV3.from_config,  # method/moco.py
    "memory_bank": MemoryBankContrast.from_config,  # negative_sources.py
    "in_batch": InBatchContrast.from_config,  # negative_sources.py
    "batch_keys": BatchKeysMoCo.from_config,  # method/moco.py: v2 without its queue (a control)
}


def method_name(cfg: Config) -> str:
    """The method a config asks for: its plugin (``method.name``) where it names one, else the built-in's name,
    ``moco.version`` where it names a method (v3), else ``moco.negatives`` (v1 and v2 differ in their recipe,
    not their algorithm)."""
    if cfg.method.name:
        return cfg.method.name
    return cfg.moco.version if cfg.moco.version in METHODS else cfg.moco.negatives


def build_method(cfg: Config, parts: MethodParts) -> Method:
    """The method the config asks for, on the CPU (the trainer moves it)."""
    if cfg.method.name:
        return plugins.load(cfg.method.name).build(cfg, parts)
    name = method_name(cfg)
    if name not in METHODS:
        raise ValueError(f"moco.negatives: {name!r} names no method; allowed {', '.join(METHODS)}")
    return METHODS[name](cfg, parts)
