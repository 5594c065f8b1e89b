"""What logging a run's encoder and probe as MLflow models costs, against the run it ends.

    .venv/bin/python benchmarks/tracking/model_logging.py [--preset cpu-quick] [--repeats 3]

Logs the preset's encoder (``encoder``: images -> features) and the probe
(``classifier``) into a fresh sqlite store with ``tracking.models.log_models``
as a finished run does, ``--repeats`` times, and prints the median seconds
per run (both models), the same with MLflow's own inference of pip
requirements (what ``log_model`` does when they are not given: it loads the
model in a subprocess), and loading the encoder back. The first call of the
process is printed on its own: a trial's process logs once, so it pays that
one (MLflow's and torch.export's first use), not the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "platform"))

from mocolab.config import build_config  # noqa: E402
from mocolab.evaluation.probe import ProbeResult  # noqa: E402
from mocolab.models.exported import FeatureExtractor, ProbeClassifier  # noqa: E402
from mocolab.config.manifest import RunManifest  # noqa: E402
from mocolab.models.backbones import build_encoder  # noqa: E402
from mocolab.tracking import RunTracker  # noqa: E402
from mocolab.tracking.logged_models import load_encoder, log_models  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="cpu-quick")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(2)
    cfg = build_config(args.preset, {})
    m = cfg.model
    enc = build_encoder(m.backbone, 1, width=m.width, head=m.head, dim=m.dim, hidden=m.hidden, bn_groups=4)
    d = enc.backbone.out_dim
    probe = ProbeResult(0.0, 0.0, torch.randn(d, 10).double(), torch.zeros(10).double(), torch.zeros(d).double(),
                        torch.ones(d).double())
    features = FeatureExtractor(enc.backbone, 1)
    modules = {"encoder": features, "classifier": ProbeClassifier(features, probe)}
    example = torch.rand(4, 1, 28, 28)
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/bench.db"
        times, loads = [], []
        for i in range(args.repeats + 1):  # the first one warms imports and the store
            tracker = RunTracker(uri, "bench")
            run_id, _ = tracker.start(RunManifest(f"r{i}", {}, ""))
            t0 = time.perf_counter()
            log_models(uri, run_id, modules, example, step=1)
            if not i:
                first = time.perf_counter() - t0
            else:
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            load_encoder(run_id, uri)
            if i:
                loads.append(time.perf_counter() - t0)
        import mlflow.pytorch  # MLflow inferring the requirements itself, for comparison
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri

        tracker = RunTracker(uri, "bench")
        run_id, _ = tracker.start(RunManifest("inferred", {}, ""))
        with _use_tracking_uri(uri):
            t0 = time.perf_counter()
            mlflow.pytorch.log_model(features.eval(), name="encoder", serialization_format="pt2",
                                     input_example=example.numpy(), run_id=run_id)
            inferred = time.perf_counter() - t0
    print(f"preset {args.preset}: {m.backbone} width {m.width}, {sum(x.numel() for x in enc.backbone.parameters()):,} "
          f"backbone parameters, torch threads {torch.get_num_threads()}")
    print(f"log encoder + classifier (pt2, requirements given), the process's first: {first:.2f} s")
    print(f"log encoder + classifier (pt2, requirements given): median {statistics.median(times):.2f} s "
          f"over {len(times)}")
    print(f"load the encoder back: median {statistics.median(loads):.2f} s")
    print(f"log the encoder alone with MLflow inferring requirements: {inferred:.2f} s")


if __name__ == "__main__":
    main()
