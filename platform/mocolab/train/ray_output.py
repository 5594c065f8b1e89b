"""What of Ray's own output reaches the terminal of `mocolab train` (all of it stays in Ray's log files).

Ray forwards every actor's output to the driver. Ray Train's helpers print what is not the user's problem:
each report a worker sends, the worker group they start, a core-worker note about where an actor's arguments
live, and, with a second Ray on the machine (another study, a notebook), a traceback from the placement-group
cleaner, which cannot tell which of the local Rays is its own and stops watching. Our workers' own lines (the
progress, the evaluation, errors) still come through; ``--verbose`` prints Ray's too.
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
HANDLER = "ray_print_logs"  # the name Ray's driver gives its printer of worker output


def keep(batch: dict) -> dict | None:
    """The batch of forwarded lines as the terminal should see it; None when nothing in it is ours."""
    if batch.get("actor_name") in HELPER_ACTORS:
        return None
    lines = [line for line in batch.get("lines", []) if not QUIET_LINES.search(line)]
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
