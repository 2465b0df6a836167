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

from offpolicy_ac.networks import _checks


class SplitTorsos(nn.Module):
  """Two copies of one network (each with its own torso): the first `num_policy`
  outputs come from `actor`, the rest (and `advantage`) from `critic`. The heads
  each copy does not use get zero gradients."""

  actor: nn.Module
  critic: nn.Module
  num_policy: int

  def __post_init__(self):
    super().__post_init__()
    _check_num_policy("SplitTorsos", self.num_policy, _num_outputs(self.actor))

  def __call__(self, obs):
    actor, critic = tuple(self.actor(obs)), tuple(self.critic(obs))
    _check_num_policy("SplitTorsos", self.num_policy, len(critic))
    return actor[: self.num_policy] + critic[self.num_policy :]

  def policy(self, obs):
    return tuple(self.actor(obs)[: self.num_policy])

  def advantage(self, features, actions):
    return self.critic.advantage(features, actions)


def actor_critic(
    make_net: Callable[[], nn.Module], *, shared_torso: bool, num_policy: int
) -> tuple[nn.Module, Callable[[Any, Any], tuple]]:
  """(net, policy_fn): `policy_fn(params, obs)` -> the policy outputs only (a tuple).

  Raises:
    ValueError: a `make_net` that is not callable (or is a Module itself), a
      `shared_torso` that is not a bool, or a `num_policy` that is not an int in
      [1, number of the network's outputs) (the critic needs one output at least; the
      heads' `NUM_OUTPUTS`, else checked when called).
  """
  if isinstance(make_net, nn.Module) or not callable(make_net):
    raise ValueError(
        f"actor_critic: make_net must be a function () -> Module (it is called once per "
        f"torso), got {make_net!r}"
    )
  shared_torso = _checks.check_bool("actor_critic: shared_torso", shared_torso)
  num_policy = _checks.check_positive_int("actor_critic", "num_policy", num_policy)
  net = make_net()
  _check_num_policy("actor_critic", num_policy, _num_outputs(net))
  if shared_torso:
    return net, lambda params, obs: tuple(net.apply(params, obs)[:num_policy])
  critic = make_net()
  shared = _shared_module(net, critic)
  if shared is not None:  # flax binds it once: the critic would use the actor's parameters
    raise ValueError(
        f"actor_critic: the two networks make_net built share one module instance "
        f"({shared}), so the critic would have no torso of its own; build every module "
        "inside make_net (e.g. lambda: CategoricalActorCritic(torso=MLPTorso((64,)), ...))"
    )
  net = SplitTorsos(net, critic, num_policy)
  return net, lambda params, obs: net.apply(params, obs, method=net.policy)


def _modules_of(module: nn.Module, path: str) -> dict[int, tuple[nn.Module, str]]:
  """Every module reachable through `module`'s fields (itself included), by id: (the
  module, its path from the top)."""
  found = {id(module): (module, path)}
  for field in getattr(module, "__dataclass_fields__", {}):
    if field in ("parent", "name"):
      continue
    values = getattr(module, field, None)
    items = values.items() if isinstance(values, dict) else (
        enumerate(values) if isinstance(values, (list, tuple)) else [(None, values)])  # fmt: skip
    for key, value in items:
      if isinstance(value, nn.Module):
        where = f"{path}.{field}" + ("" if key is None else f"[{key!r}]")
        found = {**_modules_of(value, where), **found}
  return found


def _shared_module(actor: nn.Module, critic: nn.Module) -> str | None:
  """The path (in `actor`) of a module instance that `critic` holds too, else None."""
  actor_modules, critic_modules = _modules_of(actor, "net"), _modules_of(critic, "net")
  shared = [actor_modules[i] for i in actor_modules if i in critic_modules]
  return min((path for _, path in shared), key=len) if shared else None


def _num_outputs(net: Any) -> int | None:
  """How many outputs `net` returns where its class says (`NUM_OUTPUTS`), else None."""
  n = getattr(type(net), "NUM_OUTPUTS", None)
  return n if isinstance(n, int) else None


def _check_num_policy(owner: str, num_policy: Any, num_outputs: int | None) -> None:
  """Raises ValueError unless `num_policy` is an int >= 1 and below `num_outputs` (when
  known): the rest of the outputs, one at least, are the critic's."""
  _checks.check_positive_int(owner, "num_policy", num_policy)
  if num_outputs is not None and num_policy >= num_outputs:
    raise ValueError(
        f"{owner}: num_policy must be in [1, {num_outputs}) (the network returns "
        f"{num_outputs} outputs, the critic's after the policy's), got {num_policy}"
    )
