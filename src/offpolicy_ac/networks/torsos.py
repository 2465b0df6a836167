"""Feature extractors (flax.linen): an MLP for vectors; Nature-CNN, IMPALA-ResNet, a small
CNN and the MinAtar network for frames.

Pixel torsos take channels-first frames [B, C, H, W] (C = frame stack) and work in NHWC
internally. envpool's uint8 frames are scaled to [0, 1]; frames of other dtypes (MinAtar's
0/1 grids, normalised observations) are taken as they are. On XLA:CPU their convolutions
are products over patches (`patch_conv`; the MinAtar network's is written as one), which
XLA:CPU differentiates at full speed inside loops.
"""

from __future__ import annotations

import functools
import math
from typing import Callable
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from offpolicy_ac._definitions import redefines
from offpolicy_ac.networks import _checks
from offpolicy_ac.networks import patch_conv

_ORTHOGONAL_SQRT2 = nn.initializers.orthogonal(math.sqrt(2.0))
"""Kernel initialisation of the MLP and the small CNN (OpenAI baselines', CleanRL's).

The gain is a Python float: a module-level `jnp` value would start a JAX backend at
import, before `jax.distributed.initialize` can run."""


_Conv = functools.partial(nn.Conv, conv_general_dilated=patch_conv.conv_general_dilated)
"""`nn.Conv` (the same parameters and names), fast inside loops on XLA:CPU (`patch_conv`)."""


class MLPTorso(nn.Module):
  """Fully connected torso: [B, D] (or [B, ...], flattened) -> [B, hidden_sizes[-1]].

  `observation_shape` (one observation's; `make_torso` sets it) refuses a batch of other
  observations: one observation without its batch axis ([D] would be read as D
  observations of one feature), or another task's (a parameter shape error otherwise)."""

  hidden_sizes: Sequence[int] = (64, 64)
  activation: str = "tanh"
  observation_shape: tuple[int, ...] | None = None

  def __post_init__(self):
    super().__post_init__()
    _checks.check_sizes("MLPTorso", "hidden_sizes", self.hidden_sizes)
    _checks.check_activation("MLPTorso", self.activation)
    if self.observation_shape is not None:
      _checks.check_sizes("MLPTorso", "observation_shape", self.observation_shape)

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    shape = self.observation_shape
    if shape is not None and tuple(obs.shape[1:]) != tuple(shape):
      hint = (": add the batch axis (obs[None]) to one observation"
              if tuple(obs.shape) == tuple(shape) else "")  # fmt: skip
      raise ValueError(
          f"MLPTorso takes a batch of observations [B, *{tuple(shape)}], got shape "
          f"{tuple(obs.shape)}{hint}"
      )
    act = getattr(nn, self.activation)
    x = _flat(obs).astype(jnp.float32)
    for size in self.hidden_sizes:
      x = act(nn.Dense(size, kernel_init=_ORTHOGONAL_SQRT2)(x))
    return x


def _flat(x: jnp.ndarray) -> jnp.ndarray:
  """[B, ...] as [B, features]; an empty batch too (reshape's -1 cannot size B = 0)."""
  return x.reshape(x.shape[0], math.prod(x.shape[1:]))


def _looks_channels_last(frame_shape: tuple[int, ...]) -> bool:
  """True when one frame's shape reads as [H, W, C]: its last axis is shorter than both the
  others (CarRacing's (96, 96, 3), gymnax MinAtar's (10, 10, 7)). [H, W, C] frames with at
  least min(H, W) channels (gymnax's Seaquest-MinAtar, (10, 10, 10)) cannot be told apart
  from [C, H, W] ones, and pass."""
  return frame_shape[-1] < min(frame_shape[0], frame_shape[1])


def _check_frames(obs: jnp.ndarray, torso: str) -> None:
  if obs.ndim != 4:
    raise ValueError(f"{torso} takes a batch of frames [B, C, H, W], got shape {obs.shape}")
  if _looks_channels_last(obs.shape[1:]):
    raise ValueError(
        f"{torso} takes frames [B, C, H, W]; shape {obs.shape} looks like [B, H, W, C]: "
        "move the channels first (obs.transpose(0, 3, 1, 2))"
    )


def _check_features(x: jnp.ndarray, obs: jnp.ndarray, torso: str) -> None:
  """Refuses frames too small for a torso's convolutions (no feature left), before its
  dense layer's initialisation divides by a fan-in of 0."""
  if math.prod(x.shape[1:]) == 0:
    raise ValueError(f"{torso}'s convolutions leave no feature of frames of shape {obs.shape}")


def _to_nhwc(obs: jnp.ndarray) -> jnp.ndarray:
  """[B, C, H, W] -> float32 [B, H, W, C]; 8-bit frames scaled to [0, 1], other dtypes
  (0/1 grids, frames already scaled or normalised) taken as they are."""
  x = obs.astype(jnp.float32)
  if obs.dtype == jnp.uint8:
    x = x / 255.0
  return jnp.transpose(x, (0, 2, 3, 1))


class NatureCNN(nn.Module):
  """Mnih et al. 2015: 32x8x8/4, 64x4x4/2, 64x3x3/1, dense 512. [B, C, H, W] -> [B, 512]."""

  dense_size: int = 512

  def __post_init__(self):
    super().__post_init__()
    _checks.check_positive_int("NatureCNN", "dense_size", self.dense_size)

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    _check_frames(obs, "NatureCNN")
    x = _to_nhwc(obs)
    for features, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
      x = nn.relu(_Conv(features, (kernel, kernel), (stride, stride), padding="VALID")(x))
    _check_features(x, obs, "NatureCNN")
    x = _flat(x)
    return nn.relu(nn.Dense(self.dense_size)(x))


class _ResidualBlock(nn.Module):
  channels: int

  @nn.compact
  def __call__(self, x):
    y = _Conv(self.channels, (3, 3))(nn.relu(x))
    y = _Conv(self.channels, (3, 3))(nn.relu(y))
    return x + y


class ImpalaResNet(nn.Module):
  """Espeholt et al. 2018's deep torso: per stage conv, max-pool/2, two residual blocks.

  [B, C, H, W] -> [B, dense_size].
  """

  channels: Sequence[int] = (16, 32, 32)
  dense_size: int = 256

  def __post_init__(self):
    super().__post_init__()
    _checks.check_sizes("ImpalaResNet", "channels", self.channels)
    _checks.check_positive_int("ImpalaResNet", "dense_size", self.dense_size)

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    _check_frames(obs, "ImpalaResNet")
    x = _to_nhwc(obs)
    for channels in self.channels:
      x = _Conv(channels, (3, 3))(x)
      x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
      x = _ResidualBlock(channels)(x)
      x = _ResidualBlock(channels)(x)
    x = _flat(nn.relu(x))
    return nn.relu(nn.Dense(self.dense_size)(x))


def _max_pool_to_nhwc(obs: jnp.ndarray, size: int) -> jnp.ndarray:
  """[B, C, H, W] frames -> [B, H // size, W // size, C] block maxima, 8-bit frames scaled to
  [0, 1] as `_to_nhwc` scales them (so `nn.max_pool(_to_nhwc(obs), (size, size),
  strides=(size, size))`, trailing rows and columns dropped). The maxima are taken on the
  frames as they come (8-bit: before the conversion) and converted once per block:
  on a 2-core CPU (4 x 84 x 84, 8 or 168 frames) about 1.7x faster than `nn.max_pool` on
  float frames, and about 2.5x the time of block means of int32 sums."""
  b, c, h, w = obs.shape
  h, w = h // size, w // size
  return _to_nhwc(obs[:, :, : h * size, : w * size].reshape(b, c, h, size, w, size).max((3, 5)))


class SmallCNN(nn.Module):
  """A light pixel torso for CPU runs: 4x4 max pooling (84x84 -> 21x21), conv 16x4x4/2,
  conv 32x3x3/2, dense 128, ReLU, orthogonal initialisation with gain sqrt(2) (as OpenAI
  baselines' and CleanRL's Atari networks). [B, C, H, W] -> [B, dense_size]; about 1/40 of
  the Nature CNN's multiply-adds (0.22M against 9.3M on 4 x 84 x 84 frames), so a CPU
  learner keeps up with the actors.

  Max pooling keeps small objects at full contrast: in a Pong frame measured, the ball (2 x
  2 pixels, up to 229, on a background of 87) lifts its pooled cell by 0.56 of the pixel
  range, and a block mean by 0.06. With 4x4 average pooling, or Flax's default (LeCun)
  initialisation, IMPALA's policy on Pong-v5 stayed uniform for 2M env steps
  (results/notes/atari.md)."""

  dense_size: int = 128

  def __post_init__(self):
    super().__post_init__()
    _checks.check_positive_int("SmallCNN", "dense_size", self.dense_size)

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    _check_frames(obs, "SmallCNN")
    x = _max_pool_to_nhwc(obs, 4)
    for features, kernel, stride in ((16, 4, 2), (32, 3, 2)):
      conv = _Conv(
          features, (kernel, kernel), (stride, stride), "VALID", kernel_init=_ORTHOGONAL_SQRT2
      )
      x = nn.relu(conv(x))
    _check_features(x, obs, "SmallCNN")
    x = _flat(x)
    return nn.relu(nn.Dense(self.dense_size, kernel_init=_ORTHOGONAL_SQRT2)(x))


class MinAtarCNN(nn.Module):
  """The MinAtar network (Young & Tian 2019, arXiv:1903.03176): conv 16x3x3/1 (VALID),
  dense 128, on [B, C, H, W] grids of 0/1 channels (float or bool, taken as they are;
  uint8 frames are scaled to [0, 1], as every pixel torso scales them). -> [B, dense_size].

  The convolution is computed as a matrix product over the 3x3 patches (the same
  function): XLA:CPU ran `lax.conv` and its gradients about 5x slower inside the compiled
  training loop than on their own, the matrix product runs at full speed in both."""

  dense_size: int = 128

  def __post_init__(self):
    super().__post_init__()
    _checks.check_positive_int("MinAtarCNN", "dense_size", self.dense_size)

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    _check_frames(obs, "MinAtarCNN")
    x = _to_nhwc(obs)
    h, w = x.shape[1] - 2, x.shape[2] - 2
    if min(h, w) < 1:
      raise ValueError(f"MinAtarCNN's 3x3 convolution leaves no feature of frames {obs.shape}")
    # fan-in 9 C, as the convolution's
    x = nn.relu(nn.Dense(16, name="conv")(patch_conv.patches(x, (3, 3))))
    x = _flat(x)
    return nn.relu(nn.Dense(self.dense_size)(x))


_PIXEL_TORSOS = {
    "nature_cnn": NatureCNN,
    "impala_resnet": ImpalaResNet,
    "small_cnn": SmallCNN,
    "minatar_cnn": MinAtarCNN,
}
SMALL_FRAME = 16
"""`make_torso("auto")` gives frames of at most this height and width (MinAtar's 10 x 10
grids) the MinAtar network, larger ones the Nature CNN."""
TORSOS = ("mlp", *_PIXEL_TORSOS)
"""The built-in torso names `make_torso` accepts: "mlp" and the pixel torsos."""

_REGISTERED: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], nn.Module]] = {}
"""Torsos of your own, by name (`register_torso`)."""


def register_torso(
    name: str, make: Callable[[tuple[int, ...], tuple[int, ...]], nn.Module]
) -> None:
  """Registers `make(observation_shape, hidden_sizes) -> nn.Module` as torso `name`.

  The agents' configs then take `torso=name` (`make_torso(name, ...)` calls `make`). The
  run's config.json holds only the name, so every process that trains or loads such a
  run registers the torso first (as `agents.register_agent`): `load_run`, `--resume`, a
  compiled run and `--sweep` rebuild the network from it. The module maps observations
  [B, *observation_shape] to floating features [B, F] (uint8 frames arrive unscaled), for
  B = 1 too (one observation: evaluate.py, `greedy_policy`); `make_torso` checks that on
  shapes. Registering a name again with the same `make` does nothing; with a `make` of the
  same module and qualified name (redefined: a notebook cell run again; not lambdas or
  functions defined in functions, which share their names), it registers the new one.

  Raises:
    ValueError: a name that is empty, "auto", a built-in torso's, taken by another `make`,
      or with leading or trailing whitespace or control characters, or a `make` that is
      not callable or is a flax Module (class or instance) rather than a function that
      makes one.
  """
  if not isinstance(name, str) or not name or name == "auto" or name in TORSOS:
    raise ValueError(f"a torso's name must be a non-empty str other than 'auto' and {TORSOS}, "
                     f"got {name!r}")  # fmt: skip
  if name != name.strip() or not name.isprintable():
    raise ValueError(f"a torso's name must not start or end with whitespace or hold "
                     "control characters (configs and --agent.torso give it as it is), "
                     f"got {name!r}")  # fmt: skip
  if not callable(make):
    raise ValueError(f"make must be callable (observation_shape, hidden_sizes), got {make!r}")
  if isinstance(make, nn.Module) or (isinstance(make, type) and issubclass(make, nn.Module)):
    raise ValueError(f"make must be a function (observation_shape, hidden_sizes) -> Module, "
                     f"got the Module {getattr(make, '__name__', make)!r} itself: register "
                     "`lambda observation_shape, hidden_sizes: Module(...)`")  # fmt: skip
  old = _REGISTERED.get(name, make)
  if not redefines(make, old):
    raise ValueError(f"torso {name!r} is registered with another make "
                     f"({getattr(old, '__qualname__', old)}): choose another name")  # fmt: skip
  _REGISTERED[name] = make


def torso_kind(kind: str, observation_shape: tuple[int, ...]) -> str:
  """The torso `make_torso(kind, observation_shape)` builds: `kind` itself, or for "auto"
  mlp (rank-1 observations), minatar_cnn (frames up to SMALL_FRAME x SMALL_FRAME) or
  nature_cnn (larger frames).

  Raises:
    ValueError: "auto" for observations of another rank.
  """
  if kind != "auto":
    return kind
  observation_shape = _checks.check_sizes("torso_kind", "observation_shape", observation_shape)
  rank = len(observation_shape)
  small = rank == 3 and max(observation_shape[1:]) <= SMALL_FRAME
  kind = "mlp" if rank == 1 else "minatar_cnn" if small else "nature_cnn" if rank == 3 else ""
  if not kind:
    raise ValueError(
        f"no torso fits observations of shape {observation_shape}: torso 'mlp' (--torso "
        "mlp) flattens them, or register a torso of your own (networks.register_torso)"
    )
  return kind


def make_torso(
    kind: str, observation_shape: tuple[int, ...], hidden_sizes: Sequence[int] = (64, 64)
) -> nn.Module:
  """Builds a torso, checking that it fits the observation shape.

  Args:
    kind: "mlp" (vector observations), "nature_cnn", "impala_resnet", "small_cnn" or
      "minatar_cnn" (frames [C, H, W]), or "auto" (mlp for rank-1 observations; for rank
      3, minatar_cnn up to SMALL_FRAME x SMALL_FRAME, else nature_cnn).
    observation_shape: one observation's shape.
    hidden_sizes: MLP layer sizes.

  Raises:
    ValueError: an observation shape or hidden sizes that are not tuples (or lists) of
      positive ints; an unknown torso, or one that does not fit the observations.
  """
  observation_shape = _checks.check_sizes("make_torso", "observation_shape", observation_shape)
  hidden_sizes = _checks.check_sizes("make_torso", "hidden_sizes", hidden_sizes)
  rank = len(observation_shape)
  kind = torso_kind(kind, observation_shape)
  if kind in _REGISTERED:
    return _registered_torso(kind, tuple(observation_shape), tuple(hidden_sizes))
  if kind not in TORSOS:
    raise ValueError(
        f"unknown torso {kind!r}; choose one of {TORSOS} or 'auto', or register your own with "
        "networks.register_torso(name, make) (in every process that trains or loads it; "
        "the scripts: --import-modules MODULE, the module that does)"
    )
  if kind == "mlp":
    return MLPTorso(tuple(hidden_sizes), observation_shape=tuple(observation_shape))
  if rank != 3:
    raise ValueError(
        f"torso {kind!r} needs [C, H, W] frames, got observation shape " f"{observation_shape}"
    )
  if _looks_channels_last(observation_shape):
    raise ValueError(
        f"torso {kind!r} takes [C, H, W] frames; observations of shape {observation_shape} "
        "look like [H, W, C]: move their channels first, or flatten them with torso 'mlp' "
        "(--torso mlp)"
    )
  _check_frames_fit(kind, tuple(observation_shape))
  return _PIXEL_TORSOS[kind]()


def _registered_torso(name: str, observation_shape: tuple[int, ...],
                      hidden_sizes: tuple[int, ...]) -> nn.Module:  # fmt: skip
  """Registered torso `name` for these observations, checked on shapes: [B, *shape] to
  [B, F]."""
  try:
    module = _REGISTERED[name](observation_shape, hidden_sizes)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"torso {name!r}: make(observation_shape, hidden_sizes) raised "
                     f"{type(e).__name__}: {e}") from e  # fmt: skip
  if not isinstance(module, nn.Module):
    raise ValueError(f"torso {name!r}: make(observation_shape, hidden_sizes) must return a "
                     f"flax.linen Module, got {module!r}")  # fmt: skip
  _check_torso_output(name, module, observation_shape)
  return module


def _check_torso_output(name: str, module: nn.Module, observation_shape: tuple[int, ...]) -> None:
  """Refuses (ValueError) a registered torso that does not map observations [B, *shape] to
  floating features [B, F], with parameters initialised on a batch of 2: for B = 2, and for
  B = 1 (one observation: evaluate.py, record_demos.py, `greedy_policy`), with the same F.
  Traced on shapes only, as `_check_frames_fit`."""
  key = jax.eval_shape(jax.random.key, 0)  # a typed key: any PRNG implementation
  two, one = (jax.ShapeDtypeStruct((b, *observation_shape), jnp.float32) for b in (2, 1))
  outs = {}
  for b, obs in ((2, two), (1, one)):
    try:
      outs[b] = jax.eval_shape(lambda k, x, y: module.apply(module.init(k, x), y), key, two, obs)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"torso {name!r} cannot take observations [B, *{observation_shape}] "
                       f"(B = {b}): {type(e).__name__}: {e}") from None  # fmt: skip
    out = outs[b]
    shape = getattr(out, "shape", None)
    if (
        not isinstance(out, jax.ShapeDtypeStruct)
        or len(shape) != 2
        or shape[0] != b
        or (b == 1 and shape[1] != outs[2].shape[1])
    ):
      got = type(out).__name__ if shape is None else shape
      hint = " (a .squeeze() drops the batch axis of one observation?)" * (b == 1)
      raise ValueError(f"torso {name!r} must map observations [B, *{observation_shape}] to "
                       f"features [B, F]; for B = {b} it gave {got}{hint}")  # fmt: skip
    if not jnp.issubdtype(out.dtype, jnp.floating):
      raise ValueError(f"torso {name!r} must return floating features [B, F], got {out.dtype}: "
                       "the layers before an int or bool output get no gradient and never "
                       "learn (return the floating values, e.g. before the cast)")  # fmt: skip


@functools.lru_cache(maxsize=None)
def _check_frames_fit(kind: str, observation_shape: tuple[int, ...]) -> None:
  """Raises ValueError when pixel torso `kind` cannot take frames of this shape. Traces
  its init on shapes only (nothing is computed, compiled or started: no JAX backend), once
  per torso and shape: an agent is rebuilt in every program that traces it (a sweep)."""
  key = jax.eval_shape(jax.random.key, 0)  # a typed key: any PRNG implementation
  frames = jax.ShapeDtypeStruct((1, *observation_shape), jnp.float32)
  try:
    jax.eval_shape(_PIXEL_TORSOS[kind]().init, key, frames)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f"torso {kind!r} does not fit frames of shape {observation_shape}: it takes [C, H, W] "
        f"frames large enough for its convolutions ({type(e).__name__}: {e})"
    ) from e
