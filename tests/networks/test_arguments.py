"""The network constructors refuse bad arguments when built (ValueError naming the class or
function, the argument and the value), not at `init` with a flax/JAX error naming none."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import networks

_KEY = jax.random.key(0)


def _mlp():
  return networks.MLPTorso((4,))


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: networks.make_torso("mlp", (4,), (0,)), r"make_torso: hidden_sizes .*\(0,\)"),
        (lambda: networks.make_torso("mlp", (4,), (-3,)), r"hidden_sizes .*\(-3,\)"),
        (lambda: networks.make_torso("mlp", (4,), (True,)), r"hidden_sizes .*\(True,\)"),
        (lambda: networks.make_torso("mlp", (4,), (8.5,)), r"hidden_sizes .*\(8\.5,\)"),
        (lambda: networks.make_torso("mlp", (4,), 64), r"hidden_sizes .*got 64"),
        (lambda: networks.make_torso("mlp", (4,), "64"), r"hidden_sizes .*got '64'"),
        (lambda: networks.make_torso("mlp", 4), r"make_torso: observation_shape .*got 4"),
        (lambda: networks.make_torso("auto", (0,)), r"observation_shape .*\(0,\)"),
        (lambda: networks.make_torso("nature_cnn", (4, -84, 84)), r"observation_shape"),
        (lambda: networks.torso_kind("auto", 4), r"torso_kind: observation_shape .*got 4"),
        (lambda: networks.MLPTorso((-3,)), r"MLPTorso: hidden_sizes .*\(-3,\)"),
        (lambda: networks.MLPTorso(64), r"MLPTorso: hidden_sizes .*got 64"),
        (lambda: networks.MLPTorso(observation_shape=(4, 0)), r"MLPTorso: observation_shape"),
        (lambda: networks.MLPTorso(activation="foo"), r"MLPTorso: activation .*'tanh'.*'foo'"),
        (lambda: networks.MLPTorso(activation="Dense"), r"MLPTorso: activation .*'Dense'"),
        (lambda: networks.MLPTorso(activation="PReLU"), r"MLPTorso: activation .*'PReLU'"),
        (lambda: networks.MLPTorso(activation=jax.nn.relu), r"MLPTorso: activation"),
        (lambda: networks.NatureCNN(dense_size=0), r"NatureCNN: dense_size .*got 0"),
        (lambda: networks.NatureCNN(dense_size=True), r"NatureCNN: dense_size .*True"),
        (lambda: networks.SmallCNN(dense_size=-1), r"SmallCNN: dense_size .*-1"),
        (lambda: networks.MinAtarCNN(dense_size=2.0), r"MinAtarCNN: dense_size .*2\.0"),
        (lambda: networks.ImpalaResNet(dense_size=0), r"ImpalaResNet: dense_size .*0"),
        (lambda: networks.ImpalaResNet(channels=(16, 0)), r"ImpalaResNet: channels .*\(16, 0\)"),
        (lambda: networks.ImpalaResNet(channels=16), r"ImpalaResNet: channels .*16"),
        (
            lambda: networks.CategoricalActorCritic(_mlp(), 0),
            r"CategoricalActorCritic: num_actions .*0",
        ),
        (
            lambda: networks.CategoricalActorCritic(_mlp(), True),
            r"CategoricalActorCritic: num_actions .*True",
        ),
        (lambda: networks.QNetwork(_mlp(), 0), r"QNetwork: num_actions .*0"),
        (lambda: networks.ActorQCritic(_mlp(), -2), r"ActorQCritic: num_actions .*-2"),
        (lambda: networks.GaussianActorCritic(_mlp(), 0), r"GaussianActorCritic: action_dim .*0"),
        (
            lambda: networks.GaussianActorCritic(_mlp(), 2, init_log_std=float("nan")),
            r"GaussianActorCritic: init_log_std .*nan",
        ),
        (
            lambda: networks.GaussianActorCritic(_mlp(), 2, init_log_std="0"),
            r"GaussianActorCritic: init_log_std .*'0'",
        ),
        (
            lambda: networks.StochasticDuelingNetwork(_mlp(), 0),
            r"StochasticDuelingNetwork: action_dim .*0",
        ),
        (
            lambda: networks.StochasticDuelingNetwork(_mlp(), 2, hidden_size=0),
            r"StochasticDuelingNetwork: hidden_size .*0",
        ),
        (
            lambda: networks.StochasticDuelingNetwork(_mlp(), 2, init_log_std=float("inf")),
            r"StochasticDuelingNetwork: init_log_std .*inf",
        ),
        (
            lambda: networks.StateActionQNetwork(_mlp(), (0,)),
            r"StateActionQNetwork: hidden_sizes .*\(0,\)",
        ),
        (lambda: networks.AmortizedSampler(_mlp(), 0), r"AmortizedSampler: action_dim .*0"),
    ],
)
def test_a_bad_argument_is_refused_when_built(build, match):
  with pytest.raises(ValueError, match=match):
    build()


def _gaussian():
  return networks.GaussianActorCritic(networks.MLPTorso((4,)), 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"shared_torso": "no", "num_policy": 2}, r"actor_critic: shared_torso .*'no'"),
        ({"shared_torso": 0, "num_policy": 2}, r"actor_critic: shared_torso .*0"),
        ({"shared_torso": False, "num_policy": -1}, r"actor_critic: num_policy .*-1"),
        ({"shared_torso": False, "num_policy": 0}, r"actor_critic: num_policy .*0"),
        ({"shared_torso": True, "num_policy": 3}, r"actor_critic: num_policy .*\[1, 3\).*3"),
        ({"shared_torso": False, "num_policy": 5}, r"actor_critic: num_policy .*5"),
        ({"shared_torso": False, "num_policy": True}, r"actor_critic: num_policy .*True"),
    ],
)
def test_actor_critic_refuses_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    networks.actor_critic(_gaussian, **kwargs)


def test_actor_critic_refuses_a_make_net_that_is_not_callable():
  with pytest.raises(ValueError, match=r"actor_critic: make_net"):
    networks.actor_critic(_gaussian(), shared_torso=True, num_policy=2)


def test_separate_torsos_refuse_a_module_instance_both_networks_hold():
  """A torso built outside make_net is one instance in both copies: flax bound it once, so
  the critic used the actor's torso parameters, silently (a shared torso after all)."""
  torso = _mlp()
  shared_torso = lambda: networks.CategoricalActorCritic(torso=torso, num_actions=2)
  with pytest.raises(ValueError, match=r"share one module instance \(net\.torso\), so the cr"):
    networks.actor_critic(shared_torso, shared_torso=False, num_policy=1)
  net = shared_torso()
  with pytest.raises(ValueError, match=r"share one module instance \(net\)"):
    networks.actor_critic(lambda: net, shared_torso=False, num_policy=1)
  assert networks.actor_critic(shared_torso, shared_torso=True, num_policy=1)[0] is not None
  own = lambda: networks.CategoricalActorCritic(torso=_mlp(), num_actions=2)
  split, _ = networks.actor_critic(own, shared_torso=False, num_policy=1)
  params = split.init(_KEY, jnp.ones((1, 4)))["params"]
  assert set(params["actor"]) >= {"torso"} and set(params["critic"]) >= {"torso"}


def test_split_torsos_refuses_num_policy_without_a_critic_output():
  with pytest.raises(ValueError, match=r"SplitTorsos: num_policy .*\[1, 2\).*2"):
    networks.SplitTorsos(
        networks.ActorQCritic(_mlp(), 2), networks.ActorQCritic(_mlp(), 2), num_policy=2
    )


class _Pair(nn.Module):
  """A network of two outputs that does not say how many (no NUM_OUTPUTS)."""

  @nn.compact
  def __call__(self, obs):
    return nn.Dense(2)(obs), nn.Dense(1)(obs)[..., 0]


def test_split_torsos_checks_num_policy_when_called_if_the_net_does_not_say():
  net, _ = networks.actor_critic(_Pair, shared_torso=False, num_policy=2)
  with pytest.raises(ValueError, match=r"SplitTorsos: num_policy .*\[1, 2\)"):
    net.init(_KEY, jnp.zeros((1, 3)))


@pytest.mark.parametrize(
    "hidden_sizes, width",
    [((), 3), ([5], 5), ((np.int64(2), 3), 3), (np.array([4]).tolist(), 4)],
)
def test_valid_mlp_edge_values_build_and_run(hidden_sizes, width):
  torso = networks.make_torso("mlp", [np.int32(3)], hidden_sizes)
  params = torso.init(_KEY, jnp.zeros((2, 3)))
  assert torso.apply(params, jnp.ones((2, 3))).shape == (2, width)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu", "leaky_relu", "softplus"])
def test_flax_activation_names_are_taken(activation):
  torso = networks.MLPTorso((2,), activation=activation)
  params = torso.init(_KEY, jnp.zeros((1, 3)))
  assert torso.apply(params, jnp.ones((1, 3))).shape == (1, 2)


@pytest.mark.parametrize("shared_torso", [True, False, np.bool_(False)])
def test_valid_heads_build_jit_vmap_and_clone(shared_torso):
  def make_net():
    torso = networks.make_torso("mlp", (3,), (4,))
    return networks.GaussianActorCritic(torso, np.int64(2), init_log_std=np.float32(-0.5))

  net, policy = networks.actor_critic(make_net, shared_torso=shared_torso, num_policy=2)
  obs = jnp.zeros((2, 3))
  params = net.init(_KEY, obs)
  mean, log_std, value = jax.jit(net.apply)(params, obs)
  assert (mean.shape, log_std.shape, value.shape) == ((2, 2), (2, 2), (2,))
  np.testing.assert_allclose(log_std, -0.5)
  assert len(policy(params, obs)) == 2
  values = jax.vmap(lambda o: net.apply(params, o)[2])(jnp.zeros((3, 2, 3)))
  assert values.shape == (3, 2)
  assert net.clone().init(_KEY, obs)["params"].keys() == params["params"].keys()


def test_other_heads_build_with_positive_sizes():
  obs = jnp.zeros((2, 3))
  sdn = networks.StochasticDuelingNetwork(_mlp(), 1, hidden_size=np.int32(3))
  assert len(sdn.apply(sdn.init(_KEY, obs), obs)) == 4
  for net in (networks.QNetwork(_mlp(), 1), networks.ActorQCritic(_mlp(), 1)):
    jax.tree.map(lambda x: x, net.apply(net.init(_KEY, obs), obs))
  q = networks.StateActionQNetwork(_mlp(), ())
  actions = jnp.zeros((2, 5, 1))
  assert q.apply(q.init(_KEY, obs, actions), obs, actions).shape == (2, 5)


def test_pixel_torsos_take_their_defaults_and_small_sizes():
  frames = jnp.zeros((1, 2, 10, 10))
  for torso in (networks.MinAtarCNN(dense_size=np.int64(3)), networks.ImpalaResNet((2,), 3)):
    assert torso.apply(torso.init(_KEY, frames), frames).shape == (1, 3)
  for cls in (networks.NatureCNN, networks.SmallCNN, networks.MinAtarCNN, networks.ImpalaResNet):
    cls()
