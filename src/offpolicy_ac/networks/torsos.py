"""Feature extractors (flax.linen): an MLP for vectors; Nature-CNN, IMPALA-ResNet and a small CNN for pixels.

Pixel torsos take envpool's channels-first uint8 frames [B, C, H, W] (C = frame
stack), scale them to [0, 1] and work in NHWC internally.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp


class MLPTorso(nn.Module):
  """Fully connected torso: [B, D] (or [B, ...], flattened) -> [B, hidden_sizes[-1]]."""

  hidden_sizes: Sequence[int] = (64, 64)
  activation: str = "tanh"

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    act = getattr(nn, self.activation)
    x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
    for size in self.hidden_sizes:
      x = act(nn.Dense(size, kernel_init=nn.initializers.orthogonal(jnp.sqrt(2.0)))(x))
    return x


def _to_nhwc(obs: jnp.ndarray) -> jnp.ndarray:
  x = obs.astype(jnp.float32) / 255.0
  return jnp.transpose(x, (0, 2, 3, 1))


class NatureCNN(nn.Module):
  """Mnih et al. 2015: 32x8x8/4, 64x4x4/2, 64x3x3/1, dense 512. [B, C, H, W] -> [B, 512]."""

  dense_size: int = 512

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    x = _to_nhwc(obs)
    for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
      x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), padding="VALID")(x))
    x = x.reshape(x.shape[0], -1)
    return nn.relu(nn.Dense(self.dense_size)(x))


class _ResidualBlock(nn.Module):
  channels: int

  @nn.compact
  def __call__(self, x):
    y = nn.Conv(self.channels, (3, 3))(nn.relu(x))
    y = nn.Conv(self.channels, (3, 3))(nn.relu(y))
    return x + y


class ImpalaResNet(nn.Module):
  """Espeholt et al. 2018's deep torso: per stage conv, max-pool/2, two residual blocks.

  [B, C, H, W] -> [B, dense_size].
  """

  channels: Sequence[int] = (16, 32, 32)
  dense_size: int = 256

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    x = _to_nhwc(obs)
    for channels in self.channels:
      x = nn.Conv(channels, (3, 3))(x)
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
      x = _ResidualBlock(channels)(x)
      x = _ResidualBlock(channels)(x)
    x = nn.relu(x).reshape(x.shape[0], -1)
    return nn.relu(nn.Dense(self.dense_size)(x))


def _average_pool_to_nhwc(obs: jnp.ndarray, size: int) -> jnp.ndarray:
  """[B, C, H, W] frames -> [B, H // size, W // size, C] block means scaled to [0, 1] (as
  `nn.avg_pool(_to_nhwc(obs), (size, size), strides=(size, size))`, trailing rows and
  columns dropped). Integer frames are summed as int32 and converted once per block: on
  CPU about 3x faster than pooling the float frames (4 x 84 x 84, 8 or 168 frames)."""
  b, c, h, w = obs.shape
  h, w = h // size, w // size
  x = obs[:, :, : h * size, : w * size].reshape(b, c, h, size, w, size)
  if jnp.issubdtype(obs.dtype, jnp.integer):
    x = x.astype(jnp.int32).sum((3, 5)).astype(jnp.float32)
  else:
    x = x.astype(jnp.float32).sum((3, 5))
  return jnp.transpose(x * (1.0 / (size * size * 255.0)), (0, 2, 3, 1))


class SmallCNN(nn.Module):
  """A light pixel torso for CPU runs: 4x4 average pooling (84x84 -> 21x21), conv
  16x4x4/2, conv 32x3x3/2, dense 128. [B, C, H, W] -> [B, dense_size]; about 1/25 of
  the Nature CNN's multiply-adds, so a CPU learner keeps up with the actors."""

  dense_size: int = 128

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    x = _average_pool_to_nhwc(obs, 4)
    for features, kernel, stride in ((16, 4, 2), (32, 3, 2)):
      x = nn.relu(nn.Conv(features, (kernel, kernel), (stride, stride), padding="VALID")(x))
    x = x.reshape(x.shape[0], -1)
    return nn.relu(nn.Dense(self.dense_size)(x))


_PIXEL_TORSOS = {"nature_cnn": NatureCNN, "impala_resnet": ImpalaResNet, "small_cnn": SmallCNN}
TORSOS = ("mlp", *_PIXEL_TORSOS)
"""The torso names `make_torso` accepts: "mlp" and the pixel torsos."""


def make_torso(
    kind: str, observation_shape: tuple[int, ...], hidden_sizes: Sequence[int] = (64, 64)
) -> nn.Module:
  """Builds a torso, checking that it fits the observation shape.

  Args:
    kind: "mlp" (vector observations), "nature_cnn", "impala_resnet" or
      "small_cnn" (frames [C, H, W]), or "auto" (mlp for rank-1 observations, nature_cnn for rank 3).
    observation_shape: one observation's shape.
    hidden_sizes: MLP layer sizes.
  """
  rank = len(observation_shape)
  if kind == "auto":
    kind = "mlp" if rank == 1 else "nature_cnn" if rank == 3 else ""
    if not kind:
      raise ValueError(f"no torso fits observations of shape {observation_shape}")
  if kind not in TORSOS:
    raise ValueError(f"unknown torso {kind!r}; choose one of {TORSOS} or 'auto'")
  if kind == "mlp":
    return MLPTorso(tuple(hidden_sizes))
  if rank != 3:
    raise ValueError(
        f"torso {kind!r} needs [C, H, W] frames, got observation shape " f"{observation_shape}"
    )
  return _PIXEL_TORSOS[kind]()
