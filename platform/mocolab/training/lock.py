"""One writer per run and per sweep: an exclusive lock held by a live process.

Two invocations with the same run or sweep name would interleave checkpoints
and MLflow writes.  The lock is ``fcntl.flock`` on ``<folder>/.lock``: the
kernel releases it when the holder dies, however it dies, so a lock can never
be left behind by a crash.  The file also records who holds it (pid, host,
command, since when) so that the refused invocation can say so, and so that
the next holder can say whose lock it took over when the last one died
without releasing it.  On network file systems without flock support the
lock degrades to that record alone (documented in docs/training.md).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable


class InUseError(ValueError):
    """Another live process holds the run or sweep (a user error: exit 2, no traceback)."""


class NameLock:
    """``with NameLock(folder, "run 'x'"):`` -- exclusive for the life of the block (or of the process)."""

    def __init__(self, folder: str | os.PathLike[str], what: str, say: Callable[[str], None] = print) -> None:
        self.path = Path(folder) / ".lock"
        self.what, self.say = what, say
        self._fh = None

    def acquire(self) -> "NameLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fh)
            fh.close()
            who = (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')} "
                   f"({holder.get('command', '?')})") if holder else "another process"
            raise InUseError(f"{self.what} is in use by {who}; wait for it to end, stop it, or use another "
                             f"name (lock: {self.path})") from None
        previous = _read(fh)
        if previous and not previous.get("released"):
            self.say(f"{self.what}: taking over the lock of pid {previous.get('pid')} on {previous.get('host')} "
                     f"(since {previous.get('since')}), which ended without releasing it")
        fh.seek(0)
        fh.truncate()
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)[:300],
                   "since": time.strftime("%Y-%m-%d %H:%M:%S")}, fh)
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is None:
            return
        fh, self._fh = self._fh, None
        try:
            record = _read(fh)
            record["released"] = True
            fh.seek(0)
            fh.truncate()
            json.dump(record, fh)
            fh.flush()
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()

    def __enter__(self) -> "NameLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(fh) -> dict:
    fh.seek(0)
    text = fh.read()
    try:
        record = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}
    return record if isinstance(record, dict) else {}
