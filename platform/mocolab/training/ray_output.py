"""What of Ray's own output reaches the terminal of `mocolab train` (all of it stays in Ray's log files).

Ray forwards every actor's output to the driver. Ray Train's helpers print what is not the user's problem:
each report a worker sends, the worker group they start, a core-worker note about where an actor's arguments
live, and, with a second Ray on the machine (another study, a notebook), a traceback from the placement-group
cleaner, which cannot tell which of the local Rays is its own and stops watching. On a busy machine the
controller also logs a traceback when that cleaner takes longer than its fixed 12 s to stop at the end of a
run, which changes nothing of the run, and another each time its autoscaling client's request for the
workers' resources times out (Ray's own line calls that safe to ignore on an overloaded CPU). Our workers'
own lines (the progress, the evaluation, errors) still come through; ``--verbose`` prints Ray's too.
"""

from __future__ import annotations

import re
from typing import Callable

# actors whose every line is Ray Train's business
HELPER_ACTORS = frozenset({"PlacementGroupCleaner"})
# lines of Ray Train's controller and workers that say what Ray did, not what the run did
QUIET_LINES = re.compile("|".join([
    r"Reporting training result \d+",
    r"Progress bars disabled",
    r"Requesting resources: ",
    r"Attempting to start training worker group",
    r"Started training worker group",
    r"- \(ip=\S+, pid=\d+\) world_rank=\d+",
    r"Setting up process group for",
    r"has constructor arguments in the object store",
    r"Failed to query Ray Train Controller actor state",
]))
# a line that opens a logged traceback about Ray Train's own helper, dropped up to the exception's line
QUIET_TRACEBACKS = re.compile(r"Failed to stop PlacementGroupCleaner gracefully|Failed to send resource request for ")
_TRACEBACK_BODY = re.compile(r"^(Traceback \(most recent call last\):|\s|During handling|The above exception|$)")
HANDLER = "ray_print_logs"  # the name Ray's driver gives its printer of worker output


# (ip, pid) of processes in the middle of a quiet traceback: a traceback may span two forwarded batches
_in_traceback: set[tuple[str, int]] = set()


def keep(batch: dict) -> dict | None:
    """The batch of forwarded lines as the terminal should see it; None when nothing in it is ours."""
    if batch.get("actor_name") in HELPER_ACTORS:
        return None
    source = (batch.get("ip", ""), batch.get("pid", 0))
    lines = []
    for line in batch.get("lines", []):
        if source in _in_traceback:
            if not _TRACEBACK_BODY.match(line):  # the exception's own line ends the traceback
                _in_traceback.discard(source)
            continue
        if QUIET_TRACEBACKS.search(line):
            _in_traceback.add(source)
        elif not QUIET_LINES.search(line):
            lines.append(line)
    return {**batch, "lines": lines} if lines else None


def quiet_driver_output() -> bool:
    """Filter what Ray forwards to this driver's terminal through ``keep``; False where Ray prints nothing here.

    Ray offers no public filter by actor, so this wraps the printer its driver registers (Ray 2.x's
    stdstream dispatcher); a Ray without it leaves the output as it was. Calling it twice wraps once.
    """
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    printer = next((h for name, h in dispatcher.handlers if name == HANDLER), None)
    if printer is None:
        return False
    if getattr(printer, "mocolab_quiet", False):
        return True
    dispatcher.remove_handler(HANDLER)
    dispatcher.add_handler(HANDLER, _filtered(printer))
    return True


def _filtered(printer: Callable[[dict], None]) -> Callable[[dict], None]:
    def handle(batch: dict) -> None:
        kept = keep(batch)
        if kept is not None:
            printer(kept)

    handle.mocolab_quiet = True  # type: ignore[attr-defined]
    return handle
