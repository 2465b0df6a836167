"""The functional form of Contract 2: JAX-native environments (gymnax, brax) as pure functions.

docs/design.md, "Contract 2: environments", "Functional form". One environment at a time,
pure and jittable (vmap it for a batch), with the PRNG key inside the state:

    env = make_functional("gymnax:CartPole-v1", max_episode_steps=None)
    state, ts = env.reset(key)            # TimeStep of one environment: scalars, [*obs_shape]
    state, ts = env.step(state, action)   # auto-reset inside
    states, ts = jax.vmap(env.reset)(keys, jnp.arange(B))   # a batch, env_id = arange(B)

The TimeSteps follow ALF, as envpool's do through `envs.make` (`_timestep.py`): reset gives
FIRST (reward 0, discount 1); a step gives MID (discount 1), LAST with discount 0 when the
environment terminated, or LAST with discount 1 when the time limit was reached and the
environment did not terminate (termination wins when both happen on one step). The
observation at LAST is the true final observation. The step after a LAST step is the
auto-reset step of envpool: its action is ignored, the environment resets with a key drawn
from the state's key, and the step is FIRST with reward 0 and discount 1. The time limit
counts the actions taken in the episode: LAST comes at the step where that count reaches
`max_episode_steps` (as envpool's and gymnasium's `TimeLimit`).

Dtypes: step_type int32, reward float32, discount float32, env_id int32, observations
float32. Discrete actions are taken as integers and clipped to [0, num_actions) (a jitted
function cannot raise on a value); continuous ones as floats, clipped to the spec's bounds
(a NaN one is passed on: the simulator's observation and reward become NaN, on which a
training run stops).
A wrong action shape or dtype kind raises a ValueError when `step` is traced.

Adapters (`task_id` = "<prefix>:<name>"):

* `gymnax:<name>`: classic control and MinAtar (`GYMNAX_TASKS`). gymnax's own `step` reports
  one flag for termination and time limit and auto-resets inside, replacing the final
  observation; the adapter calls `step_env` and `reset_env` instead (no auto-reset, no time
  limit), with the environment parameters' `max_steps_in_episode` raised out of reach so that
  no gymnax version truncates by itself, and applies the time limit itself. Default time
  limit: gymnax's default `max_steps_in_episode` for the task (CartPole-v1 and Acrobot-v1
  500, MountainCar-v0 and Pendulum-v1 200, MountainCarContinuous-v0 999, MinAtar 1000,
  Freeway-MinAtar 2500). Termination is gymnax's `is_terminated` (checked per task: it never
  looks at the step count), with one addition: Freeway-MinAtar's game lasts 2500 steps by
  its rules (MinAtar's `terminate_timer`; Young & Tian 2019, arXiv:1903.03176), so reaching
  game step 2500 is a termination (discount 0) whatever the time limit, where gymnax 1.0
  reports it as a truncation. MinAtar's [H, W, C] grids are returned as float32 [C, H, W]
  (channels first, what the pixel torsos take). Keyword arguments go to `gymnax.make` (e.g.
  `use_minimal_action_set=False` for MinAtar).
* `brax:<name>`: `brax.envs.get_environment(name, backend=...)`, without brax's training
  wrappers (no episode wrapper, no auto-reset). Termination is the environment's own `done`;
  the time limit (default 1000, brax's training `episode_length`) is applied here. Actions
  lie in [-1, 1] (brax scales them to the actuators); `step` clips them. Default backend
  "spring" (docs/envs_notes.md has the CPU measurements behind it); keyword arguments go to
  `get_environment` (`backend=`, and the environment's own options).

gymnax and brax are optional (`pip install offpolicy_ac[jax-envs]`), imported when a task
of theirs is made.
"""

from __future__ import annotations

from collections.abc import Callable
import contextlib
import difflib
import importlib
import importlib.util
import inspect
import io
import sys
import types
from typing import Any
from typing import NamedTuple
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac._extras import require
from offpolicy_ac.envs._timestep import FIRST
from offpolicy_ac.envs._timestep import LAST
from offpolicy_ac.envs._timestep import MID
from offpolicy_ac.envs._timestep import EnvSpec
from offpolicy_ac.envs._timestep import TimeStep
from offpolicy_ac.envs._timestep import check_int
from offpolicy_ac.envs._timestep import check_key

__all__ = [
    "BRAX_BACKENDS",
    "BRAX_DEFAULT_BACKEND",
    "FunctionalEnv",
    "FunctionalEnvState",
    "FUNCTIONAL_PREFIXES",
    "GYMNAX_TASKS",
    "is_functional",
    "make_functional",
]

GYMNAX_TASKS: tuple[str, ...] = (
    "Acrobot-v1",
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "CartPole-v1",
    "Freeway-MinAtar",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Pendulum-v1",
    "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar",
)
"""The gymnax tasks `make_functional` takes ("gymnax:<name>"): those whose termination has
been checked against gymnax's source (see the module docstring)."""

# Game length that is a rule of the game, a termination (MinAtar's Freeway: 2500 steps).
_GAME_LENGTH = {"Freeway-MinAtar": 2500}

BRAX_BACKENDS: tuple[str, ...] = ("generalized", "positional", "spring", "mjx")
"""The physics backends of brax's environments (`backend=` of `make_functional`)."""

BRAX_DEFAULT_BACKEND = "spring"
"""The default brax backend: the fastest to compile and to run of the four on CPU (measured
with a jitted, vmapped scan of 256 environments; docs/envs_notes.md)."""

_BRAX_DEFAULT_LIMIT = 1000
FUNCTIONAL_PREFIXES = ("gymnax", "brax")
"""Prefixes of the JAX environments `make_functional` builds ("gymnax:CartPole-v1")."""

# gymnax's own time limit, raised out of reach (the adapter applies the time limit).
_NO_GYMNAX_LIMIT = 2**31 - 1


def is_functional(task_id: str) -> bool:
  """Whether `task_id` names a JAX environment ("gymnax:...", "brax:...") rather than an
  envpool task."""
  return (
      isinstance(task_id, str)
      and task_id.partition(":")[0] in FUNCTIONAL_PREFIXES
      and (":" in task_id)
  )


class FunctionalEnvState(NamedTuple):
  """The state of one functional environment (a pytree of arrays; batched under vmap).

  Attributes:
    inner: the simulator's state (gymnax's EnvState, brax's State).
    key: PRNG key of the next step (split once per step).
    elapsed: [] int32, actions taken in the current episode (0 at FIRST).
    needs_reset: [] bool, the last TimeStep was LAST: the next step resets.
    env_id: [] int32, the `env_id` put into every TimeStep.
  """

  inner: Any
  key: jax.Array
  elapsed: jax.Array
  needs_reset: jax.Array
  env_id: jax.Array


class FunctionalEnv(NamedTuple):
  """A JAX-native environment as pure functions (from `make_functional`).

  Attributes:
    reset: `reset(key, env_id=0) -> (FunctionalEnvState, TimeStep)`: a FIRST step (reward 0,
      discount 1). TimeStep fields are of one environment: `step_type`, `reward`,
      `discount`, `env_id` scalars, `observation` [*spec.observation_shape].
    step: `step(state, action) -> (FunctionalEnvState, TimeStep)`: MID, LAST (discount 0
      at a termination, 1 at the time limit) or, after LAST, the auto-reset FIRST step.
      `action` is [*spec.action_shape].
    spec: the `EnvSpec` (task_id = the full id, num_envs = batch_size = 1).
    max_episode_steps: the time limit applied: LAST at the step where the episode's action
      count reaches it.
  """

  reset: Callable[..., tuple[FunctionalEnvState, TimeStep]]
  step: Callable[[FunctionalEnvState, jax.Array], tuple[FunctionalEnvState, TimeStep]]
  spec: EnvSpec
  max_episode_steps: int

  def batch_spec(self, num_envs: int) -> EnvSpec:
    """The spec of `num_envs` copies stepped together (num_envs = batch_size)."""
    return self.spec._replace(num_envs=num_envs, batch_size=num_envs)


class _Simulator(NamedTuple):
  """What an adapter gives: the simulator without auto-reset or time limit.

  reset(key) -> (inner, observation); step(key, inner, action) -> (inner, observation,
  reward, terminated), the action already checked, cast and clipped.
  """

  reset: Callable[[jax.Array], tuple[Any, jax.Array]]
  step: Callable[[jax.Array, Any, jax.Array], tuple[Any, jax.Array, jax.Array, jax.Array]]
  spec: EnvSpec
  default_limit: int


def make_functional(
    task_id: str, max_episode_steps: int | None = None, **kwargs: Any
) -> FunctionalEnv:
  """Makes a JAX-native environment with ALF's TimeStep semantics, as pure functions.

  Args:
    task_id: "gymnax:<name>" (`GYMNAX_TASKS`, e.g. "gymnax:CartPole-v1",
      "gymnax:Breakout-MinAtar") or "brax:<name>" (e.g. "brax:inverted_pendulum",
      "brax:halfcheetah").
    max_episode_steps: the time limit, >= 1; None: the task's default (gymnax's
      `max_steps_in_episode`, 1000 for brax).
    **kwargs: gymnax: passed to `gymnax.make` (e.g. `use_minimal_action_set`); brax:
      passed to `brax.envs.get_environment`, `backend` ("generalized", "positional",
      "spring" or "mjx"; default `BRAX_DEFAULT_BACKEND`) among them.

  Returns:
    A `FunctionalEnv` whose `reset` and `step` are pure, jittable and vmappable.

  Raises:
    ValueError: an unknown prefix, task, backend or keyword argument, or a bad
      `max_episode_steps`, naming it and what is valid.
    ImportError: gymnax or brax is not installed.
  """
  if not isinstance(task_id, str) or ":" not in task_id:
    raise ValueError(
        f"task_id must be '<prefix>:<name>' with a prefix in {list(FUNCTIONAL_PREFIXES)}, "
        f"e.g. 'gymnax:CartPole-v1' or 'brax:inverted_pendulum'; got {task_id!r}"
    )
  prefix, name = task_id.split(":", 1)
  if prefix not in FUNCTIONAL_PREFIXES:
    raise ValueError(
        f"unknown prefix {prefix!r} of task_id {task_id!r}; valid: {list(FUNCTIONAL_PREFIXES)}"
    )
  if max_episode_steps is not None:
    check_int("max_episode_steps", max_episode_steps, 1, 2**31)  # an int32 step count
  sim = _gymnax(task_id, name, kwargs) if prefix == "gymnax" else _brax(task_id, name, kwargs)
  limit = sim.default_limit if max_episode_steps is None else int(max_episode_steps)
  game_length = _GAME_LENGTH.get(name) if prefix == "gymnax" else None
  reset, step = _with_timestep_semantics(sim, limit, game_length)
  return FunctionalEnv(reset, step, sim.spec, limit)


# ------------------------------------------------------------------ TimeStep semantics


def _strong(tree: Any, like: Any = None) -> Any:
  """`tree` with every leaf a strongly typed array of `like`'s dtype (default: its own), so
  that reset and step states have identical types (the select, scan carries, no retrace)."""
  like = tree if like is None else like
  return jax.tree.map(
      lambda x, t: jax.lax.convert_element_type(jnp.asarray(x), jnp.asarray(t).dtype), tree, like
  )


def _with_timestep_semantics(
    sim: _Simulator, limit: int, game_length: int | None
) -> tuple[Callable, Callable]:
  """`reset` and `step` of a `FunctionalEnv` over `sim` (see the module docstring)."""
  spec = sim.spec
  check_action = _action_checker(spec)

  def first_step(key: jax.Array, env_id: jax.Array) -> tuple[Any, TimeStep]:
    inner, obs = sim.reset(key)
    ts = TimeStep(jnp.int32(FIRST), jnp.float32(0.0), jnp.float32(1.0), obs, env_id)
    return _strong(inner), ts

  def reset(key: jax.Array, env_id: Any = 0) -> tuple[FunctionalEnvState, TimeStep]:
    check_key(key)
    if not isinstance(env_id, jax.core.Tracer):
      value = np.asarray(env_id)
      kind = value.dtype.kind
      if (
          isinstance(env_id, bool)
          or kind not in "iu"
          or np.any(value < 0)
          or np.any(value > np.iinfo(np.int32).max)
      ):
        raise ValueError(f"env_id must be an int in [0, 2**31) (the environment's index, "
                         f"int32), got {env_id!r}")  # fmt: skip
    env_id = jnp.asarray(env_id, jnp.int32)
    if env_id.ndim != 0:
      raise ValueError(f"env_id must be a scalar (vmap reset for a batch), got {env_id.shape}")
    key, sub = jax.random.split(key)
    inner, ts = first_step(sub, env_id)
    return FunctionalEnvState(inner, key, jnp.int32(0), jnp.bool_(False), env_id), ts

  def step(state: FunctionalEnvState, action: Any) -> tuple[FunctionalEnvState, TimeStep]:
    if not isinstance(state, FunctionalEnvState):
      raise ValueError(f"step expects a FunctionalEnvState, got {type(state).__name__}")
    action = check_action(action)
    key, sub = jax.random.split(state.key)

    # Both branches, then a select: under vmap a `lax.cond` on a batched flag computes both
    # anyway, and the explicit select compiles and runs faster (docs/envs_notes.md).
    reset_inner, reset_ts = first_step(sub, state.env_id)
    inner, obs, reward, terminated = sim.step(sub, state.inner, action)
    elapsed = state.elapsed + 1
    terminated = jnp.asarray(terminated, bool)
    if game_length is not None:  # the game's own end (gymnax's step counter)
      terminated = terminated | (inner.time >= game_length)
    last = terminated | (elapsed >= limit)
    ts = TimeStep(
        jnp.where(last, LAST, MID).astype(jnp.int32),
        jnp.asarray(reward, jnp.float32),
        jnp.where(terminated, 0.0, 1.0).astype(jnp.float32),
        obs,
        state.env_id,
    )
    # The reset's types (gymnax resets some fields with Python scalars).
    inner = _strong(inner, reset_inner)
    pick = lambda a, b: jnp.where(state.needs_reset, a, b)  # noqa: E731
    inner, ts = jax.tree.map(pick, (reset_inner, reset_ts), (inner, ts))
    elapsed = jnp.where(state.needs_reset, 0, elapsed).astype(jnp.int32)
    last = ~state.needs_reset & last
    return FunctionalEnvState(inner, key, elapsed, last, state.env_id), ts

  return reset, step


def _action_checker(spec: EnvSpec) -> Callable[[Any], jax.Array]:
  """Checks one action's shape and dtype kind (at trace time) and casts and clips it."""
  expected = tuple(spec.action_shape)
  if spec.is_discrete:
    high = spec.num_actions - 1
  else:
    low = np.asarray(spec.action_low, np.float32).reshape(expected)
    high = np.asarray(spec.action_high, np.float32).reshape(expected)

  def check(action: Any) -> jax.Array:
    action = jnp.asarray(action)
    if tuple(action.shape) != expected:
      raise ValueError(
          f"{spec.task_id}: action shape {tuple(action.shape)}, expected {expected} (one "
          "environment; vmap step for a batch)"
      )
    kind = action.dtype.kind
    if spec.is_discrete:
      if kind not in "iu":
        raise ValueError(
            f"{spec.task_id}: discrete actions must have an integer dtype, got {action.dtype}"
        )
      return jnp.clip(action, 0, high).astype(jnp.int32)
    if kind != "f":
      raise ValueError(
          f"{spec.task_id}: continuous actions must have a floating dtype, got {action.dtype}"
      )
    return jnp.clip(action.astype(jnp.float32), low, high)

  return check


# ------------------------------------------------------------------ adapters


def _bad_kwargs(task_id: str, factory: Callable, kwargs: dict[str, Any], reserved=()) -> None:
  """Raises a ValueError naming keyword arguments that `factory` does not take."""
  params = inspect.signature(factory).parameters
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
    return
  valid = sorted({n for n in params if n != "self"} | set(reserved))
  unknown = sorted(set(kwargs) - set(valid))
  if unknown:
    raise ValueError(f"unknown keyword argument(s) {unknown} for {task_id}; valid: {valid}")


def _unknown_name(task_id: str, name: str, valid: list[str]) -> ValueError:
  close = difflib.get_close_matches(name, valid, n=3)
  hint = f" (did you mean {close}?)" if close else ""
  return ValueError(f"unknown task {name!r} in {task_id!r}{hint}; valid: {valid}")


def _require(task_id: str, package: str, module: str) -> Any:
  """Imports `module` of an optional `package`, or says why it does not import (not
  installed, or installed and failing) and how to install it."""
  return require(task_id, package, "jax-envs", module)


# gymnax imports these at import time for rendering alone (about 1.5 s of a launch).
_GYMNAX_RENDERING = ("seaborn", "matplotlib.pyplot")


class _Deferred(types.ModuleType):
  """Stands in for a module in `sys.modules` until one of its attributes is read; then
  imports the module itself and forwards to it. (`importlib.util.LazyLoader` does not
  defer plain `import` statements on Python 3.11: the import reads the module's
  `__spec__`, which loads it.)"""

  def __getattr__(self, attribute: str) -> Any:
    name = self.__name__
    if sys.modules.get(name) is self:
      del sys.modules[name]
      parent, _, child = name.rpartition(".")
      if parent and getattr(sys.modules.get(parent), child, None) is self:
        delattr(sys.modules[parent], child)
    return getattr(importlib.import_module(name), attribute)


def _defer_imports(names: tuple[str, ...]) -> None:
  """Defers each named module not imported yet until first use (see `_Deferred`); a
  module that is not installed is left for its importer to report."""
  for name in names:
    if name in sys.modules:
      continue
    try:
      found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
      found = False
    if found:
      sys.modules[name] = _Deferred(name)


def _gymnax(task_id: str, name: str, kwargs: dict[str, Any]) -> _Simulator:
  if "gymnax" not in sys.modules:
    _defer_imports(_GYMNAX_RENDERING)
  gymnax = _require(task_id, "gymnax", "gymnax")
  from gymnax.environments import spaces

  if name not in GYMNAX_TASKS:
    raise _unknown_name(task_id, name, list(GYMNAX_TASKS))
  factory = getattr(gymnax.registration, "_registry", {}).get(name)  # private in gymnax 1.0
  if factory is not None:
    _bad_kwargs(task_id, factory, kwargs)
  try:
    env, params = gymnax.make(name, **kwargs)
  except TypeError as e:
    raise ValueError(f"bad keyword arguments {sorted(kwargs)} for {task_id}: {e}") from e
  default_limit = int(params.max_steps_in_episode)
  params = params.replace(max_steps_in_episode=_NO_GYMNAX_LIMIT)
  minatar = name.endswith("-MinAtar")
  obs_space, act_space = env.observation_space(params), env.action_space(params)
  obs_shape = tuple(int(d) for d in obs_space.shape)
  if minatar:  # [H, W, C] -> [C, H, W]
    obs_shape = (obs_shape[2], obs_shape[0], obs_shape[1])

  def observe(obs: jax.Array) -> jax.Array:
    obs = jnp.asarray(obs, jnp.float32)
    return jnp.transpose(obs, (2, 0, 1)) if minatar else obs.reshape(obs_shape)

  def reset(key):
    obs, inner = env.reset_env(key, params)
    return inner, observe(obs)

  def step(key, inner, action):
    obs, inner, reward, terminated, _ = env.step_env(key, inner, action, params)
    return inner, observe(obs), reward, terminated

  if isinstance(act_space, spaces.Discrete):
    spec = EnvSpec(task_id, obs_shape, "float32", True, int(act_space.n), (), "int32", None,
                   None, 1, 1)  # fmt: skip
  elif isinstance(act_space, spaces.Box):
    shape = tuple(int(d) for d in act_space.shape)
    low = np.broadcast_to(np.asarray(act_space.low, np.float64), shape).ravel()
    high = np.broadcast_to(np.asarray(act_space.high, np.float64), shape).ravel()
    spec = EnvSpec(task_id, obs_shape, "float32", False, None, shape, "float32",
                   tuple(low.tolist()), tuple(high.tolist()), 1, 1)  # fmt: skip
  else:  # pragma: no cover (every task of GYMNAX_TASKS has a Discrete or Box space)
    raise ValueError(f"{task_id}: unsupported action space {act_space}")
  return _Simulator(reset, step, spec, default_limit)


def _brax(task_id: str, name: str, kwargs: dict[str, Any]) -> _Simulator:
  # MuJoCo's MJX prints "Failed to import warp" twice when brax imports it without the
  # optional warp package (which no backend here uses): not the user's concern.
  with contextlib.redirect_stdout(io.StringIO()):
    brax_envs = _require(task_id, "brax", "brax.envs")

  registry = getattr(brax_envs, "_envs", {})  # brax has no public listing
  valid = sorted(registry)
  if registry and name not in valid:
    raise _unknown_name(task_id, name, valid)
  given = sorted(kwargs)  # the caller's (a failure below is theirs, not the default backend's)
  kwargs = {"backend": BRAX_DEFAULT_BACKEND, **kwargs}
  if kwargs["backend"] not in BRAX_BACKENDS:
    raise ValueError(
        f"unknown brax backend {kwargs['backend']!r} for {task_id}; valid: {list(BRAX_BACKENDS)}"
    )
  if registry:
    _bad_kwargs(task_id, registry[name].__init__, kwargs, reserved=("backend",))
  try:
    with warnings.catch_warnings():  # brax's notice that MJX is maintained (docs/anakin.md)
      warnings.filterwarnings("ignore", "Brax System", UserWarning)
      env = brax_envs.get_environment(name, **kwargs)
  except KeyError as e:
    raise _unknown_name(task_id, name, valid) from e
  except TypeError as e:
    raise ValueError(f"bad keyword arguments {given} for {task_id}: {e}") from e
  obs_shape = (int(env.observation_size),)
  act_shape = (int(env.action_size),)

  def reset(key):
    with jax.numpy_rank_promotion("allow"):  # brax relies on implicit rank promotion
      state = env.reset(key)
    return state, jnp.asarray(state.obs, jnp.float32).reshape(obs_shape)

  def step(key, inner, action):
    del key  # brax's dynamics are deterministic
    with jax.numpy_rank_promotion("allow"):
      state = env.step(inner, action)
    obs = jnp.asarray(state.obs, jnp.float32).reshape(obs_shape)
    return state, obs, state.reward, jnp.asarray(state.done) > 0.5

  ones = (1.0,) * act_shape[0]
  spec = EnvSpec(task_id, obs_shape, "float32", False, None, act_shape, "float32",
                 tuple(-x for x in ones), ones, 1, 1)  # fmt: skip
  return _Simulator(reset, step, spec, _BRAX_DEFAULT_LIMIT)
