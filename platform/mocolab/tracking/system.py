"""Machine metrics of every worker node, into the run: MLflow's own system-metrics monitor.

One monitor per node, started by the lowest rank there, so a node's CPU,
memory, disk, network (and, with ``nvidia-ml-py`` and a GPU, GPU utilisation
and memory) are sampled where the work runs, not where the trial's driver
waits. A single-node run logs MLflow's plain keys (``system/cpu_utilization_percentage``,
what the UI's system-metrics tab and cross-run charts expect); with several
nodes each logs under ``system/node<i>/``, node<i> being the node of the
i-th distinct rank in rank order (the run's tag ``mocolab.worker_nodes`` maps
them to Ray node ids).
"""

from __future__ import annotations

import logging
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


def start_monitor(uri: str, run_id: str, interval_s: float, node: str | None) -> Any | None:
    """A running ``SystemMetricsMonitor`` (steps continue after a resume), or None when off or it cannot start."""
    if interval_s <= 0:
        return None
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # no start/stop chatter per run
        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=True, node_id=node,
                                       tracking_uri=uri)
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
