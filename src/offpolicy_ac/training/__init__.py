"""The training driver, its configuration, evaluation, and the run directory."""

from offpolicy_ac.analysis.metrics_file import read_metrics
from offpolicy_ac.analysis.plotting import plot_runs
from offpolicy_ac.training.checkpoint import CheckpointAccessError
from offpolicy_ac.training.checkpoint import Checkpointer
from offpolicy_ac.training.checkpoint import DamagedCheckpointError
from offpolicy_ac.training.clock import seconds_since_launch
from offpolicy_ac.training.compiled_train import AnakinState
from offpolicy_ac.training.compiled_train import CompiledTrain
from offpolicy_ac.training.compiled_train import make_train
from offpolicy_ac.training.config import ActorsConfig
from offpolicy_ac.training.config import BudgetConfig
from offpolicy_ac.training.config import CheckpointConfig
from offpolicy_ac.training.config import EnvConfig
from offpolicy_ac.training.config import EvalConfig
from offpolicy_ac.training.config import ParallelConfig
from offpolicy_ac.training.config import ReplayConfig
from offpolicy_ac.training.config import TrackingConfig
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.config import TransformConfig
from offpolicy_ac.training.driver import BestKeeper
from offpolicy_ac.training.driver import NonFiniteError
from offpolicy_ac.training.driver import Outcome
from offpolicy_ac.training.driver import Program
from offpolicy_ac.training.driver import Progress
from offpolicy_ac.training.driver import ResumeError
from offpolicy_ac.training.driver import RunResult
from offpolicy_ac.training.driver import Update
from offpolicy_ac.training.driver import drive
from offpolicy_ac.training.envpool_program import train
from offpolicy_ac.training.evaluation import RenderedEpisode
from offpolicy_ac.training.evaluation import describe_protocol
from offpolicy_ac.training.evaluation import evaluate
from offpolicy_ac.training.evaluation import render_episode
from offpolicy_ac.training.experiment import is_refusal
from offpolicy_ac.training.experiment import prepare_process
from offpolicy_ac.training.experiment import refusals
from offpolicy_ac.training.experiment import run_experiment
from offpolicy_ac.training.logger import Logger
from offpolicy_ac.training.logger import MultiLogger
from offpolicy_ac.training.logger import RunLogger
from offpolicy_ac.training.logger import WandbLogger
from offpolicy_ac.training.logger import write_config
from offpolicy_ac.training.rundir import BestFiles
from offpolicy_ac.training.rundir import LoadedRun
from offpolicy_ac.training.rundir import load_params
from offpolicy_ac.training.rundir import load_run
from offpolicy_ac.training.rundir import save_params
from offpolicy_ac.training.sources import make_training_rollout
from offpolicy_ac.training.sources import pool_seed
from offpolicy_ac.training.video import write_video

__all__ = [
    "ActorsConfig",
    "AnakinState",
    "BestFiles",
    "BestKeeper",
    "BudgetConfig",
    "CheckpointAccessError",
    "CheckpointConfig",
    "Checkpointer",
    "CompiledTrain",
    "DamagedCheckpointError",
    "EnvConfig",
    "EvalConfig",
    "LoadedRun",
    "Logger",
    "MultiLogger",
    "NonFiniteError",
    "Outcome",
    "ParallelConfig",
    "Program",
    "Progress",
    "RenderedEpisode",
    "ReplayConfig",
    "ResumeError",
    "RunLogger",
    "RunResult",
    "TrackingConfig",
    "TrainConfig",
    "TransformConfig",
    "Update",
    "WandbLogger",
    "describe_protocol",
    "drive",
    "evaluate",
    "is_refusal",
    "load_params",
    "load_run",
    "make_train",
    "make_training_rollout",
    "plot_runs",
    "pool_seed",
    "prepare_process",
    "read_metrics",
    "refusals",
    "render_episode",
    "run_experiment",
    "save_params",
    "seconds_since_launch",
    "train",
    "write_config",
    "write_video",
]
