"""The named studies of the MoCo papers' ablations, each a Ray Tune sweep: ``mocolab study NAME`` or
``python experiments/NAME_ablation.py`` (the same ``main``). Beside a study, ``NAME_plots.py`` holds what only
it draws (its table, its picture, the paper's numbers), apart from its sweep: ``mocolab report`` and the
reproduction draw them without loading Tune."""

STUDIES = ("momentum", "queue", "augmentation", "negatives", "vit")
