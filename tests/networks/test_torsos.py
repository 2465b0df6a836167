"""networks.register_torso / make_torso: a registered torso is checked, on shapes, to map
observations [B, *shape] to floating features [B, F] for a batch of 2 and of 1. An int or
bool output trained with zero gradients; a `.squeeze()` broke on one observation, far away
(evaluate.py, record_demos.py, `greedy_policy`)."""

import flax.linen as nn
import jax.numpy as jnp
import pytest

from offpolicy_ac import networks
from offpolicy_ac.networks import torsos


class _IntOut(nn.Module):

  @nn.compact
  def __call__(self, x):
    return (nn.Dense(8)(x) * 10).astype(jnp.int32)


class _BoolOut(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(8)(x) > 0


class _HalfOut(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(8, dtype=jnp.float16)(x))


class _Squeezy(nn.Module):
  """Right for B >= 2; drops the batch axis of one observation."""

  @nn.compact
  def __call__(self, x):
    return nn.relu(nn.Dense(8)(x)).squeeze()


class _WiderForOne(nn.Module):
  """[B, 8] for B = 2, [1, 16] for one observation."""

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(8)(x)
    return jnp.tile(h, (1, 3 - x.shape[0]))


class _SqueezedInput(nn.Module):
  """Squeezes the observations first: its layer cannot take one observation's [D]."""

  @nn.compact
  def __call__(self, x):
    return nn.Dense(8)(x.squeeze().reshape(2, -1))


@pytest.fixture
def register():
  names = []

  def register(name, module_cls):
    networks.register_torso(name, lambda observation_shape, hidden_sizes: module_cls())
    names.append(name)

  yield register
  for name in names:
    torsos._REGISTERED.pop(name, None)  # pylint: disable=protected-access


@pytest.mark.parametrize("module_cls, dtype", [(_IntOut, "int32"), (_BoolOut, "bool")])
def test_a_torso_of_int_or_bool_features_is_refused(register, module_cls, dtype):
  register("discrete-out", module_cls)
  with pytest.raises(ValueError, match=rf"torso 'discrete-out' must return floating features "
                     rf"\[B, F\], got {dtype}: .*no gradient"):  # fmt: skip
    networks.make_torso("discrete-out", (4,))


def test_a_torso_of_half_precision_features_is_taken(register):
  register("half-out", _HalfOut)
  assert isinstance(networks.make_torso("half-out", (4,)), _HalfOut)


@pytest.mark.parametrize(
    "module_cls, message",
    [
        (_Squeezy, r"features \[B, F\]; for B = 1 it gave \(8,\) \(a .squeeze\(\) drops"),
        (_WiderForOne, r"features \[B, F\]; for B = 1 it gave \(1, 16\)"),
        (_SqueezedInput, r"cannot take observations \[B, \*\(4,\)\] \(B = 1\): "),
    ],
    ids=["squeezed-output", "other-F", "squeezed-input"],
)
def test_a_torso_that_cannot_take_one_observation_is_refused(register, module_cls, message):
  register("batch-2-only", module_cls)
  with pytest.raises(ValueError, match=rf"^torso 'batch-2-only' .*{message}"):
    networks.make_torso("batch-2-only", (4,))


def test_a_torso_of_any_batch_is_taken_on_vectors_and_frames(register):
  register("per-row", lambda: networks.MLPTorso((8,)))
  for shape in [(4,), (2, 5, 5)]:
    assert isinstance(networks.make_torso("per-row", shape), networks.MLPTorso)


@pytest.mark.parametrize("name", [" tiny", "tiny ", "tiny\n", "ti\x00ny"])
def test_a_torso_name_with_outer_whitespace_or_control_characters_is_refused(name):
  with pytest.raises(ValueError, match="must not start or end with whitespace or hold"):
    networks.register_torso(name, lambda observation_shape, hidden_sizes: _HalfOut())
  assert name not in torsos._REGISTERED  # pylint: disable=protected-access
