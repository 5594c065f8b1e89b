"""MoCo v3 with a ViT: the frozen patch projection and the base momentum; v1, v2 and v3 at one budget.

The study is ``mocolab.tune.studies.vit`` (also ``mocolab study vit``); this script runs it with the
mocolab of this checkout, as ``ray job submit --working-dir . -- python experiments/vit_ablation.py`` does.
"""

import _checkout  # noqa: F401  (mocolab from this checkout, installed or not: see _checkout.py)

from mocolab.cli.exiting import exit_now
from mocolab.tune.studies.vit import RECIPES, main  # noqa: F401

if __name__ == "__main__":
    exit_now(main())
