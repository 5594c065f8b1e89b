"""What there is to learn at cpu-full, on the validation split: the scale the reproduction's margins are set on.

For seeds 0-4: the validation linear top-1 of momentum-cpu-full's m = 0.99 trials (the arm "learning is plain"
reads, from the committed store) and of the same seed's random-init encoder (measured here: the network the
trial starts from, scored by the same probe on the same 5,000 held-out training images). The test split is
not read. Prints a CSV (seed, random_init, trained, learned) and, last, the mean of ``learned``.

    python experiments/pilot/margin.py > results/pilot/margin.csv     # about a minute on two cores
"""

from __future__ import annotations

import sys
from pathlib import Path

from mocolab.config import build_config
from mocolab.repro.store_file import unpack
from mocolab.tracking import Store
from mocolab.training.trainer import Trainer

SEEDS = range(5)
STORE = Path(__file__).resolve().parents[2] / "results" / "runs.db"


def trained_val_linear(store: Store) -> dict[int, float]:
    exp = store.client.get_experiment_by_name("momentum-ablation")
    runs = store.client.search_runs([exp.experiment_id], "tags.`mocolab.sweep_name` = 'momentum-cpu-full'")
    out = {}
    for r in runs:
        if r.data.tags.get("trial", "").startswith("m=0.99 ") and "val_linear_top1" in r.data.metrics:
            out[int(r.data.params["run.seed"])] = r.data.metrics["val_linear_top1"]
    return out


def main() -> int:
    unpack(STORE)  # the committed store is runs.db.xz: expanded where runs.db is missing or older
    trained = trained_val_linear(Store(f"sqlite:///{STORE}"))
    print("seed,random_init,trained,learned")
    learned = []
    for seed in SEEDS:
        cfg = build_config("cpu-full", {"run.seed": seed, "run.precision": "bf16", "run.threads": 2})
        scores = Trainer(cfg).evaluation.final_scores(validation=True)
        learned.append(trained[seed] - scores.val_linear)
        print(f"{seed},{scores.val_linear:.4f},{trained[seed]:.4f},{learned[-1]:.4f}")
        sys.stdout.flush()
    print(f"# mean learned: {sum(learned) / len(learned):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
