"""offpolicy_ac: off-policy actor-critic reinforcement learning in JAX.

Subpackages:
  losses  -- pure V-trace, Retrace and soft-Q targets and the losses built on them.
  envs    -- envpool environments with ALF's TimeStep semantics, rollouts, transformers.
"""

from offpolicy_ac import losses

__version__ = "0.1.0"

__all__ = ["losses", "__version__"]
