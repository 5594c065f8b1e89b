"""Queue-size ablation: accuracy against the number of negatives K (MoCo paper, Figure 3).

The study is ``mocolab.tune.studies.queue`` (also ``mocolab study queue``); this script runs it with the
mocolab of this checkout, as ``ray job submit --working-dir . -- python experiments/queue_ablation.py`` does.
"""

import _checkout  # noqa: F401  (mocolab from this checkout, installed or not: see _checkout.py)

from mocolab.cli.exiting import exit_now
from mocolab.tune.studies.queue import main  # noqa: F401

if __name__ == "__main__":
    exit_now(main())
