"""Ctrl-C and SIGTERM end a run or sweep through its cleanup, never around it.

Python turns SIGINT into KeyboardInterrupt but lets SIGTERM kill the process
outright, skipping every ``finally``: MLflow runs would stay RUNNING.  Inside
``closing_on_signals()`` both raise ``Interrupted`` (a KeyboardInterrupt) in
the main thread, once; a second signal while the cleanup runs is reported
and ignored, so "Ctrl-C twice" still closes what was opened (SIGKILL remains
the way to stop at once).  Ray Tune's own SIGINT handler is switched off for
the same reason: the driver, not Tune, decides what an interrupt means.
"""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from typing import Iterator


_ACTIVE: list = []  # the handler of the innermost closing_on_signals block, if any
_RECEIVED: list[int] = []  # signals received inside such a block (libraries may re-raise a plain KeyboardInterrupt)


class Interrupted(KeyboardInterrupt):
    """The user stopped the process (Ctrl-C or SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def closing_on_signals() -> Iterator[None]:
    """Within the block, the first SIGINT/SIGTERM raises ``Interrupted``; later ones wait for the cleanup."""
    tune_handler = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    state = {"fired": False}

    def handler(signum, frame):  # noqa: ARG001 - signal handler signature
        if state["fired"]:
            print(f"\n{signal.Signals(signum).name} again: still closing runs and saving state; "
                  f"send SIGKILL to stop at once", file=sys.stderr, flush=True)
            return
        state["fired"] = True
        _RECEIVED.append(signum)
        print(f"\n{signal.Signals(signum).name}: stopping; closing the runs this process opened ...",
              file=sys.stderr, flush=True)
        raise Interrupted(signum)

    for s in previous:
        signal.signal(s, handler)
    _ACTIVE.append(handler)
    try:
        yield
    finally:
        _ACTIVE.remove(handler)
        for s, h in previous.items():
            signal.signal(s, h)
        if tune_handler is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = tune_handler


def reassert() -> None:
    """Install the active handler again: ``ray.init`` puts a C++ SIGTERM handler in its place (it aborts)."""
    if _ACTIVE:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _ACTIVE[-1])


def exit_code(err: BaseException) -> int:
    """128 + the signal number, as a shell reports a process ended by that signal."""
    if isinstance(err, Interrupted):
        return 128 + err.signum
    return 128 + (_RECEIVED[-1] if _RECEIVED else signal.SIGINT)
