"""Augmentation and batch-norm ablations: which views and which BN make the pretext task honest.

The study is ``mocolab.tune.studies.augmentation`` (also ``mocolab study augmentation``); this script runs it with the
mocolab of this checkout, as ``ray job submit --working-dir . -- python experiments/augmentation_ablation.py`` does.
"""

import _checkout  # noqa: F401  (mocolab from this checkout, installed or not: see _checkout.py)

from mocolab.cli.exiting import exit_now
from mocolab.tune.studies.augmentation import main  # noqa: F401

if __name__ == "__main__":
    exit_now(main())
