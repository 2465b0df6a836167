"""The learner: agent, data transformer and replay state over a leading seed axis S.

    learner = Learner(agent, config, dp, num_seeds=S, batch_fn=None)
    state = learner.init(seeds)                       # LearnerState, every leaf [S, ...]
    acting = learner.acting(state)                    # S x Acting(params, transform)
    batch = learner.batch(trajs)                      # S raw trajectories [T+1, B]
    state, fresh, key = learner.ingest(state, batch)       # statistics, replay, fresh update
    state, metrics = learner.sample_and_update(state, key) # off-policy: replayed updates

One training iteration, per seed (docs/design.md, "The data path"):

1. the transformer's statistics are updated from the fresh raw unroll;
2. off-policy agents add the raw unroll to their sequence replay;
3. on-policy agents (and ACER's `fresh_update_first`) update on the fresh unroll. Like
   every batch, it is transformed with the statistics of step 1, which include it; its
   actors acted with the statistics before. With observation normalisation the learner's
   policy therefore sees other observations than the behaviour policy did, and V-trace's
   importance weights on fresh data are not all 1 (`clipped_rho_fraction` about 0.5 on
   MuJoCo, mean weight 1.0000). Transforming the fresh unroll with the actors' statistics
   instead (every weight 1) learned slower with the MuJoCo presets' settings
   (results/notes/mujoco.md);
4. off-policy agents then make `num_updates_per_train_iter` updates, each on a replay
   sample (passed through `batch_fn`, e.g. SQIL's demonstrations).

Every batch the agent learns from passes through `transformer.apply` exactly once, after
`batch_fn`; replay and demonstrations hold raw data. With S = 1 the functions run
unvmapped (the single-seed numerics; several learner devices split the batch, see
`parallel.DataParallel`); with S > 1 they are `jax.vmap`ped, so S seeds cost one
compiled update. A sweep's lanes (settings x seeds, `training/sweeps.py`) are seeds with
hyper-parameters: `Learner(..., hyperparams={field: [S]}, agent_at=...)` passes each
lane's into the vmapped functions and its `Acting`, where the agent is rebuilt with them
(`agents.hyperparams.with_hyperparams`); they are not part of `LearnerState`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import _memory
from offpolicy_ac import envs
from offpolicy_ac import replay as replay_lib
from offpolicy_ac.agents.base import Agent
from offpolicy_ac.agents.base import as_batch_fn
from offpolicy_ac.training.checkpoint import path_name
from offpolicy_ac.training.config import ReplayConfig
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.parallel import DataParallel


class LearnerState(NamedTuple):
  """Everything a checkpoint holds of the learner; every leaf has a leading seed axis.

  Attributes:
    agent: AgentState [S, ...].
    transform: the data transformer's TransformerState [S, ...].
    replay: ReplayState [S, ...] (None for on-policy agents).
    replay_key: [S, 2] PRNG keys of replay sampling.
  """

  agent: Any
  transform: Any
  replay: Any
  replay_key: jax.Array


class Acting(NamedTuple):
  """What the rollouts act with: the agent's parameters and the transformer state that
  normalises their observations (one seed, no seed axis), and, for a lane of a sweep,
  its hyper-parameters (`agents.hyperparams`: the agent acts as rebuilt with them; None:
  the agent as built)."""

  params: Any
  transform: Any
  hyperparams: Any = None


def make_transformer(spec: Any, config: TrainConfig) -> envs.DataTransformer:
  t = config.transform
  return envs.make_data_transformer(
      spec.observation_shape,
      normalize_observations=t.normalize_observations,
      obs_clip=t.obs_clip,
      reward_clip=t.reward_clip,
      reward_scale=t.reward_scale,
  )


def make_policies(agent: Agent, transformer: envs.DataTransformer,
                  agent_at: Optional[Callable[[Any], Agent]] = None) -> tuple[Callable, Callable]:  # fmt: skip
  """`act(acting, obs, key)` and `greedy(acting, obs)`: the agent's policies on
  observations transformed as the learner sees them. An `acting` with hyper-parameters
  acts with `agent_at(acting.hyperparams)`, the agent rebuilt with them (a sweep's lane:
  SQL's temperature and epsilon, for example, change how it acts)."""

  def policy(acting: Acting) -> Agent:
    if not isinstance(acting, Acting):  # the parameters alone, say (`LoadedRun.params`)
      raise TypeError(f"the run's act and greedy take an Acting (a LoadedRun's `acting`: its "
                      f"parameters with their observation transform), got "
                      f"{type(acting).__name__}; agent.act and agent.greedy_act take "
                      "the parameters")  # fmt: skip
    if acting.hyperparams is None:
      return agent
    if agent_at is None:
      raise ValueError("an Acting with hyper-parameters needs make_policies(..., agent_at)")
    return agent_at(acting.hyperparams)

  def act(acting: Acting, obs, key):
    return policy(acting).act(acting.params, transformer.observe(acting.transform, obs), key)

  def greedy(acting: Acting, obs):
    return policy(acting).greedy_act(acting.params, transformer.observe(acting.transform, obs))

  return act, greedy


def make_replay(config: TrainConfig) -> replay_lib.SequenceReplay:
  """The sequence replay of an off-policy learner; refuses one that holds less than an
  iteration adds (num_envs sequences per unroll, `unrolls_per_iteration` unrolls)."""
  r = config.replay
  added = config.env.num_envs * config.unrolls_per_iteration
  if r.replay_capacity < added:
    raise ValueError(
        f"replay_capacity ({r.replay_capacity}) holds fewer sequences than one iteration "
        f"adds ({added}: num_envs x {config.unrolls_per_iteration} unrolls)"
    )
  return replay_lib.make_sequence_replay(
      capacity=r.replay_capacity,
      sequence_length=config.env.unroll_length + 1,
      sample_length=r.mini_batch_length + 1,
      batch_size=r.mini_batch_size,
  )


def check_replay_fits(data_shapes: Any, copies: int, replay: ReplayConfig,
                      devices: int = 1) -> None:  # fmt: skip
  """Refuses a replay buffer and sampled batch larger than the default device has free,
  before they are allocated (too many sequences, or too many windows a batch, ended the
  process, or its run, in an allocation error).

  Args:
    data_shapes: one learner's `ReplayState.data` ([capacity, L, ...] leaves), as arrays
      or `jax.ShapeDtypeStruct`s.
    copies: learners holding such a buffer (seeds or a sweep's lanes).
    replay: the buffer's and the batches' sizes.
    devices: devices that share the default device's memory and each hold the copies
      (a learner's CPU devices, all in the host's memory; on a GPU each has its own).

  Raises:
    ValueError: they need more bytes than the device has free.
  """
  leaves = jax.tree.leaves(data_shapes)
  row = sum(int(np.prod(x.shape[1:])) * np.dtype(x.dtype).itemsize for x in leaves)
  window = row * (replay.mini_batch_length + 1) // leaves[0].shape[1]
  need = devices * copies * (replay.replay_capacity * row + replay.mini_batch_size * window)
  lanes = f", x {copies} learners (seeds or sweep settings)" if copies > 1 else ""
  lanes += f", x {devices} CPU devices (a copy each, in the host's memory)" * (devices > 1)
  _memory.check_device_fits(
      need, what="the replay buffer and a sampled batch need",
      details=f"replay_capacity {replay.replay_capacity:,} sequences of {row:,} bytes, "
              f"mini_batch_size {replay.mini_batch_size:,} windows of {window:,} bytes{lanes}",
      hint="lower replay_capacity or mini_batch_size",
  )  # fmt: skip


def check_learns(agent: Agent, config: TrainConfig, batch_fn: Optional[Callable] = None) -> None:
  """Refuses SQIL without the demonstrations its `batch_fn` mixes into each batch (plain
  SQL under SQIL's name, otherwise), replay settings or a `batch_fn` given to an agent
  that learns on-policy (it has no replay: they would be ignored), n-step targets longer than the
  sampled windows (each window's targets stop at its end: an n_step above
  `mini_batch_length` acts as a shorter one), a replay ratio (ACER's) other than the loop's
  `num_updates_per_train_iter`, and a run that would make no update: an off-policy agent
  that learns only from its replay, with a budget that ends before the replay holds
  `min_replay_size` sequences. A `BatchFn` with a `check` checks its data against the
  agent's task (SQIL's demonstrations: `demos.check_demo_sequences`), and the agent's
  policies are traced once against its task (`check_policies`)."""
  check_policies(agent, config)
  if agent.name == "sqil" and batch_fn is None:
    raise ValueError(
        "sqil learns from demonstrations mixed into its replayed batches: give "
        "batch_fn=agents.make_sqil_batch_fn(demos.cut_episodes(...), ...) (experiments/sqil.py "
        "--demos FILE does)"
    )
  if not agent.off_policy and batch_fn is not None:
    raise ValueError(f"batch_fn changes replayed batches, and {agent.name} learns on-policy, "
                     "with no replay: it would be ignored")  # fmt: skip
  if getattr(batch_fn, "check", None) is not None:
    batch_fn.check(agent.spec)
  if not agent.off_policy:
    given = [
        f.name
        for f in dataclasses.fields(ReplayConfig)
        if getattr(config.replay, f.name) != getattr(ReplayConfig(), f.name)
    ]
    if given:
      raise ValueError(
          f"{', '.join(given)}: replay settings, and this agent learns on-policy, with no "
          "replay (IMPALA replays with --use-replay)"
      )
    return
  # ACER's replay ratio is the loop's replayed updates per iteration (the update reads one
  # batch): two values for one setting would leave one of them silently unused.
  ratio = getattr(agent.config, "replay_ratio", None)
  updates = config.replay.num_updates_per_train_iter
  if ratio is not None and ratio != updates:
    raise ValueError(
        f"{agent.name}'s replay_ratio ({ratio}) is its replayed updates per iteration, and "
        f"num_updates_per_train_iter is {updates}: make them equal "
        f"(TrainConfig.of(num_updates_per_train_iter={ratio}); experiments/acer.py sets it "
        "from --replay-ratio)"
    )
  # SQL's n-step targets (lambda_ 0; its lambda_ is static: IMPALA's may be swept, an array)
  n_step, window = getattr(agent.config, "n_step", None), config.replay.mini_batch_length
  if n_step is not None and agent.config.lambda_ == 0 and n_step > window:
    raise ValueError(
        f"n_step ({n_step}) exceeds mini_batch_length ({window}): the targets stop at the "
        f"end of each sampled window; give --n-step {window} or less, or a longer "
        "--mini-batch-length"
    )
  if agent.fresh_update_first or config.planned_updates(off_policy=True):
    return
  needed = config.filling_iterations * config.steps_per_iteration
  raise ValueError(
      f"the run would make no update: total_env_steps {config.budget.total_env_steps:,} "
      f"ends before the replay holds min_replay_size ({config.replay.min_replay_size}) "
      f"sequences; give at least {needed:,} env steps, or a smaller --min-replay-size"
  )


def check_policies(agent: Agent, config: TrainConfig) -> None:
  """Refuses (ValueError naming the function) an agent whose `init` state has no `params`
  and integer scalar `num_updates` attributes, whose `act` does not return an
  `(action, extras)` pair of [B, ...] arrays (`envs.call_policy`), or whose `act` or
  `greedy_act` actions on a batch of observations [spec.batch_size, ...] do not fit its
  task (`envs.check_traced_actions`); (TypeError) one whose `init`, `act` or `greedy_act`
  cannot be traced (NumPy on, or Python control flow over, traced values): before
  anything compiles, where `greedy_act` would fail at the first evaluation."""
  spec, key = agent.spec, jax.random.PRNGKey(0)
  state = _traced(agent, "init(key)", agent.init, key)
  counter = getattr(state, "num_updates", None)
  is_count = hasattr(counter, "dtype") and np.shape(counter) == () and counter.dtype.kind in "iu"
  if not (hasattr(state, "params") and is_count):
    raise ValueError(
        f"{agent.name}'s init must return a state with attributes params and num_updates (an "
        f"int32 scalar), as agents.AgentState has; got {type(state).__name__}"
        + (f" whose num_updates is {counter.dtype}{list(counter.shape)}"
           if hasattr(counter, "dtype") else "")
    )  # fmt: skip
  transformer = make_transformer(spec, config)
  act, greedy = make_policies(agent, transformer)
  acting = Acting(state.params, jax.eval_shape(transformer.init))
  shape = (spec.batch_size, *spec.observation_shape)
  obs = jax.ShapeDtypeStruct(shape, jnp.dtype(spec.observation_dtype))
  try:  # the rollouts' own check of act's output: an (action, extras) pair of [B, ...]
    action = _traced(agent, "act(params, obs, key)",
                     lambda a, o, k: envs.call_policy(act, a, o, k, spec.batch_size)[0],
                     acting, obs, key)  # fmt: skip
  except ValueError as e:
    raise ValueError(f"{agent.name}'s {e}") from None
  greedy_action = _traced(agent, "greedy_act(params, obs)", greedy, acting, obs)
  for name, action in (("act", action), ("greedy_act", greedy_action)):
    try:
      envs.check_traced_actions(spec, action, spec.batch_size)
    except ValueError as e:
      raise ValueError(f"{agent.name}'s {name} on observations {list(shape)}: {e}") from None


def _traced(agent: Agent, signature: str, fn: Callable, *args: Any) -> Any:
  """`jax.eval_shape(fn, *args)`, where `fn` calls the agent's `signature`: a function JAX
  cannot trace is refused naming the agent and the function (a bare
  TracerArrayConversionError from inside the learner otherwise)."""
  try:
    return jax.eval_shape(fn, *args)
  except (jax.errors.JAXTypeError, jax.errors.JAXIndexError) as e:
    raise TypeError(
        f"{agent.name}'s {signature} must be traceable by jax.jit: pure JAX on its array "
        f"arguments (no NumPy on them, no Python `if` or `int()` on their values, no "
        f"boolean-mask indexing); {type(e).__name__}: {str(e).splitlines()[0]}"
    ) from e


def example_trajectory(act: Callable, acting: Acting, spec: Any, config: TrainConfig,
                       num_columns: int) -> envs.Trajectory:  # fmt: skip
  """Zeros shaped like a rollout's trajectories [T+1, num_columns, ...]."""
  lead = (config.env.unroll_length + 1, num_columns)
  obs = jax.ShapeDtypeStruct(
      (num_columns,) + tuple(spec.observation_shape), jnp.dtype(spec.observation_dtype)
  )
  action, extras = jax.eval_shape(act, acting, obs, jax.random.PRNGKey(0))
  zeros = lambda s: jnp.zeros(lead + tuple(s.shape[1:]), s.dtype)
  return envs.Trajectory(
      step_type=jnp.zeros(lead, jnp.int32),
      reward=jnp.zeros(lead, jnp.float32),
      discount=jnp.zeros(lead, jnp.float32),
      observation=jnp.zeros(lead + tuple(spec.observation_shape), obs.dtype),
      env_id=jnp.zeros(lead, jnp.int32),
      action=zeros(action),
      extras=jax.tree.map(zeros, extras),
  )


# XLA options for a program that compiles fast and runs slower: no LLVM optimisation, and
# on a CPU the older kernel emitters (half the compile time of the new ones at -O0). For
# programs that run once (init) or briefly (`--compile-for startup`).
STARTUP_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0,
                           "xla_cpu_use_fusion_emitters": False}  # fmt: skip


def trace_init_lanes(init: Callable, *lanes: Any) -> jax.stages.Traced:
  """The traced program of `init_lanes(init, *lanes)`: its `out_info` is the stacked
  state's shapes, known before anything compiles; `run_once(traced, *lanes)` runs it."""
  each = jax.jit(lambda *lanes: jax.lax.map(lambda lane: init(*lane), lanes))
  return each.trace(*lanes)


def startup_compile_options() -> dict[str, Any]:
  """`STARTUP_COMPILE_OPTIONS` where the default backend is a CPU; elsewhere none (they
  are XLA:CPU's options: a GPU's compiler refuses `xla_cpu_use_fusion_emitters`)."""
  return STARTUP_COMPILE_OPTIONS if jax.default_backend() == "cpu" else {}


def run_once(traced: jax.stages.Traced, *args: Any) -> Any:
  """Compiles a traced program for startup (`startup_compile_options`: optimising a
  program that runs once costs more than it saves) and runs it on `args`."""
  return traced.lower().compile(startup_compile_options())(*args)


def init_lanes(init: Callable, *lanes: Any) -> Any:
  """`init` of every lane, stacked [N, ...]: one program that maps `init` over the lanes'
  arguments (each with a leading lane axis), compiled for startup (`run_once`).

  `lax.map`, not `vmap`: `jit(vmap(init))` deadlocks XLA:CPU for ACER (jax 0.10.2), and
  an eager `vmap` compiles each of init's operations on its own (seconds at launch).
  """
  return run_once(trace_init_lanes(init, *lanes), *lanes)


def take_lane(tree: Any, k: int) -> Any:
  """Lane (seed) `k` of a tree whose leaves have a leading lane axis."""
  return jax.tree.map(lambda x: x[k], tree)


def add_lane_axis(tree: Any) -> Any:
  """A tree of one lane with a lane axis of 1 in front of every leaf."""
  return jax.tree.map(lambda x: x[None], tree)


def _abstract(tree: Any) -> Any:
  """The arrays of `tree` as `jax.ShapeDtypeStruct`s, to compile a jitted function for
  them without holding them: an array placed on its devices (committed, as a jitted
  call's outputs and `device_put` to a device are) keeps its sharding, others none, as
  the jitted call would see them, so that the call reuses what was compiled."""

  def one(x):
    if not isinstance(x, (jax.Array, np.ndarray)):
      return x
    committed = isinstance(x, jax.Array) and x.committed
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if committed else None)

  return jax.tree.map(one, tree)


def _outputs_of(compiled: jax.stages.Compiled, args: Any) -> Any:
  """The outputs of a jitted call as `_abstract` gives them, from the program `compiled`
  for its `_abstract(args)`: placed (with the program's shardings) where an argument is,
  else not (a call on arrays none of which is placed returns none placed)."""
  placed = any(getattr(x, "sharding", None) is not None for x in jax.tree.leaves(args))
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if placed else None),
      compiled.out_info,
  )


RESERVED_METRICS = frozenset({
    "env_steps", "wall_time_s", "env_steps_per_s", "episode_return", "episode_length",
    "episodes", "num_updates", "dropped_trajectories", "policy_lag", "eval_return",
    "eval_return_min", "active", "episode_return_sum", "episode_length_sum", "updated",
    "data_finite", "actions_valid", "final",
})  # fmt: skip
"""Names of a metrics line's (and the compiled program's) own fields, which an agent's update
metric of the same name would overwrite."""


def _kind(x: Any) -> str:
  """An array's dtype and shape, as "float32[64, 4]"."""
  return f"{jnp.result_type(x)}{list(jnp.shape(x))}"


def checked_update(agent: Agent) -> Callable:
  """`agent.update`, its output checked where it is traced: `(state, metrics)`, the state
  of the structure, shapes and dtypes it came in with, the metrics a dict of numeric
  scalars by str names that are not the metrics line's own (`RESERVED_METRICS`)."""

  def update(agent_state: Any, batch: Any) -> tuple[Any, dict]:
    out = agent.update(agent_state, batch)
    where = f"{agent.name}'s update(state, batch) must return (state, metrics)"
    if not (isinstance(out, tuple) and len(out) == 2):
      kinds = [type(x).__name__ for x in out] if isinstance(out, (tuple, list)) else []
      raise ValueError(f"{where}; got a {type(out).__name__}{' of ' if kinds else ''}"
                       f"{', '.join(kinds)}")  # fmt: skip
    if jax.tree.structure(out[0]) != jax.tree.structure(agent_state):
      raise ValueError(
          f"{where}, the state of the structure it is given (a {type(agent_state).__name__});"
          f" got a {type(out[0]).__name__} of another structure"
      )
    given, got = jax.tree_util.tree_flatten_with_path(agent_state)[0], jax.tree.leaves(out[0])
    changed = [
        f"{path_name(path)} {_kind(x)} -> {_kind(y)}"
        for (path, x), y in zip(given, got)
        if _kind(x) != _kind(y)
    ]
    if changed:
      raise ValueError(f"{where}, the state's arrays of the shapes and dtypes it is given; "
                       f"got {', '.join(changed[:4])}")  # fmt: skip
    metrics = out[1]
    if not isinstance(metrics, dict):
      raise ValueError(f"{where}, the metrics a dict of scalars; got a {type(metrics).__name__}")
    names = [k for k in metrics if not isinstance(k, str)]
    if names:
      raise ValueError(f"{where}, the metrics' names str; got {names!r}")
    taken = sorted(set(metrics) & RESERVED_METRICS)
    if taken:
      raise ValueError(f"{where}; the metrics {taken} would overwrite the metrics line's own "
                       "fields: rename them")  # fmt: skip
    bad = [f"{k} ({type(v).__name__})" for k, v in metrics.items() if not _is_number(v)]
    if bad:
      raise ValueError(f"{where}, the metrics a dict of numeric scalars; got {', '.join(bad)}")
    shaped = [f"{k} of shape {jnp.shape(v)}" for k, v in metrics.items() if jnp.shape(v) != ()]
    if shaped:
      raise ValueError(f"{where}, the metrics a dict of scalars; got {', '.join(shaped)}")
    return out

  return update


def _is_number(value: Any) -> bool:
  """A Python number or a real (bool, int or float) array: a metrics line's value."""
  if isinstance(value, (bool, int, float)):
    return True
  return isinstance(value, (jax.Array, np.ndarray, np.generic)) and value.dtype.kind in "biuf"


def make_ingest(agent: Agent, transformer: envs.DataTransformer,
                replay: Optional[replay_lib.SequenceReplay],
                constrain: Callable = lambda batch: batch) -> Callable:  # fmt: skip
  """`ingest(state, traj) -> (state, (fresh metrics or None, sampling key or None))`:
  steps 1-3 of the module docstring for one seed (no seed axis)."""
  updates_fresh = not agent.off_policy or agent.fresh_update_first
  update = checked_update(agent)

  def ingest(state: LearnerState, traj: envs.Trajectory):
    transform = transformer.update(state.transform, traj)
    replay_state, replay_key, key = None, state.replay_key, None
    if replay is not None:  # every iteration draws its sampling key, learning or not
      replay_state = replay.add(state.replay, traj)
      replay_key, key = jax.random.split(state.replay_key)
    agent_state, metrics = state.agent, None
    if updates_fresh:
      agent_state, metrics = update(agent_state, constrain(transformer.apply(transform, traj)))
    return LearnerState(agent_state, transform, replay_state, replay_key), (metrics, key)

  return ingest


def make_sample_and_update(agent: Agent, transformer: envs.DataTransformer,
                           replay: replay_lib.SequenceReplay, batch_fn: Optional[Callable],
                           num_updates: int,
                           constrain: Callable = lambda batch: batch) -> Callable:  # fmt: skip
  """`sample_and_update(state, key) -> (state, mean metrics)`: step 4 of the module
  docstring for one seed (`num_updates` replayed updates, each on a fresh sample)."""
  update = checked_update(agent)

  def sample_and_update(state: LearnerState, key: jax.Array):
    def body(agent_state, key):
      batch_key, fn_key = jax.random.split(key)
      batch = replay.sample(state.replay, batch_key)
      if batch_fn is not None:
        batch = batch_fn(batch, fn_key)
      return update(agent_state, constrain(transformer.apply(state.transform, batch)))

    agent_state, metrics = jax.lax.scan(body, state.agent, jax.random.split(key, num_updates))
    return state._replace(agent=agent_state), jax.tree.map(jnp.mean, metrics)

  return sample_and_update


def mix_metrics(fresh: Any, replayed: Any, num_updates: int) -> Any:
  """Averages the fresh update's metrics in with the replayed ones at equal weight."""
  return jax.tree.map(lambda f, m: (f + num_updates * m) / (num_updates + 1), fresh, replayed)


_FITS_HINT = "lower num_envs, unroll_length or mini_batch_size, or the network's size"
_BATCH_FN_FITS_HINT = ("lower num_envs, unroll_length, mini_batch_size or the batch_fn's "
                       "windows (SQIL's demo_batch_size), or the network's size")  # fmt: skip


class Learner:
  """The jitted learner functions for S seeds (see the module docstring)."""

  def __init__(self, agent: Agent, config: TrainConfig, dp: DataParallel, *, num_seeds: int,
               batch_fn: Optional[Callable] = None, hyperparams: Optional[dict] = None,
               agent_at: Optional[Callable[[dict], Agent]] = None):  # fmt: skip
    """`hyperparams` ({tunable field: [S] array}, a sweep's lanes) come with `agent_at`,
    `agent_at(hp) -> Agent` the agent rebuilt with one lane's (traced) hyper-parameters
    (`agents.hyperparams.with_hyperparams`): every update, `init` and the policies use
    it. None: `agent` as built (the learner of seeds)."""
    if num_seeds > 1 and not dp.trivial:
      raise ValueError("vmapped seeds need a learner on one device")
    if (hyperparams is None) != (agent_at is None):
      raise ValueError("hyperparams and agent_at come together")
    self.agent, self.config, self.dp, self.num_seeds = agent, config, dp, num_seeds
    self.hyperparams = None if hyperparams is None else jax.device_put(dict(hyperparams))
    self._agent_at = agent_at
    self.transformer = make_transformer(agent.spec, config)
    check_learns(agent, config, batch_fn)
    self.replay = make_replay(config) if agent.off_policy else None
    self.act, greedy = make_policies(agent, self.transformer, agent_at)
    self.greedy = jax.jit(greedy)
    if self.replay is not None:  # refused here, before the run writes anything
      shapes = jax.eval_shape(self._replay_init, jax.random.PRNGKey(0))
      check_replay_fits(shapes.data, num_seeds, config.replay, devices=dp.copies_per_memory)
    # An argument of the compiled functions, not a constant in them (`agents.BatchFn`).
    self._batch_fn = None if batch_fn is None else dp.replicate(as_batch_fn(batch_fn))
    constrain = dp.constrain if num_seeds == 1 else (lambda batch: batch)
    num_updates = config.replay.num_updates_per_train_iter

    def ingest(state, traj, hp, _):
      agent_now = agent if hp is None else agent_at(hp)
      return make_ingest(agent_now, self.transformer, self.replay, constrain)(state, traj)

    def sample(state, key, hp, batch_fn):
      agent_now = agent if hp is None else agent_at(hp)
      return make_sample_and_update(agent_now, self.transformer, self.replay, batch_fn,
                                    num_updates, constrain)(state, key)  # fmt: skip

    # Trajectories of one seed come without a seed axis (`batch`), keys always with one.
    self._ingest = self._over_seeds(ingest, x_has_seed_axis=False)
    self._sample = self._over_seeds(sample, x_has_seed_axis=True)
    self._unstack = jax.jit(lambda tree: [take_lane(tree, k) for k in range(num_seeds)])
    self._refused: Optional[_memory.DoesNotFit] = None  # by the warm-up (`check_warm_up`)

  # -- the per-seed pure functions -------------------------------------------

  def _over_seeds(self, fn: Callable, *, x_has_seed_axis: bool) -> Callable:
    """`fn(state, x, hp, shared)` of one seed as a jitted function of [S, ...] state and
    hyper-parameters (None without a sweep) and of `shared`, the same for every seed (the
    `BatchFn`): vmapped for S > 1; for S = 1 the seed axis is dropped inside (no vmap),
    from `x` too when it has one.

    The state is donated: XLA writes the new state over the old one's buffers instead of
    copying every leaf, the replay buffer above all (an Atari preset's buffer is 1.5 GB
    of frames; `experiments/bench_replay.py`: a replay step about 100x slower copied).
    The caller must not use the state it passed in again."""
    if self.num_seeds > 1:
      return jax.jit(jax.vmap(fn, in_axes=(0, 0, 0, None)), donate_argnums=0)

    def single(state, x, hp, shared):
      x = take_lane(x, 0) if x_has_seed_axis else x
      state, out = fn(take_lane(state, 0), x, take_lane(hp, 0), shared)
      return add_lane_axis(state), None if out is None else add_lane_axis(out)

    return self.dp.jit(single, donate_argnums=0)

  # -- what the driver calls ---------------------------------------------------

  def init(self, seeds: list[int]) -> LearnerState:
    """Each seed's agent and replay keys as a single run with that seed draws them."""
    if len(seeds) != self.num_seeds:
      raise ValueError(f"{len(seeds)} seeds for a learner of {self.num_seeds}")
    keys = [jax.random.split(jax.random.PRNGKey(s)) for s in seeds]
    agent_keys = jnp.stack([k[0] for k in keys])
    if self.hyperparams is not None:  # each lane's agent, as the compiled run's init
      init = lambda key, hp: self._agent_at(hp).init(key)  # noqa: E731
      agent_state = init_lanes(init, agent_keys, self.hyperparams)
    else:
      agent_state = init_lanes(self.agent.init, agent_keys)
    transform = self.transformer.init()
    broadcast = lambda tree: jax.tree.map(
        lambda x: jnp.broadcast_to(x, (self.num_seeds,) + x.shape), tree
    )
    replay_state = None
    if self.replay is not None:
      act0 = Acting(take_lane(agent_state.params, 0), transform)
      example = self.example(act0, self.config.env.num_envs)
      # One program, so that each buffer is allocated once, with its lane axis: an eager
      # broadcast copied every leaf (at start-up, twice the memory of the largest).
      replay_state = jax.jit(lambda example: broadcast(self.replay.init(example)))(example)
    state = LearnerState(
        agent_state, broadcast(transform), replay_state, jnp.stack([k[1] for k in keys])
    )
    return self.dp.replicate(state)

  def _replay_init(self, key: jax.Array) -> replay_lib.ReplayState:
    """One learner's empty replay buffer (as `init` makes it)."""
    acting = Acting(self.agent.init(key).params, self.transformer.init())
    return self.replay.init(self.example(acting, self.config.env.num_envs))

  def example(self, acting: Acting, num_columns: int) -> envs.Trajectory:
    """Zeros shaped like this learner's trajectories [T+1, num_columns, ...]."""
    return example_trajectory(self.act, acting, self.agent.spec, self.config, num_columns)

  def acting(self, state: LearnerState) -> list[Acting]:
    """Each seed's parameters and transformer state (and a sweep's lane its
    hyper-parameters), split off in one compiled call."""
    acting = Acting(state.agent.params, state.transform, self.hyperparams)
    return self._unstack(self.dp.local(acting))

  def num_updates(self, state: LearnerState) -> np.ndarray:
    """[S] updates made so far (the parameters' version)."""
    return np.asarray(jax.device_get(self.dp.local(state.agent.num_updates)))

  def batch(self, trajs: list) -> Any:
    """The seeds' trajectories as one device batch: [T+1, B] laid out over the learner
    devices for S = 1, stacked on the host and copied once to [S, T+1, B] otherwise."""
    if self.num_seeds == 1:
      return self.dp.shard(trajs[0])
    return jax.device_put(jax.tree.map(lambda *xs: np.stack(xs), *trajs))

  @staticmethod
  def columns(batch: Any, num_seeds: int) -> int:
    """Sequences a batch adds to each seed's replay (its global batch width)."""
    return jax.tree.leaves(batch)[0].shape[1 if num_seeds == 1 else 2]

  def ingest(self, state: LearnerState, batch: Any) -> tuple[LearnerState, Any, Any]:
    """(state, the fresh update's metrics or None, this iteration's sampling key [S]);
    off-policy agents draw the key whether or not they learn this iteration."""
    state, (metrics, key) = self._ingest(state, batch, self.hyperparams, None)
    return state, metrics, key

  def sample_and_update(self, state: LearnerState, key: jax.Array) -> tuple[LearnerState, Any]:
    """The replayed updates, with the key `ingest` drew this iteration."""
    return self._sample(state, key, self.hyperparams, self._batch_fn)

  def mix(self, fresh: Any, replayed: Any) -> Any:
    """The iteration's metrics: the fresh update's (None: not updated on) averaged in with
    the replayed ones (None: no replayed updates) (`mix_metrics`); for values read back
    to the host."""
    if fresh is None or replayed is None:
      return replayed if fresh is None else fresh
    return mix_metrics(fresh, replayed, self.config.replay.num_updates_per_train_iter)

  def warm_up(self, state: LearnerState, batch: Any, acting: Acting) -> threading.Thread:
    """Compiles the iteration's programs (the update on an unroll, the replayed updates)
    and the greedy policy of the evaluations for the shapes of `state`, `batch` (an
    unroll of each lane, as `batch` gives it) and `acting` (a lane's), in a thread while
    the first unrolls run; the first real calls reuse them. Only compiled, not run: the
    warm-up holds no copy of the state (whose replay buffer can be most of the memory the
    run may use) and its error is dropped (the real call raises it). Wait for it
    (`finished`) before the first real update, then call `check_warm_up`: a program of the
    iteration that needs more memory than the device has free (XLA's analysis,
    `_memory.program_bytes`) is refused there, before it runs (a CPU's process was killed
    by the kernel as it ran, with no word of why)."""
    self._refused = None
    spec, config = self.agent.spec, self.config
    state, batch, hp, acting, batch_fn = _abstract((state, batch, self.hyperparams, acting,
                                                   self._batch_fn))  # fmt: skip
    eval_obs = jax.ShapeDtypeStruct((config.eval.eval_episodes, *spec.observation_shape),
                                    jnp.dtype(spec.observation_dtype))  # fmt: skip

    def run():
      try:
        lanes = f" x {self.num_seeds} learners" * (self.num_seeds > 1)
        ingest = self._check_fits(self._ingest, (state, batch, hp, None),
                                  "an update on one unroll needs",
                                  f"num_envs {config.env.num_envs:,} x unroll_length "
                                  f"{config.env.unroll_length} steps{lanes}")  # fmt: skip
        if self.replay is not None:
          ingested, (_, key) = _outputs_of(ingest, (state, batch, hp))
          size, length = config.replay.mini_batch_size, config.replay.mini_batch_length
          # A batch_fn adds to the windows (SQIL: its demonstrations' half of each batch).
          added = " and the batch_fn's (SQIL's demo_batch_size)" * bool(batch_fn)
          self._check_fits(self._sample, (ingested, key, hp, batch_fn),
                           "the replayed updates need",
                           f"mini_batch_size {size:,} windows of mini_batch_length {length} "
                           f"steps{lanes}{added}",
                           hint=_BATCH_FN_FITS_HINT if batch_fn else _FITS_HINT)  # fmt: skip
        self.greedy.trace(acting, eval_obs).lower().compile()
      except _memory.DoesNotFit as e:
        self._refused = e
      except Exception:  # pylint: disable=broad-except  (raised again by the real call)
        pass

    # Not a daemon: a run stopped before its first update does not wait for it (`finished`),
    # and a daemon thread still in XLA when the interpreter exits aborts the process; the
    # exit waits for it instead (a script's `os._exit` does not).
    thread = threading.Thread(target=run, daemon=False, name="warm-up")
    thread.start()
    return thread

  @staticmethod
  def finished(thread: threading.Thread, should_stop: Callable[[], bool]) -> bool:
    """Waits for a compilation `thread` (the warm-up, a compiled run's programs); False
    as soon as `should_stop` says so (a stop signal does not wait for the compilation,
    which XLA cannot interrupt: minutes for a large network)."""
    while thread.is_alive():
      if should_stop():
        return False
      thread.join(0.05)
    return True

  def check_warm_up(self) -> None:
    """Raises the warm-up's refusal (`_memory.DoesNotFit`), if any; after joining it."""
    if self._refused is not None:
      raise self._refused

  def _check_fits(self, jitted: Callable, args: tuple, what: str, details: str,
                  hint: str = _FITS_HINT) -> jax.stages.Compiled:  # fmt: skip
    """`jitted` compiled for `args` (arrays or their `_abstract` shapes; a jitted call on
    such arrays then reuses it), refused (`_memory.DoesNotFit`) where it needs more memory
    than the default device has free. XLA's analysis is of one device's share; the
    learner's CPU devices each run theirs in the host's memory."""
    compiled = jitted.trace(*args).lower().compile()
    devices = self.dp.copies_per_memory
    details += f", x {devices} CPU devices (each its share, in the host's memory)" * (devices > 1)
    _memory.check_device_fits(
        devices * (_memory.program_bytes(compiled) or 0), what=what, details=details,
        hint=hint,
    )  # fmt: skip
    return compiled
