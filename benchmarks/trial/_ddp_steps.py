"""One rank of benchmarks/trial/torchrun_vs_ray.py: mocolab's Trainer stepping in the process group it was given.

Run by ``torchrun`` as a script (it makes the gloo group from torchrun's environment), or called as
``run(...)`` inside a Ray Train worker (Ray Train made the group). Rank 0 writes the timings as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def others_cpu_s(launcher_pid: int, ranks: set[int]) -> float:
    """CPU seconds used so far by the launcher and every process below it except the ranks: what the launcher
    (torchrun's agent; Ray's driver, GCS, raylet and agents) takes from the cores the ranks compute on."""
    import psutil

    try:
        launcher = psutil.Process(launcher_pid)
        procs = [launcher, *launcher.children(recursive=True)]
    except psutil.Error:
        return float("nan")
    total = 0.0
    for proc in procs:
        if proc.pid in ranks:
            continue
        try:
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:  # gone between the listing and the reading
            pass
    return total


def run(preset: str, steps: int, warmup: int, report_every: int, threads: int, overrides: list[str], out: str,
        launch_t: float, launcher_pid: int, ray: bool = False) -> None:
    import torch
    import torch.distributed as dist

    from mocolab.config import build_config, parse_overrides
    from mocolab.training.trainer import Trainer

    torch.set_num_threads(threads)
    world = dist.get_world_size() if dist.is_initialized() else 1
    cfg = build_config(preset, {**parse_overrides(overrides), "run.num_workers": world,
                                "run.cpus_per_worker": float(threads)})
    tr = Trainer(cfg)
    batches = iter(tr.data.epoch(tr.epoch_order(0), tr.batch, tr.rank, tr.world_size, 0))
    first = None
    for _ in range(max(warmup, 1)):
        tr.train_step(next(batches), None, tr.schedule.momentum(tr.step))
        first = first or time.time() - launch_t
    ranks = [os.getpid()]
    if dist.is_initialized():
        ranks = [None] * world
        dist.all_gather_object(ranks, os.getpid())
    with tempfile.TemporaryDirectory() as folder:
        cpu0 = others_cpu_s(launcher_pid, set(ranks))
        t0 = time.perf_counter()
        for i in range(1, steps + 1):
            try:
                images = next(batches)
            except StopIteration:
                batches = iter(tr.data.epoch(tr.epoch_order(tr.epoch + 1), tr.batch, tr.rank, tr.world_size, 0))
                images = next(batches)
            tr.train_step(images, None, tr.schedule.momentum(tr.step))
            if report_every and i % report_every == 0:
                path = os.path.join(folder, f"rank{tr.rank}.pt")
                torch.save(tr.state_dict(), path)
                if ray:
                    import ray.train

                    ray.train.report({"step": tr.step}, checkpoint=ray.train.Checkpoint.from_directory(folder))
                elif dist.is_initialized():
                    dist.barrier()
        seconds = time.perf_counter() - t0
        cpu = others_cpu_s(launcher_pid, set(ranks)) - cpu0
    if tr.rank == 0:
        with open(out, "w") as f:
            json.dump({"first_step_s": first, "steps_per_s": steps / seconds, "others_cpu_per_s": cpu / seconds}, f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, required=True)
    ap.add_argument("--report-every", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    import torch.distributed as dist

    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    try:
        run(args.preset, args.steps, args.warmup, args.report_every, args.threads, args.set, args.out,
            float(os.environ["LAUNCH_T"]), int(os.environ["LAUNCHER_PID"]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
