"""Where negatives come from: in-batch, memory bank and MoCo's queue (FIFO and random replacement, across m).

The study is ``mocolab.tune.studies.negatives`` (also ``mocolab study negatives``); this script runs it with the
mocolab of this checkout, as ``ray job submit --working-dir . -- python experiments/negatives_ablation.py`` does.
"""

import _checkout  # noqa: F401  (mocolab from this checkout, installed or not: see _checkout.py)

from mocolab.cli.exiting import exit_now
from mocolab.tune.studies.negatives import main, settings  # noqa: F401

if __name__ == "__main__":
    exit_now(main())
