"""Actor-critic networks with a shared torso or with one torso each.

    net, policy = actor_critic(make_net, shared_torso=False, num_policy=2)
    outputs = net.apply(params, obs)      # the policy outputs, then the critic's
    policy_outputs = policy(params, obs)  # the first `num_policy` outputs only

`make_net()` builds one network whose first `num_policy` outputs are the policy's and the
rest the critic's (e.g. `GaussianActorCritic`: mean, log_std | V). A shared torso is that
network as it is; separate torsos are two copies of it (`SplitTorsos`), so the critic's
loss cannot move the policy's features (ACER's trust region, continuous control).
"""

from __future__ import annotations

from typing import Any
from typing import Callable

import flax.linen as nn


class SplitTorsos(nn.Module):
  """Two copies of one network (each with its own torso): the first `num_policy`
  outputs come from `actor`, the rest (and `advantage`) from `critic`. The heads
  each copy does not use get zero gradients."""

  actor: nn.Module
  critic: nn.Module
  num_policy: int

  def __call__(self, obs):
    return tuple(self.actor(obs)[: self.num_policy]) + tuple(self.critic(obs)[self.num_policy :])

  def policy(self, obs):
    return tuple(self.actor(obs)[: self.num_policy])

  def advantage(self, features, actions):
    return self.critic.advantage(features, actions)


def actor_critic(
    make_net: Callable[[], nn.Module], *, shared_torso: bool, num_policy: int
) -> tuple[nn.Module, Callable[[Any, Any], tuple]]:
  """(net, policy_fn): `policy_fn(params, obs)` -> the policy outputs only (a tuple)."""
  if shared_torso:
    net = make_net()
    return net, lambda params, obs: tuple(net.apply(params, obs)[:num_policy])
  net = SplitTorsos(make_net(), make_net(), num_policy)
  return net, lambda params, obs: net.apply(params, obs, method=net.policy)
