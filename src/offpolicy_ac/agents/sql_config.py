"""Soft Q-learning's configuration, shared by the discrete agent (`agents/sql.py`), the
continuous one (`agents/sql_continuous.py`) and SQIL (`agents/sqil.py`), and the optimizer
both SQL agents build from it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar
from typing import Sequence

from offpolicy_ac.agents import base

__all__ = ["SqlConfig", "make_sql_optimizer"]


@dataclasses.dataclass(frozen=True)
class SqlConfig:
  """Soft Q-learning's (and SQIL's) hyper-parameters: the temperature, exploration, the
  n-step or lambda targets, the target network, the network and the optimizer."""

  TUNABLE: ClassVar[tuple[str, ...]] = (
      "gamma",
      "alpha",
      "epsilon",
      "learning_rate",
      "max_grad_norm",
      "target_update_tau",
  )
  """Fields that may be arrays (swept, vmapped: `agents.hyperparams`). lambda_ is static:
  0 selects the n-step targets."""

  gamma: float = 0.99
  """Discount factor."""
  alpha: float = 0.05
  """Temperature of the soft value and of the Boltzmann policy (> 0). Scaling the rewards
  by c (--reward-scale) acts as dividing alpha by c: the authors fix
  alpha = 1 and tune the reward scale."""
  epsilon: float = 0.01
  """Probability of a uniformly random action on top of Boltzmann acting (continuous: on
  top of the sampler's action; uniform in the action box)."""
  n_step: int = 3
  """n of the soft n-step targets (lambda_ == 0), at most mini_batch_length; a target
  near a sampled window's end looks ahead only to it. Continuous SQL's paper targets are
  1-step. With lambda_ > 0 it is not used, and may only be 1 or this default."""
  lambda_: float = 0.0
  """If > 0, soft lambda-returns over the sampled window instead of n-step."""
  learning_rate: float = 1e-3
  """The optimizer's step size."""
  learning_rate_decay_updates: int = 0
  """> 0: after the first `learning_rate_decay_begin` updates, the step size falls
  linearly to 0 over this many updates (`experiments/sql.py --learning-rate-cooldown`
  sets both from the budget); 0: constant."""
  learning_rate_decay_begin: int = 0
  """Updates at the full step size before it starts to fall (with
  `learning_rate_decay_updates` > 0)."""
  optimizer: str = "adam"
  """'adam' or 'rmsprop'."""
  max_grad_norm: float = 10.0
  """Global-norm gradient clipping."""
  target_update_tau: float = 0.05
  """Polyak step of the target network after each update (1: hard copy)."""
  torso: str = "auto"
  """Network body: 'auto' (by observation shape), 'mlp', 'nature_cnn', 'impala_resnet',
  'small_cnn' or 'minatar_cnn'."""
  hidden_sizes: Sequence[int] = (128, 128)
  """MLP torso layer sizes; a built-in pixel torso has no layers they size (registered
  torsos are given them). Continuous: the layers of the Q network's MLP over
  concat(torso(obs), a) and of the sampler's over concat(torso(obs), noise)."""
  num_value_samples: int = 16
  """Continuous: M, actions drawn from the proposal q' (see `value_proposal_std`) to
  estimate the targets' soft value V(s') = alpha log E[exp(Q_target(s', a) / alpha) / q'(a)]
  (eq. 10)."""
  value_proposal_std: float = 0.0
  """Continuous: the proposal q' of the soft value's importance sampling. 0: uniform in the
  action box (the authors'). > 0: half of the M actions uniform, half from a normal of this
  std (in the [-1, 1]^d action units) around the sampler's action at s' (its noise-free
  output), truncated to the box, weighted by the mixture's density. When exp(Q / alpha) is peaked (a small alpha, SQIL's
  Q at demonstrated actions), few uniform samples miss the peak and underestimate V(s');
  samples around the sampler's action find it."""
  num_particles: int = 16
  """Continuous: SVGD particles drawn from the sampler per state (the authors' 16)."""
  svgd_update_ratio: float = 0.5
  """Continuous: the fraction of the particles that SVGD moves (the authors' 0.5); the
  others, fixed, carry the kernel's sum. Both parts must be non-empty."""
  num_q_networks: int = 1
  """Continuous: Q networks, each with its own initial values, all regressed on the same
  targets. With 2 or more, the targets' soft value and the sampler's SVGD use their
  minimum (clipped double Q: Fujimoto et al. 2018, arXiv:1802.09477, as in soft
  actor-critic), which counters the overestimation that bootstrapping from sampled
  maxima feeds. Discrete SQL takes 1 only."""

  def validate(self) -> None:
    base.check_in("gamma", self.gamma, 0.0, 1.0)
    base.check_hidden_sizes(self.hidden_sizes)
    for name in ("alpha", "learning_rate", "max_grad_norm"):  # max_grad_norm inf: no clipping
      base.check_positive(name, getattr(self, name))
    for name in ("alpha", "learning_rate"):
      base.check_finite(name, getattr(self, name))
    base.check_in("epsilon", self.epsilon, 0.0, 1.0)
    base.check_in("lambda_", self.lambda_, 0.0, 1.0)
    base.check_in("target_update_tau", self.target_update_tau, 1e-9, 1.0)
    base.check_int("n_step", self.n_step, 1)
    # A preset's 1-step targets (n_step 1) or the default n_step meet lambda_ without
    # a conflict: only another n_step is one that lambda_ would silently replace.
    if self.lambda_ > 0 and self.n_step not in (1, SqlConfig.n_step):
      raise ValueError(
          f"n_step={self.n_step} with lambda_={self.lambda_}: lambda_ > 0 selects the soft "
          "lambda-returns, and n_step sets the n-step targets (lambda_ 0): give one of the two"
      )
    for name, low in (("num_value_samples", 1), ("num_particles", 2)):
      base.check_int(name, getattr(self, name), low)
    base.check_non_negative("value_proposal_std", self.value_proposal_std)
    base.check_finite("value_proposal_std", self.value_proposal_std)
    if self.value_proposal_std > 0.0 and self.num_value_samples < 2:
      raise ValueError(
          "value_proposal_std > 0 draws half of the num_value_samples uniformly and half "
          f"around the sampler's action: it needs num_value_samples >= 2, got "
          f"{self.num_value_samples}"
      )
    base.check_int("num_q_networks", self.num_q_networks, 1)
    base.check_int("learning_rate_decay_updates", self.learning_rate_decay_updates, 0)
    base.check_int("learning_rate_decay_begin", self.learning_rate_decay_begin, 0)
    if self.learning_rate_decay_begin and not self.learning_rate_decay_updates:
      raise ValueError(
          f"learning_rate_decay_begin ({self.learning_rate_decay_begin}) is the update at "
          "which the step size starts to fall: it needs learning_rate_decay_updates > 0"
      )
    base.check_in("svgd_update_ratio", self.svgd_update_ratio, 0.0, 1.0)
    moved = self.num_updated_particles
    if not 1 <= moved < self.num_particles:
      raise ValueError(
          f"svgd_update_ratio ({self.svgd_update_ratio}) must move at least one of the "
          f"num_particles ({self.num_particles}) SVGD particles and keep one fixed; "
          f"int(num_particles * svgd_update_ratio) = {moved}"
      )

  @property
  def num_updated_particles(self) -> int:
    """Continuous: the particles SVGD moves, int(num_particles * svgd_update_ratio)."""
    return int(self.num_particles * self.svgd_update_ratio)

  def ignored_settings(self) -> dict[str, str]:
    """The settings the rest of this config leaves without effect, on any task, each with
    why: n_step with lambda_ > 0. Not in `unused_on`: the presets' n_step (1) differs from
    the default's (3) and meets lambda_ without a conflict; the command line refuses an
    --n-step off the preset's with --lambda (`cli.parse_args`)."""
    if not self.lambda_ > 0:
      return {}
    return {"n_step": "lambda_ > 0 selects the soft lambda-returns, and n_step sets the "
                      "n-step targets (lambda_ 0): give one of the two"}  # fmt: skip

  def unused_on(self, spec) -> dict[str, str]:
    """The settings that have no effect on the task of `spec`, each with why
    (`base.check_settings_used` refuses them set off their defaults). Continuous: the MLP
    sizes apply after the concat, whatever the torso."""
    if not spec.is_discrete:
      return {}
    why = ("settings of the continuous agent's sampler and soft value; on discrete actions "
           "the soft value is exact, with no sampler")  # fmt: skip
    fields = ("num_value_samples", "value_proposal_std", "num_particles", "svgd_update_ratio")
    return {**base.unused_mlp_sizes(self, spec), **dict.fromkeys(fields, why)}


def make_sql_optimizer(config: SqlConfig):
  """The optimizer of SQL's networks (each network gets its own state): clipping, then
  Adam or RMSProp with the config's step size and its decay."""
  return base.make_optimizer(
      config.optimizer,
      config.learning_rate,
      config.max_grad_norm,
      decay_updates=config.learning_rate_decay_updates,
      decay_begin=config.learning_rate_decay_begin,
  )
