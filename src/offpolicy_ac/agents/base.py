"""What every agent is: pure init / act / greedy_act / update functions.

    agent = make_impala(spec, config)          # validates, binds static settings
    state = agent.init(key)                     # AgentState (NamedTuple of arrays)
    action, extras = agent.act(state.params, obs, key)
    action = agent.greedy_act(state.params, obs)
    state, metrics = agent.update(state, batch) # batch: a time-major Trajectory

All functions are jit-compatible; `update` is jitted by the factory (`jit_update`). Keys are
split, never reused: an `update` that samples (ACER's, continuous SQL's) splits
`state.key` and stores the advanced key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Any
from typing import Callable
from typing import Iterable
from typing import NamedTuple
from typing import Optional
from typing import Sequence

import flax.errors
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from offpolicy_ac import envs
from offpolicy_ac import losses
from offpolicy_ac import networks


class AgentState(NamedTuple):
  """params: online network; target_params: target network (SQL) or average
  policy network (ACER), () when unused; opt_state: optax state; key: PRNG key;
  num_updates: int32 counter."""

  params: Any
  target_params: Any
  opt_state: Any
  key: jax.Array
  num_updates: jax.Array


class Agent(NamedTuple):
  """An agent's pure functions and the static facts the training loop needs.

  off_policy: whether `update` learns from replayed sequences (True) or only
    from each fresh unroll (False).
  fresh_update_first: for off-policy agents, also update on each fresh unroll
    before the replayed updates (ACER's on-policy step + replay ratio).
  """

  name: str
  init: Callable[[jax.Array], AgentState]
  act: Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, Any]]
  greedy_act: Callable[[Any, jax.Array], jax.Array]
  update: Callable[[AgentState, Any], tuple[AgentState, dict]]
  off_policy: bool
  spec: Any
  config: Any
  fresh_update_first: bool = False


@flax.struct.dataclass(eq=False)  # hashed by identity: `jax.jit(batch_fn)` works too
class BatchFn:
  """A transform of each replayed batch with data of its own (SQIL's demonstrations):
  `batch_fn(batch, key) -> batch` runs `fn(data, batch, key)`.

  A pytree whose leaves are those of `data`; `fn` is static. Drivers pass it *into*
  their compiled functions as an argument, so the data is an input buffer of the
  program: a function that closed over 1.5 GB of Atari demonstration frames would have
  XLA compile them into the program as a constant (minutes, and copies in memory).

  `check(spec)`, if given, refuses data that do not fit the task of `spec` (an
  `envs.EnvSpec`); the training drivers call it before anything compiles.
  """

  fn: Callable[[Any, Any, jax.Array], Any] = flax.struct.field(pytree_node=False)
  data: Any = None
  check: Optional[Callable[[Any], None]] = flax.struct.field(pytree_node=False, default=None)

  def __call__(self, batch: Any, key: jax.Array) -> Any:
    return self.fn(self.data, batch, key)


def as_batch_fn(batch_fn: Callable[[Any, jax.Array], Any]) -> BatchFn:
  """`batch_fn` as a `BatchFn`: itself if it is one, else one without data."""
  if isinstance(batch_fn, BatchFn):
    return batch_fn
  return BatchFn(fn=lambda data, batch, key: batch_fn(batch, key))


def check_is_agent(
    agent: Any, made_by: str, example: str = "functools.partial(make_impala, config=ImpalaConfig())"
) -> Agent:
  """`agent`, unless it is not an `Agent` (TypeError naming `made_by`, the factory that
  returned it, and an `example` of one: its first missing attribute failed deep in the
  training loop)."""
  if not isinstance(agent, Agent):
    raise TypeError(
        f"{made_by} must return an Agent (for example {example}), got {type(agent).__name__}"
    )
  return agent


def make_optimizer(
    name: str,
    learning_rate: float,
    max_grad_norm: float,
    *,
    eps: float = 1e-5,
    decay: float = 0.99,
    decay_updates: int = 0,
    decay_begin: int = 0,
) -> optax.GradientTransformation:
  """Global-norm clipping followed by Adam or RMSProp (IMPALA's: TF1's RMSPropOptimizer,
  whose mean square starts at 1 and takes `eps` inside the square root; starting at 0, as
  optax's default does, the first steps are up to 1 / sqrt(1 - decay) times the step size).

  `decay_updates` > 0: the step size stays at `learning_rate` for the first `decay_begin`
  updates, then falls linearly to 0 over `decay_updates` updates and stays at 0
  (`decay_begin` = 0: PPO's annealing over the run; > 0: a cool-down at its end); the
  optimizer state then also counts the updates. `decay_updates` = 0: a constant step size
  (`decay_begin` must be 0)."""
  check_positive("learning_rate", learning_rate)
  check_finite("learning_rate", learning_rate)
  check_positive("max_grad_norm", max_grad_norm)
  check_int("decay_updates", decay_updates, 0)
  check_int("decay_begin", decay_begin, 0)
  if decay_begin and not decay_updates:
    raise ValueError(
        f"decay_begin ({decay_begin}) is the update at which the step size starts to fall: "
        "it needs decay_updates > 0"
    )
  if decay_updates:
    learning_rate = optax.linear_schedule(
        learning_rate, 0.0, decay_updates, transition_begin=decay_begin
    )
  if name == "adam":
    opt = optax.adam(learning_rate, eps=eps)
  elif name == "rmsprop":
    opt = optax.rmsprop(learning_rate, decay=decay, eps=eps, initial_scale=1.0)
  else:
    raise ValueError(f"optimizer must be 'adam' or 'rmsprop', got {name!r}")
  return optax.chain(optax.clip_by_global_norm(max_grad_norm), opt)


def jit_update(spec: Any, agent: str) -> Callable[[Callable], Callable]:
  """Decorates `update(state, traj, ...)`: `jax.jit(update)`, traced without the losses'
  in-program action-range checks (`losses.without_range_checks`: their
  `checkify.debug_check` would give the update an effect, and jit dispatches a function
  with an effect through its slow Python path on every call). Its arguments are checked
  first: `state` an `AgentState`, `traj` a trajectory, and a trajectory of NumPy arrays
  (a hand-built batch, demonstrations) has its values checked on the host
  (`check_host_trajectory`)."""

  def decorate(update: Callable) -> Callable:
    jitted = jax.jit(losses.without_range_checks(_unread_actions_zeroed(update)))

    @functools.wraps(update)  # `__wrapped__`: the code it runs (`agents.check_registered`)
    def checked(state, traj, *args):
      check_update_arguments(state, traj, agent)
      check_host_trajectory(traj, spec, agent)
      with params_that_fit(agent, "update"):
        return jitted(state, traj, *args)

    return checked

  return decorate


def _unread_actions_zeroed(update: Callable) -> Callable:
  """`update(state, traj, ...)` on `traj` with float actions of 0 at its LAST steps. No
  transition starts there (Contract 1: a masked step may hold anything, and a finite
  action there changes nothing), but a network evaluated at every step's action
  (continuous ACER's and SQL's Q(s, a)) carried a NaN there into the gradients (as
  0 * NaN): NaN parameters."""

  @functools.wraps(update)
  def zeroed(state, traj, *args):
    action, step_type = traj.action, traj.step_type
    lead = np.shape(step_type)
    if (
        jnp.issubdtype(jnp.result_type(action), jnp.floating)
        and np.shape(action)[: len(lead)] == lead
    ):
      last = _trailing(step_type == envs.LAST, np.ndim(action))
      traj = traj._replace(action=jnp.where(last, jnp.zeros((), action.dtype), action))
    return update(state, traj, *args)

  return zeroed


def takes_params(agent: str) -> Callable[[Callable], Callable]:
  """Decorates `act(params, obs, key)` and `greedy_act(params, obs)`: refuses (TypeError)
  a whole `AgentState` given for the parameters (`act(state, ...)`), which would fail
  deep in Flax on a missing attribute, names parameters that do not fit the agent's
  networks (`params_that_fit`) and refuses (ValueError) a `key` that is not one PRNG key
  (`envs.check_key`; JAX's own "invalid PRNG key data" names no argument). Checked when
  traced, so it costs a jitted call nothing."""

  def decorate(fn: Callable) -> Callable:
    @functools.wraps(fn)  # `__wrapped__`: the code it runs (`agents.check_registered`)
    def checked(params, *args):
      if isinstance(params, AgentState):
        raise TypeError(
            f"{agent}'s {fn.__name__} takes the network parameters, state.params, got the "
            f"whole AgentState: {fn.__name__}(state.params, ...)"
        )
      if len(args) == 2:  # act(params, obs, key)
        envs.check_key(args[1], f"{agent}'s {fn.__name__}: ")
      with params_that_fit(agent, fn.__name__):
        return fn(params, *args)

    return checked

  return decorate


def takes_key(agent: str) -> Callable[[Callable], Callable]:
  """Decorates `init(key)`: refuses (ValueError) a `key` that is not one PRNG key, such as
  a seed (`init(0)`), naming the agent (`envs.check_key`)."""

  def decorate(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def checked(key):
      envs.check_key(key, f"{agent}'s {fn.__name__}: ")
      return fn(key)

    return checked

  return decorate


_MISFIT_PARAMS = (
    flax.errors.ScopeCollectionNotFound,
    flax.errors.ScopeParamNotFoundError,
    flax.errors.ScopeParamShapeError,
    flax.errors.ApplyScopeInvalidVariablesStructureError,
    flax.errors.ApplyScopeInvalidVariablesTypeError,
)
"""Flax's errors for variables that are not the network's: another structure (a missing
collection or parameter, `params["params"]`), or another shape (another task's)."""


@contextlib.contextmanager
def params_that_fit(agent: str, function: str):
  """Names the agent and its `function` where Flax refuses the parameters it was given as
  not its networks' (ValueError; Flax's own names a module path and no argument)."""
  try:
    yield
  except _MISFIT_PARAMS as e:
    raise ValueError(
        f"{agent}'s {function} got parameters that are not its networks' (another "
        f"structure, or another task's or settings' shapes): pass the params of this "
        f"agent's init (state.params) or of a run of its task and settings; "
        f"{type(e).__name__}: {str(e).splitlines()[0]}"
    ) from e


def check_update_arguments(state: Any, traj: Any, agent: str) -> None:
  """Refuses (TypeError) an `update` called with something else than an `AgentState` and
  a trajectory (`update(state.params, traj)`, or a dict of arrays), which would fail on a
  missing attribute."""
  if not isinstance(state, AgentState):
    raise TypeError(
        f"{agent}'s update takes the AgentState (agent.init(key), or the state the last "
        f"update returned), got {type(state).__name__}"
    )
  missing = [f for f in envs.Trajectory._fields if not hasattr(traj, f)]
  if missing:
    raise TypeError(
        f"{agent}'s update takes a time-major envs.Trajectory [T+1, B, ...] (a rollout's, or "
        f"a replayed batch), got {type(traj).__name__}, which has no {', '.join(missing)}"
    )


def check_host_trajectory(traj: Any, spec: Any, agent: str) -> None:
  """What the jitted update cannot check, checked on a trajectory's NumPy arrays (arrays
  on a device are not read: that would wait for them), as `envs.loss_inputs` reads them:

  - `env_id` constant along time, which a batch-major [B, T+1] trajectory breaks;
  - step types FIRST, MID or LAST, and a FIRST step only after a LAST one (otherwise the
    transition into an episode's first step is learned from: a target across episodes);
  - at the transitions that are learned from (those that leave a step that is not LAST;
    Contract 1: the others may hold anything), a discount in [0, 1], a finite reward,
    finite float observations at both ends and finite continuous actions;
  - discrete actions in [0, A) but at LAST steps, whose actions are never read.

  Each would otherwise train silently on the wrong data, or give NaN parameters."""
  env_id = getattr(traj, "env_id", None)
  if isinstance(env_id, np.ndarray) and env_id.ndim == 2 and np.any(env_id != env_id[:1]):
    t, b = np.argwhere(env_id != env_id[:1])[0]
    raise ValueError(
        f"{agent}'s update takes a time-major trajectory [T+1, B], whose env_id is constant "
        f"along time; traj.env_id[{t}, {b}] = {env_id[t, b]} differs from env_id[0, {b}] = "
        f"{env_id[0, b]}: is it batch-major [B, T+1]? (np.swapaxes(x, 0, 1) per field)"
    )
  step_type = getattr(traj, "step_type", None)
  if not isinstance(step_type, np.ndarray) or step_type.dtype.kind not in "iu":
    step_type = None  # on a device, or refused by the update's own checks
  if step_type is not None and step_type.ndim >= 1:
    _check_host_step_types(step_type, agent)
    real = step_type[:-1] != envs.LAST  # [T, B]: the transitions that are learned from
    _check_host_transitions(traj, real, spec, agent)
  action = getattr(traj, "action", None)
  if spec.is_discrete and isinstance(action, np.ndarray) and action.dtype.kind in "iu":
    bad = (action < 0) | (action >= spec.num_actions)
    # A LAST step's action starts no transition and is never learned from (Contract 1: a
    # masked step's action may hold anything), as the update on device arrays treats it.
    if step_type is not None and step_type.shape == action.shape[: step_type.ndim]:
      bad &= _trailing(step_type != envs.LAST, action.ndim)
    if np.any(bad):
      where = _first_index(bad)
      raise ValueError(
          f"{agent}'s update takes traj.action in [0, {spec.num_actions}) ({spec.task_id}'s "
          f"actions), got {action[where]} at index {where}"
      )


def _trailing(x: np.ndarray, ndim: int) -> np.ndarray:
  """`x` with trailing axes of size 1 up to `ndim` axes (to broadcast over a field's)."""
  return x.reshape(x.shape + (1,) * (ndim - x.ndim))


def _first_index(bad: np.ndarray) -> tuple[int, ...]:
  """The index of `bad`'s first True entry (row-major order)."""
  return tuple(int(i) for i in np.argwhere(bad)[0])


def _check_host_step_types(step_type: np.ndarray, agent: str) -> None:
  """Refuses step types other than FIRST, MID and LAST, and a FIRST step after one that
  is not LAST (step_type [T+1, B])."""
  names = {envs.FIRST: "FIRST", envs.MID: "MID", envs.LAST: "LAST"}
  unknown = ~np.isin(step_type, list(names))
  if np.any(unknown):
    where = _first_index(unknown)
    raise ValueError(
        f"{agent}'s update takes traj.step_type FIRST (0), MID (1) or LAST (2), got "
        f"{step_type[where]} at index {where}"
    )
  joined = (step_type[1:] == envs.FIRST) & (step_type[:-1] != envs.LAST)
  if np.any(joined):
    before = _first_index(joined)
    t, *b = before
    raise ValueError(
        f"{agent}'s update got traj.step_type{[t + 1, *b]} FIRST after "
        f"{names[int(step_type[before])]} at {list(before)}: an episode starts only after a "
        "LAST step, else the transition into its first step is learned from (a target "
        "across episodes). Is the trajectory batch-major [B, T+1]? The update takes it "
        "time-major, [T+1, B] (np.swapaxes(x, 0, 1) per field)"
    )


def _check_host_transitions(traj: Any, real: np.ndarray, spec: Any, agent: str) -> None:
  """Refuses the values that the transitions `real` [T, B] are learned from: their
  discounts outside [0, 1], non-finite rewards, observations or continuous actions."""

  def refuse(name: str, bad: np.ndarray, offset: int, need: str) -> None:
    bad = bad & _trailing(real, bad.ndim)
    if np.any(bad):
      where = _first_index(bad)
      at = (where[0] + offset, *where[1:])
      value = getattr(traj, name)[at]
      shown = f" = {value}" if np.size(value) <= 8 else f" (shape {np.shape(value)})"
      raise ValueError(
          f"{agent}'s update takes {need} at the transitions it learns from (those that "
          f"leave a step that is not LAST), got traj.{name}{list(at)}{shown}"
      )

  def host_field(name: str) -> np.ndarray | None:
    x = getattr(traj, name, None)
    ok = isinstance(x, np.ndarray) and x.shape[: real.ndim] == (real.shape[0] + 1, *real.shape[1:])
    return x if ok and x.dtype.kind in "iuf" else None

  if (discount := host_field("discount")) is not None:
    d = discount[1:]
    refuse(
        "discount",
        ~((d >= 0) & (d <= 1)),
        1,
        "traj.discount in [0, 1] (0 at a termination, else 1)",
    )
  if (reward := host_field("reward")) is not None:
    refuse("reward", ~np.isfinite(reward[1:]), 1, "finite rewards")
  if (obs := host_field("observation")) is not None and obs.dtype.kind == "f":
    finite = np.isfinite(obs).reshape(obs.shape[: real.ndim] + (-1,)).all(axis=-1)
    refuse("observation", ~finite[:-1], 0, "finite observations")
    refuse("observation", ~finite[1:], 1, "finite observations")
  action = host_field("action")
  if not spec.is_discrete and action is not None and action.dtype.kind == "f":
    finite = np.isfinite(action).reshape(action.shape[: real.ndim] + (-1,)).all(axis=-1)
    refuse("action", ~finite[:-1], 0, "finite actions")


def gradient_step(
    optimizer: optax.GradientTransformation, params: Any, opt_state: Any, grads: Any
) -> tuple[Any, Any, jax.Array]:
  """One optimizer step: (new params, new optimizer state, global norm of grads)."""
  updates, opt_state = optimizer.update(grads, opt_state, params)
  # The global norm as optax computes it (its `global_norm` is deprecated from 0.2.5 on;
  # its replacement, `optax.tree.norm`, is not in 0.2.4).
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
  return optax.apply_updates(params, updates), opt_state, norm


def polyak(target: Any, params: Any, tau) -> Any:
  """target <- (1 - tau) target + tau params (target networks, ACER's average network)."""
  return jax.tree.map(lambda t, p: (1.0 - tau) * t + tau * p, target, params)


def apply_batched(apply_fn: Callable, params: Any, obs: jax.Array, lead_dims: int = 2) -> Any:
  """Applies a batch-major network to [T, B, ...] observations (flattens T, B)."""
  lead = obs.shape[:lead_dims]
  flat = obs.reshape((-1,) + obs.shape[lead_dims:])
  out = apply_fn(params, flat)
  return jax.tree.map(lambda x: x.reshape(lead + x.shape[1:]), out)


def is_traced(value: Any) -> bool:
  """Whether a hyper-parameter is a traced array (hyper-parameters as data, see
  `agents.hyperparams`): the checks below skip it, so its range is the caller's to check
  on the concrete value (`agents.hyperparams.check_setting`) before tracing."""
  return isinstance(value, jax.core.Tracer)


def host_value(value: Any) -> Any:
  """A concrete JAX array as NumPy: compared inside a trace (a `lax.cond` branch), JAX
  would turn the comparison into a traced value."""
  return np.asarray(value) if isinstance(value, jax.Array) else value


def check_config(config: Any, config_cls: type, factory: str) -> None:
  """Raises unless `config` is a `config_cls` (another agent's config would fail at the
  first update, on a field it lacks) whose own `validate()` passes."""
  if not isinstance(config, config_cls):
    raise ValueError(f"{factory} takes {config_cls.__name__}, got {type(config).__name__}")
  check_bool_fields(config)
  config.validate()


def check_bool_fields(config: Any) -> None:
  """Raises unless every field of dataclass `config` annotated `bool` holds a bool (a
  setting given "no" would act as True)."""
  for f in dataclasses.fields(config):
    if f.type in ("bool", bool) and not isinstance(getattr(config, f.name), bool):
      raise ValueError(f"{f.name} must be True or False, got {getattr(config, f.name)!r}")


def unlike_default(value: Any, default: Any) -> str | None:
  """What `value` must be where its type is not that of its field's `default`, else None
  (also for defaults of other types): a dataclass of the default's class, True or False, an
  int (not a bool), a number (an int or float, not a bool), a str, a tuple or list of strs.
  For fields built from Python or read from JSON, which no parser gave their type."""
  if dataclasses.is_dataclass(default):
    name = type(default).__name__
    return None if type(value) is type(default) else f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  kinds = {bool: (isinstance(value, bool), "True or False"),
           int: (number and isinstance(value, int), "an int"),
           float: (number, "a number"),
           str: (isinstance(value, str), "a str"),
           tuple: (isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value),
                   "a tuple or list of strs")}  # fmt: skip
  ok, said = kinds.get(type(default), (True, ""))
  return None if ok else said


def _check_number(name: str, value: Any) -> None:
  """Raises unless `value` is a real number or a NumPy/JAX scalar of one (a string or a
  bool would be compared, or fail to compare, as something else; an array of several
  values is not one setting)."""
  value = host_value(value)
  kind = value.dtype.kind if isinstance(value, (np.ndarray, np.generic)) else None
  if kind not in ("i", "u", "f") and (
      isinstance(value, bool) or not isinstance(value, (int, float))
  ):
    raise ValueError(f"{name} must be a number, got {value!r}")
  if np.ndim(value):
    raise ValueError(
        f"{name} must be one number, got an array of shape {np.shape(value)} (several "
        "settings at once are a sweep: --sweep, TrainConfig.budget.sweep)"
    )


def check_in(name: str, value: float, low: float, high: float) -> None:
  if is_traced(value):
    return
  _check_number(name, value)
  if not (low <= host_value(value) <= high):
    raise ValueError(f"{name} must lie in [{low}, {high}], got {value}")


def check_positive(name: str, value: float) -> None:
  if is_traced(value):
    return
  _check_number(name, value)
  if not host_value(value) > 0:
    raise ValueError(f"{name} must be > 0, got {value}")
  _check_not_float32_zero(name, value, "at least")


FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).smallest_subnormal)

INT32_MAX = 2**31 - 1
"""The largest count a program holds (JAX's default integers are 32-bit)."""


def check_int32(name: str, value: int) -> None:
  """Raises unless the int `value` is at most `INT32_MAX` (a count the program holds)."""
  if value > INT32_MAX:
    raise ValueError(f"{name} must be below 2**31 (a 32-bit count in the program), got {value:,}")


def check_int(name: str, value: int, low: int) -> None:
  """Raises unless `value` is an int (not a bool) >= `low` and <= `INT32_MAX` (static
  settings: counts, which the program holds as 32-bit ints)."""
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    numpy_int = " (a NumPy integer: give int(value))" if isinstance(value, np.integer) else ""
    raise ValueError(f"{name} must be an int >= {low}, got {value!r}{numpy_int}")
  check_int32(name, value)


def check_hidden_sizes(sizes: Sequence[int]) -> None:
  """Raises unless `sizes` (a network's hidden layer widths) is a non-empty sequence of
  positive ints."""
  if (
      not isinstance(sizes, (tuple, list))
      or not sizes
      or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in sizes)
  ):
    raise ValueError(f"hidden_sizes must be positive ints, got {sizes!r}")


def check_finite(name: str, value: float) -> None:
  """Raises unless `value` is finite (a setting where inf or NaN means nothing)."""
  if is_traced(value):
    return
  _check_number(name, value)
  if not math.isfinite(host_value(value)):
    raise ValueError(f"{name} must be finite, got {value}")
  if abs(host_value(value)) > FLOAT32_MAX:
    raise ValueError(f"{name} must be at most {FLOAT32_MAX:g} in size, float32's largest "
                     f"value (the program computes in float32; it would be inf), got {value}")  # fmt: skip


def check_non_negative(name: str, value: float) -> None:
  if is_traced(value):
    return
  _check_number(name, value)
  if not host_value(value) >= 0:
    raise ValueError(f"{name} must be >= 0, got {value}")
  _check_not_float32_zero(name, value, "0 or at least")


def _check_not_float32_zero(name: str, value: float, must_be: str) -> None:
  """Raises for a value other than 0 that float32, which the program computes in, holds
  as 0."""
  if host_value(value) != 0 and np.float32(host_value(value)) == 0:
    raise ValueError(f"{name} must be {must_be} {FLOAT32_TINY:g}, float32's smallest "
                     f"positive value (the program computes in float32), got {value}")  # fmt: skip


def check_extras(traj: Any, keys: Sequence[str], agent: str) -> None:
  """Names what an update needs when the behaviour policy's outputs are missing from
  `traj.extras` (a KeyError deep in the loss otherwise)."""
  extras = traj.extras if isinstance(traj.extras, dict) else {}
  missing = [k for k in keys if k not in extras]
  if missing:
    raise ValueError(
        f"{agent}'s update needs the behaviour policy in traj.extras {list(keys)} "
        f"(as written by its act); missing {missing}, got keys {sorted(extras)}"
    )


def float32_loss_inputs(traj: Any, gamma: Any) -> envs.LossInputs:
  """`envs.loss_inputs` with the rewards and discounts in float32, the agents' dtype: with
  `jax_enable_x64` a NumPy trajectory's float64 rewards stay float64 (without it they turn
  float32 on entering JAX), and the losses refuse them beside float32 values."""
  li = envs.loss_inputs(traj, gamma)
  return li._replace(r_t=jnp.asarray(li.r_t, jnp.float32),
                     discount_t=jnp.asarray(li.discount_t, jnp.float32))  # fmt: skip


def check_trajectory(traj: Any, spec: Any, agent: str) -> None:
  """Refuses a trajectory [T+1, B, ...] whose observations or actions are not of the
  task's shapes (a parameter shape error deep in Flax, or a failed reshape, otherwise), or
  whose actions are not of its kind (`envs.check_traced_actions`: a float given to a
  discrete agent would be truncated to an index), or whose observations, actions or
  behaviour extras do not share the step types' [T+1, B] (a failed reshape, or an error
  naming a loss's argument, otherwise)."""
  for name, x, shape in (
      ("observation", traj.observation, spec.observation_shape),
      ("action", traj.action, spec.action_shape),
  ):
    if tuple(np.shape(x)[2:]) != tuple(shape) or np.ndim(x) < 2:
      raise ValueError(
          f"{agent}'s update takes traj.{name} [T+1, B, *{tuple(shape)}] ({spec.task_id}'s "
          f"{name}s), got shape {tuple(np.shape(x))}"
      )
  lead = tuple(np.shape(traj.step_type))
  extras = traj.extras if isinstance(traj.extras, dict) else {}
  for name, x in (
      ("observation", traj.observation),
      ("action", traj.action),
      *((f"extras[{k!r}]", v) for k, v in extras.items()),
  ):
    if tuple(np.shape(x)[:2]) != lead:
      raise ValueError(
          f"{agent}'s update takes traj.{name} with the step types' [T+1, B] = {list(lead)} "
          f"leading axes, got shape {tuple(np.shape(x))}"
      )
  step = jax.ShapeDtypeStruct(np.shape(traj.action)[1:], jnp.result_type(traj.action))
  envs.check_traced_actions(spec, step, step.shape[0])


def check_spec(spec: Any, agent: str) -> None:
  """Raises unless `spec` is an `envs.EnvSpec` (a task id or another object failed on its
  first missing attribute)."""
  if not isinstance(spec, envs.EnvSpec):
    raise TypeError(
        f"{agent} takes an envs.EnvSpec (envs.spec(env_id, num_envs=...), or a run's "
        f"spec), got {type(spec).__name__} {spec!r:.80}"
    )
  problem = _spec_problem(spec)
  if problem:
    raise ValueError(f"{agent} got an EnvSpec for {spec.task_id!r} whose {problem}")


def _spec_problem(spec: Any) -> str | None:
  """What is wrong with a (hand-made) EnvSpec's fields, or None: each would otherwise fail
  deep in a network or a loss (an empty argmax, a division by zero, a failed reshape), or
  sample actions from an empty box."""

  def is_count(x: Any, low: int) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= low

  def is_shape(x: Any) -> bool:
    return isinstance(x, tuple) and all(is_count(n, 1) for n in x)

  if not is_shape(spec.observation_shape):
    return f"observation_shape is not a tuple of positive ints: {spec.observation_shape!r}"
  if not is_count(spec.num_envs, 1) or not is_count(spec.batch_size, 1):
    return f"num_envs and batch_size must be ints >= 1, got {spec.num_envs!r}, {spec.batch_size!r}"
  if spec.batch_size > spec.num_envs:
    return f"batch_size {spec.batch_size} exceeds num_envs {spec.num_envs}"
  if spec.is_discrete:
    if not is_count(spec.num_actions, 1) or spec.action_shape != ():
      return (f"discrete actions need num_actions an int >= 1 and action_shape (), got "
              f"{spec.num_actions!r} and {spec.action_shape!r}")  # fmt: skip
    return None
  if not is_shape(spec.action_shape) or not spec.action_shape:
    return f"continuous actions need an action_shape of positive ints, got {spec.action_shape!r}"
  size = math.prod(spec.action_shape)
  bounds = []
  for name in ("action_low", "action_high"):
    try:
      bound = np.asarray(getattr(spec, name), dtype=np.float64)
    except (TypeError, ValueError):
      bound = None
    if bound is None or bound.shape != (size,) or np.isnan(bound).any():
      return (f"{name} must hold one number per action dimension ({size} for action_shape "
              f"{spec.action_shape}), got {getattr(spec, name)!r}")  # fmt: skip
    bounds.append(bound)
  low, high = bounds
  if np.any(low > high):
    d = int(np.argmax(low > high))
    return f"action_low[{d}] = {low[d]} exceeds action_high[{d}] = {high[d]}"
  return None


def check_discrete(spec: Any, agent: str) -> None:
  check_spec(spec, agent)
  if not spec.is_discrete:
    raise ValueError(
        f"{agent} needs a discrete action space, but {spec.task_id} has continuous "
        f"actions of shape {spec.action_shape}"
    )


def check_swept_settings_used(config: Any, spec: Any, names: Iterable[str]) -> None:
  """Refuses (ValueError, "--sweep <field>: <why>") a sweep over a field of `names` that
  has no effect on the task of `spec` with this config (`unused_on`, as
  `check_settings_used`): its learners would train alike."""
  unused = getattr(config, "unused_on", lambda spec: {})(spec)
  for name in names:
    if name in unused:
      raise ValueError(f"--sweep {name}: {unused[name]}")


def check_settings_used(config: Any, spec: Any) -> None:
  """Refuses (ValueError, "<fields>: <why>") the settings of an agent config set off their
  defaults that have no effect on the task of `spec`: those its `unused_on(spec)` names
  (field -> why; a config without the method has none), a flag given and then without
  effect. For a run being configured (`run_experiment`), not for one rebuilt from its
  config.json, which trained as it was."""
  unused_on = getattr(config, "unused_on", None)
  if unused_on is None:
    return
  default = type(config)()
  by_why: dict[str, list[str]] = {}
  for field, why in unused_on(spec).items():
    value, usual = getattr(config, field), getattr(default, field)
    if not is_traced(value) and not np.array_equal(np.asarray(host_value(value)), usual):
      by_why.setdefault(why, []).append(field)
  if by_why:
    raise ValueError("; ".join(f"{', '.join(fields)}: {why}" for why, fields in by_why.items()))


def unused_mlp_sizes(config: Any, spec: Any) -> dict[str, str]:
  """{"hidden_sizes": why} where `config.torso` is, or picks ("auto"), a built-in pixel
  torso, which has no layers they size; else {}."""
  try:
    kind = networks.torso_kind(config.torso, tuple(spec.observation_shape))
  except ValueError:  # no torso fits: the factory says so
    return {}
  if kind not in networks.TORSOS or kind == "mlp":  # registered torsos are given them
    return {}
  return {"hidden_sizes": f"the {kind} torso has no layers they size (the mlp torso has)"}


def check_continuous(spec: Any, agent: str) -> None:
  check_spec(spec, agent)
  if spec.is_discrete:
    raise ValueError(
        f"{agent} needs a continuous action space, but {spec.task_id} has "
        f"{spec.num_actions} discrete actions"
    )
