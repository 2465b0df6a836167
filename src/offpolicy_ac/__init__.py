"""offpolicy_ac: off-policy actor-critic reinforcement learning in JAX.

Subpackages:
  losses    -- pure V-trace, Retrace/ACER and soft-Q targets and losses (imported eagerly).
  envs      -- envpool environments with ALF's TimeStep semantics, rollouts, transformers.
  networks  -- flax torsos and heads.
  agents    -- IMPALA, ACER, SQL, SQIL as pure init / act / update functions.
  replay    -- a sequence replay buffer as pure functions.
  demos     -- recording and cutting demonstrations.
  training  -- the training loop, evaluation, run directories, checkpoints.
  presets   -- the experiment scripts' settings: Args, presets and run() per algorithm.
  cli       -- the experiment scripts' command line: tyro over a script's Args, presets.
  analysis  -- statistics over seeds (IQM, bootstrap intervals) and learning-curve plots.
  testing   -- a property-testing kit for target functions: trajectories with
               episode boundaries, float64 loop references and checks.

Everything but `losses` is imported on first access (`offpolicy_ac.envs.make`
works after `import offpolicy_ac`), so the loss library loads without envpool.
"""

import importlib

from offpolicy_ac import losses

__version__ = "0.2.0"

_LAZY = (
    "envs",
    "networks",
    "agents",
    "replay",
    "demos",
    "training",
    "presets",
    "cli",
    "analysis",
    "testing",
)

__all__ = ["losses", *_LAZY, "__version__"]


def __getattr__(name):
  if name in _LAZY:
    return importlib.import_module(f"offpolicy_ac.{name}")
  raise AttributeError(f"module 'offpolicy_ac' has no attribute {name!r}")


def __dir__():
  """Every subpackage, the lazily imported ones included (`dir(offpolicy_ac)`)."""
  return sorted({*globals(), *__all__})
