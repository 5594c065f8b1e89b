"""Momentum ablation (MoCo paper, Table 1b): linear-probe accuracy against the key encoder's momentum m.

The study is ``mocolab.tune.studies.momentum`` (also ``mocolab study momentum``); this script runs it with the
mocolab of this checkout, as ``ray job submit --working-dir . -- python experiments/momentum_ablation.py`` does.
"""

import _checkout  # noqa: F401  (mocolab from this checkout, installed or not: see _checkout.py)

from mocolab.cli.exiting import exit_now
from mocolab.tune.studies.momentum import main  # noqa: F401

if __name__ == "__main__":
    exit_now(main())
