"""How a mocolab command ends: with its exit status, and without walking the whole heap first.

At interpreter exit Python runs a last cyclic garbage collection over every object the process still
holds. After torch, Ray and MLflow are loaded and a run has trained, that walk takes seconds on a small
machine (a short `mocolab train` would spend as long ending as evaluating) and frees nothing the end of
the process would not. ``gc.freeze()`` moves the live objects where that collection does not look;
atexit handlers, stream flushes and plain reference-count finalisers still run.
"""

from __future__ import annotations

import gc
import sys
from typing import NoReturn


def exit_now(status: int | None) -> NoReturn:
    """``sys.exit(status)`` for a command's entry point; never call it from code a longer process imports."""
    gc.freeze()
    sys.exit(status)


__all__ = ["exit_now"]
