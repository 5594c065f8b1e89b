"""The same W-rank DDP training under plain ``torchrun`` and under Ray Train, side by side in one run.

    .venv/bin/python benchmarks/trial/torchrun_vs_ray.py [--workers 2] [--steps 60] [--preset cpu-quick]

What a user would pick instead of Ray Train is ``torchrun`` with torch DDP
over gloo. Both arms run one function (``_ddp_steps.run``): build mocolab's
Trainer in the process group the launcher made, take ``--warmup`` steps,
then time ``--steps`` steps, saving a checkpoint every ``--report-every``
steps as a trial does at each epoch end (torchrun: ``torch.save`` to a
folder; Ray Train: ``ray.train.report`` with the checkpoint, which Ray
copies to the run's storage). Each rank gets ``cores / W`` threads in both.

Each launcher runs twice: with the checkpoints, and without any (``--report-every``
steps apart, then none), which separates what the checkpoint hand-off costs
from what the launcher's own processes cost. Printed per arm: time to the
first step (launcher start to rank 0's first step done: interpreters,
process group, data, models), steps/s over the timed steps, the per-step
overhead against torchrun with the same checkpoints, and the CPU the
launcher's own processes used while the ranks stepped (torchrun's agent;
Ray's driver, GCS, raylet and agents), in cores: on a machine whose cores
the ranks fill, that CPU is taken from them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _ddp_steps  # noqa: E402


def torchrun_arm(args: argparse.Namespace, out: Path, report_every: int) -> dict:
    env = {**os.environ, "LAUNCH_T": repr(time.time()), "OMP_NUM_THREADS": str(args.threads),
           "LAUNCHER_PID": str(os.getpid())}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.workers}",
           str(HERE / "_ddp_steps.py"), "--preset", args.preset, "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--report-every", str(report_every), "--threads", str(args.threads),
           "--out", str(out / "torchrun.json"), *[w for kv in args.set for w in ("--set", kv)]]
    subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    return json.loads((out / "torchrun.json").read_text())


def ray_arm(args: argparse.Namespace, out: Path, report_every: int) -> dict:
    launch = time.time()
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import cloudpickle

    cloudpickle.register_pickle_by_value(_ddp_steps)  # Ray's workers do not have benchmarks/ on their path
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        trainer = TorchTrainer(
            lambda config: _ddp_steps.run(**config),
            train_loop_config={"preset": args.preset, "steps": args.steps, "warmup": args.warmup,
                               "report_every": report_every, "threads": args.threads, "overrides": args.set,
                               "out": str(out / "ray.json"), "launch_t": launch, "launcher_pid": os.getpid(),
                               "ray": True},
            scaling_config=ScalingConfig(num_workers=args.workers, resources_per_worker={"CPU": args.threads}),
            run_config=RunConfig(name="torchrun-vs-ray", storage_path=str(out / "storage")))
        trainer.fit()
    finally:
        ray.shutdown()
    return json.loads((out / "ray.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60, help="timed steps per arm (after --warmup)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--report-every", type=int, default=20, help="steps between checkpoints (a trial: an epoch)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    if args.workers < 1 or args.steps < 1 or args.warmup < 0 or args.report_every < 1:
        ap.error("--workers, --steps and --report-every must be >= 1, --warmup >= 0")
    args.threads = max(1, (os.cpu_count() or 1) // args.workers)
    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}); preset {args.preset}, W = {args.workers} (gloo), "
          f"{args.threads} thread(s) a rank, {args.steps} steps timed after {args.warmup}, a checkpoint every "
          f"{args.report_every}")
    rows = []
    for every, what in ((args.report_every, f"checkpoint every {args.report_every}"), (0, "no checkpoint")):
        with tempfile.TemporaryDirectory() as tmp:
            torchrun = torchrun_arm(args, Path(tmp), every)
        with tempfile.TemporaryDirectory() as tmp:
            on_ray = ray_arm(args, Path(tmp), every)
        rows += [("torchrun + DDP", what, torchrun, torchrun), ("Ray Train", what, on_ray, torchrun)]
    print(f"{'arm':16s} {'checkpoints':22s} {'to first step s':>16s} {'steps/s':>8s} {'per-step overhead':>18s} "
          f"{'launcher CPU, cores':>20s}")
    for name, what, r, base in rows:
        print(f"{name:16s} {what:22s} {r['first_step_s']:16.1f} {r['steps_per_s']:8.3f} "
              f"{100 * (base['steps_per_s'] / r['steps_per_s'] - 1):+17.1f}% {r['others_cpu_per_s']:20.3f}")


if __name__ == "__main__":
    main()
