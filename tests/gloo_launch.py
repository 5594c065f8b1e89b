"""The gloo launcher of the distributed tests: a module-level function run on W fresh CPU processes.

``launch(fn, world, tmp_path, *args)`` runs ``fn(rank, world, *args)`` on every rank of a real gloo process
group (no mocks); each rank writes its result to tmp_path and reports success or its traceback through a
queue, so a failing rank fails the test. ``fn`` must be a module-level function of a test module (the rank
processes import it by name).

The ranks are forked from a multiprocessing forkserver, one per test worker, that has torch and the
distributed layers imported: a spawned rank spent its first seconds importing them, for each of the suite's
few dozen ranks. The server is a clean single-threaded interpreter (no test has run in it), so each rank
starts as a spawned one would, with its imports done.

Under mutmut's stats run (``make mutate``, tests/mutate.py), the functions the ranks call count for the test
that launched them: mutmut records a call in the process that makes it, and most of method/'s distributed code
runs only in ranks, so without this every mutant of it would have no test to face.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_mod
import socket
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 120.0
STATS = "stats"  # mutmut's MUTANT_UNDER_TEST while it records which functions each test calls
# what the forkserver imports once, for every rank it forks
PRELOAD = ["torch", "torch.distributed", "torch.nn.functional", "mocolab.method.collectives", "mocolab.method.moco",
           "mocolab.training.trainer"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(fn, rank: int, world: int, port: int, out_dir: str, args: tuple, reports,
           collective_timeout: float = 60.0) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=collective_timeout))
        try:
            result = fn(rank, world, *args)
            torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
            if os.environ.get("MUTANT_UNDER_TEST") == STATS:
                _save_calls(os.path.join(out_dir, f"rank{rank}.calls"))
        finally:
            dist.destroy_process_group()
        reports.put(("ok", rank, ""))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        reports.put(("error", rank, traceback.format_exc()))


def _save_calls(path: str) -> None:
    """The mutated functions this rank called, as mutmut recorded them here."""
    import mutmut  # only under mutmut, which installs it

    with open(path, "w", encoding="utf-8") as f:  # mutmut's names hold 'ǁ'
        f.write("\n".join(sorted(mutmut.state()._stats)))


def _count_calls(tmp_path, world: int) -> None:
    """The ranks' recorded calls added to this process's, so mutmut credits them to the running test."""
    import mutmut

    for r in range(world):
        mutmut.state()._stats.update((tmp_path / f"rank{r}.calls").read_text(encoding="utf-8").split())


def launch(fn, world: int, tmp_path, *args, timeout: float = TIMEOUT_S, collective_timeout: float = 60.0) -> list:
    """Run ``fn(rank, world, *args)`` in ``world`` gloo processes; return their results by rank.
    ``collective_timeout``: how long a rank waits in a collective before the process group gives up.

    Fails the test on the first rank that raises (with its traceback), on a
    rank that dies without reporting, and on timeout.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    reports = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, str(tmp_path), args, reports, collective_timeout),
                         daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    done: set[int] = set()
    try:
        while len(done) < world:
            try:
                status, rank, text = reports.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if r not in done and p.exitcode not in (None, 0)]
                if dead:
                    pytest.fail(f"rank(s) {dead} died without reporting (exit codes "
                                f"{[procs[r].exitcode for r in dead]})")
                if time.monotonic() > deadline:
                    pytest.fail(f"timed out after {timeout:.0f} s; ranks done: {sorted(done)}")
                continue
            if status != "ok":
                pytest.fail(f"rank {rank} of {world} failed:\n{text}")
            done.add(rank)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    if os.environ.get("MUTANT_UNDER_TEST") == STATS:
        _count_calls(tmp_path, world)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
