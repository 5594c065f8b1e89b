"""The cpu-full pilot's curve as CSV: val kNN top-1 after every epoch of one 16-epoch m = 0.99 run, and its
final numbers. Run from the folder holding the pilot's MLflow store (its command is in results/pilot/README.md):

    python experiments/pilot/export_curve.py sqlite:///mlflow.db > results/pilot/cpu-full-curve.csv
"""

import csv
import sys

from mlflow.tracking import MlflowClient

client = MlflowClient(sys.argv[1])
run = next(r for e in client.search_experiments() if e.name == "cpu-full-curve"
           for r in client.search_runs([e.experiment_id]))
steps_per_epoch = min(m.step for m in client.get_metric_history(run.info.run_id, "val_knn_top1"))
out = csv.writer(sys.stdout)
out.writerow(["run", "m", "seed", "epoch", "step", "metric", "value"])
for key in ("val_knn_top1", "knn_top1"):
    for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step):
        out.writerow([run.info.run_name, run.data.params["moco.m"], run.data.params["run.seed"],
                      m.step // steps_per_epoch, m.step, key, f"{100 * m.value:.2f}"])
for key in ("val_linear_top1", "linear_top1"):
    if key in run.data.metrics:
        out.writerow([run.info.run_name, run.data.params["moco.m"], run.data.params["run.seed"], "final",
                      "", key, f"{100 * run.data.metrics[key]:.2f}"])
