"""The named studies of the MoCo papers' ablations, each a Ray Tune sweep: ``mocolab study NAME`` or
``python experiments/NAME_ablation.py`` (the same ``main``). What only one study draws (its table, its
picture, the paper's numbers) is ``analysis/NAME_plots.py``, apart from its sweep: ``mocolab report`` and
the reproduction draw them without loading Tune."""

from mocolab.config.choices import STUDIES  # noqa: F401  (mocolab study NAME: config/choices.py)
