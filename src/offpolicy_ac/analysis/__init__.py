"""Learning curves and statistics over runs, read from their run directories.

    runs = [run_info(d) for d in find_runs(["runs/"])]   # config.json + metrics.jsonl
    groups = group_runs(runs)                             # seeds of one configuration
    curves = [group_curve(g) for g in groups]             # IQM with 95% bootstrap intervals
    plot_group_curves(curves, group_labels(groups), "plots/")
    plot_runs(["runs/impala-0"], "curve.png")             # one run, or seeds overlaid
    lines = read_metrics("runs/impala-0")                 # metrics.jsonl's records

The statistics follow Agarwal et al. 2021 (arXiv:2108.13264); docs/statistics.md.
"""

from offpolicy_ac.analysis.metrics_file import METRICS_FILE
from offpolicy_ac.analysis.metrics_file import read_metrics
from offpolicy_ac.analysis.plotting import plot_group_curves
from offpolicy_ac.analysis.plotting import plot_runs
from offpolicy_ac.analysis.statistics import IGNORED_FIELDS
from offpolicy_ac.analysis.statistics import CurveEstimate
from offpolicy_ac.analysis.statistics import GroupCurve
from offpolicy_ac.analysis.statistics import NothingLogged
from offpolicy_ac.analysis.statistics import RunGroup
from offpolicy_ac.analysis.statistics import RunInfo
from offpolicy_ac.analysis.statistics import align_runs
from offpolicy_ac.analysis.statistics import final_scores_table
from offpolicy_ac.analysis.statistics import find_runs
from offpolicy_ac.analysis.statistics import group_curve
from offpolicy_ac.analysis.statistics import group_labels
from offpolicy_ac.analysis.statistics import group_runs
from offpolicy_ac.analysis.statistics import iqm
from offpolicy_ac.analysis.statistics import iqm_with_intervals
from offpolicy_ac.analysis.statistics import run_info
from offpolicy_ac.analysis.statistics import summary_table

__all__ = [
    "IGNORED_FIELDS",
    "METRICS_FILE",
    "read_metrics",
    "CurveEstimate",
    "GroupCurve",
    "NothingLogged",
    "RunGroup",
    "RunInfo",
    "align_runs",
    "final_scores_table",
    "find_runs",
    "group_curve",
    "group_labels",
    "group_runs",
    "iqm",
    "iqm_with_intervals",
    "plot_group_curves",
    "plot_runs",
    "run_info",
    "summary_table",
]
