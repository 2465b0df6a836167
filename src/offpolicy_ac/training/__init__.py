"""The training loop, evaluation, and the run directory (logging, plots)."""

from offpolicy_ac.training.cli import parse_args
from offpolicy_ac.training.clock import seconds_since_launch
from offpolicy_ac.training.evaluation import evaluate
from offpolicy_ac.training.experiment import exit_process
from offpolicy_ac.training.experiment import load_params
from offpolicy_ac.training.experiment import run_experiment
from offpolicy_ac.training.experiment import save_params
from offpolicy_ac.training.logger import RunLogger
from offpolicy_ac.training.logger import write_config
from offpolicy_ac.training.loop import LoopConfig
from offpolicy_ac.training.loop import RunResult
from offpolicy_ac.training.loop import train
from offpolicy_ac.training.metrics_io import read_metrics
from offpolicy_ac.training.plotting import plot_runs

__all__ = [
    "LoopConfig",
    "RunLogger",
    "RunResult",
    "evaluate",
    "exit_process",
    "load_params",
    "parse_args",
    "plot_runs",
    "read_metrics",
    "run_experiment",
    "save_params",
    "seconds_since_launch",
    "train",
    "write_config",
]
