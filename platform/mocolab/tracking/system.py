"""Machine metrics of every worker node, into the run: MLflow's own system-metrics monitor.

One monitor per node, started by the lowest rank there, so a node's CPU,
memory, disk, network (and, with ``nvidia-ml-py`` and a GPU, GPU utilisation
and memory) are sampled where the work runs, not where the trial's driver
waits. A single-node run logs MLflow's plain keys (``system/cpu_utilization_percentage``,
what the UI's system-metrics tab and cross-run charts expect); with several
nodes each logs under ``system/node<i>/``, node<i> being the node of the
i-th distinct rank in rank order (the run's tag ``mocolab.worker_nodes`` maps
them to Ray node ids). MLflow's GPU monitor reads every GPU of the node; a
run's monitor keeps only the GPUs Ray gave the run (``CUDA_VISIBLE_DEVICES``,
which Ray Train shares among a node's workers), numbered as the run's
processes see them (``gpu_0`` is their ``cuda:0``), so concurrent trials on
one node do not log each other's GPUs.
"""

from __future__ import annotations

import logging
import os
from typing import Any


def node_labels(nodes: list[str]) -> tuple[list[str | None], list[bool]]:
    """Per rank: (its node's label, whether it runs that node's monitor); labels are None on one node."""
    order: dict[str, int] = {}
    for node in nodes:
        order.setdefault(node, len(order))
    single = len(order) == 1
    seen: set[str] = set()
    labels, leaders = [], []
    for node in nodes:
        labels.append(None if single else f"node{order[node]}")
        leaders.append(node not in seen)
        seen.add(node)
    return labels, leaders


def given_gpus(visible: str | None, count: int) -> list[int | str] | None:
    """The node's GPUs this process was given, as CUDA reads ``CUDA_VISIBLE_DEVICES`` (``visible``): indices
    below ``count`` or UUIDs (``GPU-...``, ``MIG-...``), up to the first entry that is neither, each once. None
    where it is unset (a process outside Ray: the node's every GPU); ``""`` gives none, as Ray sets it for a
    process it gave no GPU. An index is NVML's (PCI bus order), which is CUDA's on a node of one kind of GPU."""
    if visible is None:
        return None
    out: list[int | str] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.startswith(("GPU-", "MIG-")):
            chosen: int | str = entry
        elif entry.isdigit() and int(entry) < count:
            chosen = int(entry)
        else:
            break
        if chosen not in out:
            out.append(chosen)
    return out


def _only_given_gpus(monitor: Any, visible: str | None) -> None:
    """Narrow MLflow's GPU monitor (if it started: nvidia-ml-py and a GPU) to ``given_gpus``; none given, drop it."""
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

    for gpus in [m for m in monitor.monitors if isinstance(m, GPUMonitor)]:  # NVIDIA's (an AMD node's is left whole)
        chosen = given_gpus(visible, gpus.num_gpus)
        if chosen is None:
            continue
        import pynvml

        gpus.gpu_handles = [pynvml.nvmlDeviceGetHandleByIndex(g) if isinstance(g, int)
                            else pynvml.nvmlDeviceGetHandleByUUID(g) for g in chosen]
        gpus.num_gpus = len(chosen)
        if not chosen:
            monitor.monitors.remove(gpus)


def start_monitor(uri: str, run_id: str, interval_s: float, node: str | None) -> Any | None:
    """A running ``SystemMetricsMonitor`` (steps continue after a resume), or None when off or it cannot start."""
    if interval_s <= 0:
        return None
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter per run
        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=True, node_id=node,
                                       tracking_uri=uri)
        _only_given_gpus(monitor, os.environ.get("CUDA_VISIBLE_DEVICES"))
        monitor.start()
        return monitor
    except Exception as err:  # noqa: BLE001 - machine metrics are not worth failing a run for
        print(f"MLflow: system metrics are off for this run ({type(err).__name__}: {err})")
        return None


def stop_monitor(monitor: Any | None) -> None:
    if monitor is not None:
        try:
            monitor.finish()
        except Exception:  # noqa: BLE001
            pass
