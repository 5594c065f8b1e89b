"""Tables and plots over a trials table: pandas and matplotlib only, no Ray, no MLflow.

A trials table has one row per trial with ``label``, ``status``, ``run_id``,
``params.<dotted config key>`` columns and the final metrics; the tracking
layer builds it from MLflow (``mocolab.tracking.trials_frame``), and the
studies and ``mocolab report`` read it through the functions here. What no
study but one draws (its paper numbers, its own table and picture) is
``<study>_plots.py`` here; ``report`` draws a sweep's report from MLflow.
"""

from mocolab.analysis.plots import (accuracy_bars, accuracy_errorbar, bar_plot, baseline_band, binned_mean,
                                    dictionary_plot, line_plot, save_figure)
from mocolab.analysis.summary import against_reference, fmt_mean_std, per_seed, summarise

__all__ = ["accuracy_bars", "accuracy_errorbar", "against_reference", "bar_plot", "baseline_band", "binned_mean",
           "dictionary_plot", "fmt_mean_std", "line_plot", "per_seed", "save_figure", "summarise"]
