"""Can the cluster ever place this request?  Asked before any MLflow run or trial starts.

Ray does not refuse an infeasible request: the Train controller retries the
worker group forever and Tune keeps trials PENDING.  So the request is
checked here against the live nodes' totals: a GPU on a CPU-only cluster,
more CPUs per worker than any node has, more workers than the nodes hold.
"""

from __future__ import annotations

import math

# What a sweep's trial reserves for its own function beside its workers: it only waits on its Train run.
TRIAL_DRIVER_CPUS = 0.05
# How a run asks for no GPU, in the config's words (`mocolab train`; a sweep has a flag of its own)
RUN_NO_GPU = "--set run.gpus_per_worker=0 (with run.device auto or cpu)"


def threads_for(cpus_per_worker: float) -> int:
    """torch threads for a worker granted this many Ray CPUs: its whole cores, with a trial driver's sliver
    counted back.  A worker that reserves 1.95 CPU so that its trial's driver fits beside it on two cores
    computes on 2 threads, not 1; 0.95 and 0.5 compute on 1."""
    return max(1, math.floor(cpus_per_worker + TRIAL_DRIVER_CPUS + 1e-9))






def node_capacities() -> list[dict[str, float]]:
    """Total CPU and GPU of every live node of the connected Ray."""
    import ray

    return [{"CPU": float(n.get("Resources", {}).get("CPU", 0.0)), "GPU": float(n.get("Resources", {}).get("GPU", 0.0))}
            for n in ray.nodes() if n.get("Alive")]


def check_placement(workers: int, cpus_per_worker: float, gpus_per_worker: float, *, extra_cpus: float = 0.0,
                    nodes: list[dict[str, float]] | None = None, what: str = "run", placement: str = "pack",
                    no_gpu: str = RUN_NO_GPU) -> None:
    """Raise ValueError, naming what was asked and what exists, if ``workers`` workers of
    (``cpus_per_worker`` CPU, ``gpus_per_worker`` GPU) plus ``extra_cpus`` can never be placed. ``no_gpu``: how
    the command that asked asks for no GPU, which the refusal of a GPU advises."""
    if cpus_per_worker <= 0:
        raise ValueError(f"run.cpus_per_worker: {cpus_per_worker} must be > 0")
    if gpus_per_worker < 0:
        raise ValueError(f"run.gpus_per_worker: {gpus_per_worker} must be >= 0")
    nodes = node_capacities() if nodes is None else nodes
    have = ", ".join(f"node {i}: {n['CPU']:g} CPU, {n['GPU']:g} GPU" for i, n in enumerate(nodes)) or "no live node"
    asked = (f"{what} asks for {workers} worker(s) x ({cpus_per_worker:g} CPU, {gpus_per_worker:g} GPU)"
             + (f" + {extra_cpus:g} CPU for its driver" if extra_cpus else ""))
    if gpus_per_worker > 0 and not any(n["GPU"] >= gpus_per_worker for n in nodes):
        raise ValueError(f"{asked}, but no node has {gpus_per_worker:g} GPU ({have}); "
                         f"on a CPU-only cluster ask for none: {no_gpu}")
    if not any(n["CPU"] >= cpus_per_worker for n in nodes):
        raise ValueError(f"{asked}, but no node has {cpus_per_worker:g} CPU ({have}); lower run.cpus_per_worker")
    fit = 0
    for n in nodes:
        by_cpu = math.floor(n["CPU"] / cpus_per_worker + 1e-9)
        by_gpu = math.floor(n["GPU"] / gpus_per_worker + 1e-9) if gpus_per_worker > 0 else by_cpu
        fit += min(by_cpu, by_gpu)
    if placement == "strict_spread":  # one worker per node, never two: the nodes that take one must suffice
        hosts = sum(1 for n in nodes if n["CPU"] >= cpus_per_worker - 1e-9
                    and (gpus_per_worker <= 0 or n["GPU"] >= gpus_per_worker - 1e-9))
        if hosts < workers:
            raise ValueError(f"{asked} with run.placement=strict_spread (one per node), but only {hosts} node(s) "
                             f"can take one ({have}); use run.placement=spread or add nodes")
    total_cpu = sum(n["CPU"] for n in nodes)
    if fit < workers or workers * cpus_per_worker + extra_cpus > total_cpu + 1e-9:
        raise ValueError(f"{asked}, but the cluster can place at most {fit} such worker(s) ({have}); "
                         f"use fewer workers or fewer CPUs per worker")


def worker_gpus(device: str, gpus_per_worker: float, workers: int, nodes: list[dict[str, float]]) -> float:
    """The GPUs each Ray worker asks for: the one place where the Ray path turns ``run.device`` into a
    request.  Ray hides every GPU from a worker it gave none, so a worker cannot find one by itself.

    ``cuda``: ``run.gpus_per_worker``, 1 where it is 0, and refused on a cluster without GPUs; ``auto``: the
    same where any live node has a GPU, else none; ``cpu``: none (GPUs asked for beside it are refused).
    Several NCCL ranks need a whole GPU each, so a fraction is refused with more than one worker.
    """
    if device == "cpu":
        if gpus_per_worker > 0:
            raise ValueError(f"run.device: 'cpu' with run.gpus_per_worker={gpus_per_worker:g} would hold GPUs and "
                             f"not use them; set run.gpus_per_worker=0 or run.device=auto")
        return 0.0
    has_gpu = any(n.get("GPU", 0.0) >= 1.0 for n in nodes)
    if gpus_per_worker <= 0:
        if device == "cuda" and not has_gpu:
            have = ", ".join(f"node {i}: {n.get('GPU', 0.0):g} GPU" for i, n in enumerate(nodes)) or "no live node"
            raise ValueError(f"run.device: 'cuda' was asked for, but no node of the Ray cluster has a GPU ({have}); "
                             f"use run.device=auto or run.device=cpu")
        gpus_per_worker = 1.0 if has_gpu else 0.0
    if workers > 1 and gpus_per_worker != int(gpus_per_worker):
        raise ValueError(f"run.gpus_per_worker: {gpus_per_worker:g} with run.num_workers={workers} would put two "
                         f"NCCL ranks on one GPU, which NCCL refuses; allowed: whole GPUs (one a rank) with several "
                         f"workers, a fraction with one")
    return gpus_per_worker


# Reported with every result: the placement group a run's workers hold, so a sweep can give its CPUs back
# when Tune stops the trial (tune/release.py).
PG_KEY = "worker_placement_group"


def current_placement_group() -> str:
    """The hex id of the placement group this worker runs in ('' outside one)."""
    from ray.util import get_current_placement_group

    pg = get_current_placement_group()
    return pg.id.hex() if pg is not None else ""
