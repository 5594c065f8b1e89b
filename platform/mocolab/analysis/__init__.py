"""Tables and plots over a trials table: pandas and matplotlib only, no Ray, no MLflow.

A trials table has one row per trial with ``label``, ``status``, ``run_id``,
``params.<dotted config key>`` columns and the final metrics; the tracking
layer builds it from MLflow (``mocolab.tracking.trials_frame``), and the
studies and ``mocolab report`` read it through the functions here.
"""

from .plots import bar_plot, binned_mean, dictionary_plot, line_plot, momentum_plot, negatives_plot, vit_plot
from .summary import (PAPER_MOMENTUM, fmt_mean_std, negatives_setting, negatives_table, patch_momentum_table,
                      summarise, welch_t)

__all__ = ["PAPER_MOMENTUM", "bar_plot", "binned_mean", "dictionary_plot", "fmt_mean_std", "line_plot",
           "momentum_plot", "negatives_plot", "negatives_setting", "negatives_table", "patch_momentum_table",
           "summarise", "vit_plot", "welch_t"]
