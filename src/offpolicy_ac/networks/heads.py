"""Networks with heads for each agent (flax.linen), all batch-major [B, ...].

* `CategoricalActorCritic`: logits [B, A] and V [B] (IMPALA, discrete).
* `GaussianActorCritic`: mean [B, D], log_std [B, D] (a state-independent
  parameter, broadcast) and V [B].
* `QNetwork`: Q [B, A] (SQL / SQIL).
* `ActorQCritic`: logits [B, A] and Q [B, A] (discrete ACER).
* `StochasticDuelingNetwork`: Gaussian policy, V(x) and A(x, a) (continuous
  ACER, Wang et al. 2016): Q~(x, a) = V(x) + A(x, a) - mean_i A(x, u_i).
* `StateActionQNetwork`: Q(x, a) [B, ...] for actions [B, ..., D] (continuous SQL).
* `AmortizedSampler`: a = tanh(f(x, xi)) [B, ..., D] for noise xi (continuous SQL's
  SVGD sampler, Haarnoja et al. 2017).
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp

from offpolicy_ac.networks import _checks


def _dense(features: int, scale: float) -> nn.Dense:
  return nn.Dense(features, kernel_init=nn.initializers.orthogonal(scale))


class CategoricalActorCritic(nn.Module):
  """Shared torso; policy logits [B, A] and value V [B] (IMPALA, discrete actions)."""

  torso: nn.Module
  num_actions: int
  NUM_OUTPUTS = 2
  """How many outputs `__call__` returns (`actor_critic` bounds `num_policy` by it)."""

  def __post_init__(self):
    super().__post_init__()
    _checks.check_positive_int("CategoricalActorCritic", "num_actions", self.num_actions)

  @nn.compact
  def __call__(self, obs):
    h = self.torso(obs)
    logits = _dense(self.num_actions, 0.01)(h)
    value = _dense(1, 1.0)(h)[..., 0]
    return logits, value


class GaussianActorCritic(nn.Module):
  """Shared torso; a diagonal Gaussian policy and value V [B] (IMPALA, continuous actions).

  Returns mean [B, D], log_std [B, D] (a state-independent parameter initialised to
  `init_log_std`, broadcast over the batch) and V [B].
  """

  torso: nn.Module
  action_dim: int
  init_log_std: float = 0.0
  NUM_OUTPUTS = 3
  """How many outputs `__call__` returns (`actor_critic` bounds `num_policy` by it)."""

  def __post_init__(self):
    super().__post_init__()
    _checks.check_positive_int("GaussianActorCritic", "action_dim", self.action_dim)
    _checks.check_finite("GaussianActorCritic", "init_log_std", self.init_log_std)

  @nn.compact
  def __call__(self, obs):
    h = self.torso(obs)
    mean = _dense(self.action_dim, 0.01)(h)
    log_std_init = nn.initializers.constant(self.init_log_std, jnp.float32)  # also with x64
    log_std = self.param("log_std", log_std_init, (self.action_dim,))
    value = _dense(1, 1.0)(h)[..., 0]
    return mean, jnp.broadcast_to(log_std, mean.shape), value


class QNetwork(nn.Module):
  """Action values Q [B, A] on a torso (SQL / SQIL)."""

  torso: nn.Module
  num_actions: int

  def __post_init__(self):
    super().__post_init__()
    _checks.check_positive_int("QNetwork", "num_actions", self.num_actions)

  @nn.compact
  def __call__(self, obs):
    return _dense(self.num_actions, 1.0)(self.torso(obs))


class ActorQCritic(nn.Module):
  """Shared torso; a policy head and a Q head (ACER, discrete)."""

  torso: nn.Module
  num_actions: int
  NUM_OUTPUTS = 2
  """How many outputs `__call__` returns (`actor_critic` bounds `num_policy` by it)."""

  def __post_init__(self):
    super().__post_init__()
    _checks.check_positive_int("ActorQCritic", "num_actions", self.num_actions)

  @nn.compact
  def __call__(self, obs):
    h = self.torso(obs)
    logits = _dense(self.num_actions, 0.01)(h)
    q = _dense(self.num_actions, 1.0)(h)
    return logits, q


class StochasticDuelingNetwork(nn.Module):
  """Continuous ACER's network.

  `__call__(obs)` -> (mean [B, D], log_std [B, D], V [B], features [B, H]);
  `advantage(features, actions [B, ..., D])` -> A(x, a) [B, ...].

  `init(key, obs)` creates only the parameters `__call__` uses. For all of them, initialise
  a function that calls both, e.g. `sdn.init(key, obs, method=lambda m, o:
  m.advantage(m(o)[3], jnp.zeros_like(m(o)[0])))` (continuous ACER's `init` does this).
  """

  torso: nn.Module
  action_dim: int
  hidden_size: int = 64
  init_log_std: float = 0.0
  NUM_OUTPUTS = 4
  """How many outputs `__call__` returns (`actor_critic` bounds `num_policy` by it)."""

  def __post_init__(self):
    super().__post_init__()
    _checks.check_positive_int("StochasticDuelingNetwork", "action_dim", self.action_dim)
    _checks.check_positive_int("StochasticDuelingNetwork", "hidden_size", self.hidden_size)
    _checks.check_finite("StochasticDuelingNetwork", "init_log_std", self.init_log_std)

  def setup(self):
    self.mean_head = _dense(self.action_dim, 0.01)
    self.value_head = _dense(1, 1.0)
    self.adv_hidden = _dense(self.hidden_size, jnp.sqrt(2.0))
    self.adv_out = _dense(1, 1.0)
    self.log_std = self.param(
        "log_std", nn.initializers.constant(self.init_log_std, jnp.float32), (self.action_dim,)
    )

  def __call__(self, obs):
    h = self.torso(obs)
    mean = self.mean_head(h)
    return (mean, jnp.broadcast_to(self.log_std, mean.shape), self.value_head(h)[..., 0], h)

  def advantage(self, features, actions):
    extra = actions.ndim - features.ndim
    f = features.reshape(features.shape[:1] + (1,) * extra + features.shape[1:])
    f = jnp.broadcast_to(f, actions.shape[:-1] + features.shape[-1:])
    x = jnp.concatenate([f, actions], axis=-1)
    return self.adv_out(nn.tanh(self.adv_hidden(x)))[..., 0]


def _concat_features(features, inputs):
  """concat(features [B, H] broadcast over inputs' middle axes, inputs [B, ..., D])."""
  extra = inputs.ndim - features.ndim
  f = features.reshape(features.shape[:1] + (1,) * extra + features.shape[1:])
  f = jnp.broadcast_to(f, inputs.shape[:-1] + features.shape[-1:])
  return jnp.concatenate([f, inputs.astype(f.dtype)], axis=-1)


class StateActionQNetwork(nn.Module):
  """Q(x, a) [B, ...]: a ReLU MLP over concat(torso(x), a) for actions a [B, ..., D]
  (several actions per observation share one torso pass). Continuous SQL."""

  torso: nn.Module
  hidden_sizes: Sequence[int] = (128, 128)

  def __post_init__(self):
    super().__post_init__()
    _checks.check_sizes("StateActionQNetwork", "hidden_sizes", self.hidden_sizes)

  @nn.compact
  def __call__(self, obs, actions):
    x = _concat_features(self.torso(obs), actions)
    for size in self.hidden_sizes:
      x = nn.relu(nn.Dense(size)(x))
    return nn.Dense(1)(x)[..., 0]


class AmortizedSampler(nn.Module):
  """a = tanh(f(concat(torso(x), xi))) in (-1, 1)^D [B, ..., D] for noise xi [B, ..., D]:
  the amortised SVGD sampler of continuous SQL (Haarnoja et al. 2017, section 3.2). With
  Flax's default initialisation the first samples spread over the box."""

  torso: nn.Module
  action_dim: int
  hidden_sizes: Sequence[int] = (128, 128)

  def __post_init__(self):
    super().__post_init__()
    _checks.check_positive_int("AmortizedSampler", "action_dim", self.action_dim)
    _checks.check_sizes("AmortizedSampler", "hidden_sizes", self.hidden_sizes)

  @nn.compact
  def __call__(self, obs, noise):
    x = _concat_features(self.torso(obs), noise)
    for size in self.hidden_sizes:
      x = nn.relu(nn.Dense(size)(x))
    return jnp.tanh(nn.Dense(self.action_dim)(x))
