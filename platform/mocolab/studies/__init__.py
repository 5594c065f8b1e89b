"""The named studies of the MoCo papers' ablations, each a Ray Tune sweep: ``mocolab study NAME`` or
``python experiments/NAME_ablation.py`` (the same ``main``)."""

STUDIES = ("momentum", "queue", "augmentation", "negatives", "vit")
