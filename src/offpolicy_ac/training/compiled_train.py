"""The whole training iteration as one compiled program (Anakin; Hessel et al. 2021,
"Podracer architectures for scalable reinforcement learning", arXiv:2104.06272).

    compiled = make_train(make_impala, ImpalaConfig(), TrainConfig.of(env_id="gymnax:CartPole-v1"))
    state, metrics = jax.jit(compiled.train)(jax.random.PRNGKey(0), compiled.hyperparams)
    # a sweep: one learner per (setting, seed), one program
    keys, hps = ...                                  # [N, 2], {"learning_rate": [N], ...}
    states, metrics = jax.jit(jax.vmap(compiled.train))(keys, hps)

With an environment written in JAX (`envs.make_functional`: gymnax, brax) nothing leaves
the device during training: each iteration unrolls the policy on `num_envs` environments
(`envs.make_functional_rollout`), updates the data transformer, adds the unroll to the
replay, makes the agent's updates (`learner.make_ingest`, `learner.make_sample_and_update`:
the same per-seed functions as the envpool driver's) and, when due, evaluates the greedy
policy; a `lax.scan` runs the iterations. Everything is a pure function of `(key,
hyperparams)`:

* `hyperparams` are the agent config's tunable numbers as arrays (`agents.hyperparams`),
  so `jax.vmap` over them trains a sweep in one program;
* the state (`AnakinState`) is a pytree that holds the environments too, so a checkpoint
  is the whole run, and a resumed run repeats the uninterrupted one exactly (no segment
  cuts as with envpool's environments).

`metrics` are arrays with a leading iteration axis: env steps so far, the sums and count
of the episodes that finished during the iteration (raw environment rewards), whether the
unroll's rewards and observations were all finite (`data_finite`), whether the policy's
actions were all in the task's range (`actions_valid`: discrete ones in [0, num_actions),
continuous ones finite; the environment clips the others, while the trajectory keeps them
as produced), the agent's
update metrics (NaN where it made no update, e.g. while the replay fills) and, in `train`,
the greedy evaluation's mean and minimum return (NaN where none was due: evaluations fall
on the first iteration at or after each multiple of `TrainConfig.eval_interval` env
steps). `train` runs the whole budget; `run` runs one chunk of `iterations_per_chunk`
iterations and `evaluate` evaluates a state's greedy policy, for a host that logs,
evaluates, checkpoints and stops between chunks (`training/compiled_program.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Optional

import jax
import jax.numpy as jnp

from offpolicy_ac import envs
from offpolicy_ac.agents import hyperparams as hyperparams_lib
from offpolicy_ac.agents.base import INT32_MAX
from offpolicy_ac.agents.base import Agent
from offpolicy_ac.agents.base import check_is_agent
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.learner import Acting
from offpolicy_ac.training.learner import LearnerState
from offpolicy_ac.training.learner import check_learns
from offpolicy_ac.training.learner import example_trajectory
from offpolicy_ac.training.learner import make_ingest
from offpolicy_ac.training.learner import make_policies
from offpolicy_ac.training.learner import make_replay
from offpolicy_ac.training.learner import make_sample_and_update
from offpolicy_ac.training.learner import make_transformer
from offpolicy_ac.training.learner import mix_metrics

__all__ = ["AnakinState", "CompiledTrain", "make_train"]


class AnakinState(NamedTuple):
  """Everything a compiled run carries from one iteration to the next (one learner).

  Attributes:
    learner: the agent, data-transformer and replay state, as the envpool driver's
      `LearnerState` of one seed (no seed axis).
    rollout: the functional rollout's state: the environments, the pending actions,
      the running episode returns and the rollout's key.
    eval_key: PRNG key of the evaluations (folded with the iteration).
    iteration: int32, iterations done.
    env_steps: int32, environment steps taken (`train` refuses a budget past 2**31 - 1;
      the scripts, which step `run`, count a run's env steps on the host).
  """

  learner: LearnerState
  rollout: Any
  eval_key: jax.Array
  iteration: jax.Array
  env_steps: jax.Array


class CompiledTrain(NamedTuple):
  """The pure functions of a compiled run (see the module docstring) and its static facts.

  Attributes:
    train: `train(key, hyperparams) -> (AnakinState, metrics [iterations])`, the whole
      budget (a ValueError past 2**31 - 1 env steps, which its int32 count cannot hold).
    init: `init(key, hyperparams) -> AnakinState`. Both refuse a key that is not a PRNG
      key, and hyper-parameters given as concrete values that the agent's config refuses;
      traced ones (under `jax.jit` or `jax.vmap`) cannot be read: check a sweep's values
      with `agents.hyperparams.check_setting` first.
    run: `run(state, hyperparams, num_active) -> (state, metrics [iterations_per_chunk])`:
      the next `num_active` (<= iterations_per_chunk) iterations; the iterations past
      `num_active` change nothing (their metrics say `active` False).
    evaluate: `evaluate(state, hyperparams) -> (mean return, min return)` of the greedy
      policy over `eval_episodes` episodes, each on its own freshly reset environment
      (raw rewards), with a key folded from the state's evaluation key and iteration.
    hyperparams: the agent config's tunable fields as float32 scalars (the defaults).
    agent_at: `agent_at(hyperparams) -> Agent`, the agent with those hyper-parameters.
    env: the functional environment.
    config: the TrainConfig.
    iterations: iterations of the whole budget.
    iterations_per_chunk: iterations of one `run` call (one log line's worth, or less: at
      most the budget, and the spacing of evaluations and checkpoints).
    steps_per_iteration: env steps of one iteration (unroll_length x num_envs).
  """

  train: Callable
  init: Callable
  run: Callable
  evaluate: Callable
  hyperparams: dict
  agent_at: Callable[[dict], Agent]
  env: Any
  config: TrainConfig
  iterations: int
  iterations_per_chunk: int
  steps_per_iteration: int


def _unset(shapes: Any) -> Any:
  """Arrays shaped like `shapes` that say "not computed": NaN for floats, zeros (False)
  otherwise."""

  def fill(s):
    empty = jnp.nan if jnp.issubdtype(s.dtype, jnp.floating) else 0
    return jnp.full(s.shape, empty, s.dtype)

  return jax.tree.map(fill, shapes)


def greedy_returns(env: Any, greedy: Callable, acting: Acting, key: jax.Array,
                   num_episodes: int) -> tuple[jax.Array, jax.Array]:  # fmt: skip
  """Mean and minimum return of the greedy policy over `num_episodes` episodes of the
  functional environment `env`, each on its own freshly reset environment (raw
  rewards): the protocol of `training.evaluate`, as one compiled loop."""
  env_states, ts = jax.vmap(env.reset)(
      jax.random.split(key, num_episodes), jnp.arange(num_episodes, dtype=jnp.int32)
  )
  returns = jnp.zeros((num_episodes,), jnp.float32)
  finished = jnp.zeros((num_episodes,), bool)

  def cond(carry):
    _, _, _, finished, steps = carry
    return jnp.logical_and(~finished.all(), steps <= env.max_episode_steps)

  def body(carry):
    env_states, ts, returns, finished, steps = carry
    action = greedy(acting, ts.observation)
    env_states, ts = jax.vmap(env.step)(env_states, action)
    returns = returns + jnp.where(finished, 0.0, ts.reward)
    finished = finished | (ts.step_type == envs.LAST)
    return env_states, ts, returns, finished, steps + 1

  carry = (env_states, ts, returns, finished, jnp.zeros((), jnp.int32))
  _, _, returns, _, _ = jax.lax.while_loop(cond, body, carry)
  return returns.mean(), returns.min()


def learn(agent: Agent, transformer: envs.DataTransformer, replay: Any,
          batch_fn: Optional[Callable], num_updates: int, min_replay: int,
          learner: LearnerState, traj: envs.Trajectory) -> tuple[LearnerState, Any, Any]:  # fmt: skip
  """One learner iteration on a fresh unroll: `learner.make_ingest`, then, once the replay
  holds `min_replay` sequences, `learner.make_sample_and_update`. Returns (learner,
  metrics, whether the agent updated)."""
  learner, (fresh, key) = make_ingest(agent, transformer, replay)(learner, traj)
  if replay is None:
    return learner, fresh, jnp.asarray(True)
  sample = make_sample_and_update(agent, transformer, replay, batch_fn, num_updates)
  can_learn = learner.replay.size >= min_replay
  skipped = _unset(jax.eval_shape(sample, learner, key)[1])
  learner, replayed = jax.lax.cond(can_learn, sample, lambda s, k: (s, skipped), learner, key)
  if fresh is None:
    return learner, replayed, can_learn
  mixed = mix_metrics(fresh, replayed, num_updates)
  return learner, jax.tree.map(lambda m, f: jnp.where(can_learn, m, f), mixed, fresh), True


def _iterations_per_chunk(config: TrainConfig) -> int:
  """About one log line's worth of iterations, but no more than the budget's or than the
  spacing of the evaluations and checkpoints the host stops at: every call scans all of
  its iterations."""
  spacings = [config.budget.log_every, config.eval_interval, config.checkpoint.checkpoint_every]
  steps = min(s for s in spacings if s > 0)
  return max(1, min(-(-steps // config.steps_per_iteration), config.planned_iterations))


def _check_int32_budget(config: TrainConfig) -> None:
  """Refuses (ValueError) a budget past what `train`'s int32 count of env steps holds."""
  iterations, steps_per_iteration = config.planned_iterations, config.steps_per_iteration
  if iterations * steps_per_iteration > INT32_MAX:
    raise ValueError(
        f"train runs at most 2**31 - 1 env steps (it counts them in 32-bit ints), got "
        f"{iterations:,} iterations of {steps_per_iteration:,}: a longer budget runs in "
        "chunks of `run`, as the scripts run it, counting env steps on the host"
    )


def _eval_interval_in_train(config: TrainConfig) -> int:
  """`config.eval_interval`, or 0 (no evaluation) where it is past the whole budget, which
  `train`'s int32 count of env steps never reaches."""
  planned = config.planned_iterations * config.steps_per_iteration
  return config.eval_interval if config.eval_interval <= planned else 0


def _run_keys(key: jax.Array) -> tuple[jax.Array, ...]:
  """The (agent, replay, rollout, evaluation) keys of a run's `key`, split as the envpool
  driver splits its seeds; refuses (ValueError) a `key` that is not a PRNG key."""
  envs.check_key(key, "train/init: ")
  agent_key, replay_key = jax.random.split(key)
  rollout_key, eval_key = jax.random.split(jax.random.fold_in(key, 1))
  return agent_key, replay_key, rollout_key, eval_key


def _check_concrete_hyperparams(agent_config: Any, hp: dict) -> None:
  """Refuses (ValueError naming the field) hyper-parameters given as concrete values that
  the agent's config refuses (`agents.hyperparams.check_setting`: a negative step size, a
  discount above 1, a temperature of 0). Traced values (under `jit` or `vmap`) cannot be
  read: check those with `check_setting` before tracing."""
  values = hp.items() if isinstance(hp, dict) else ()
  concrete = {k: v for k, v in values if not isinstance(v, jax.core.Tracer) and jnp.shape(v) == ()}
  if concrete:
    hyperparams_lib.check_setting(agent_config, {k: float(v) for k, v in concrete.items()})


def make_train(
    make_agent: Callable[[Any, Any], Agent],
    agent_config: Any,
    config: TrainConfig,
    *,
    env: Any = None,
    batch_fn: Optional[Callable] = None,
) -> CompiledTrain:
  """Builds the compiled run of an agent on a JAX environment.

  Args:
    make_agent: the agent's factory, `make_agent(spec, agent_config) -> Agent`
      (`make_impala`, `make_acer`, `make_sql`, `make_sqil`).
    agent_config: its config; the tunable fields (`agents.hyperparams`) become the
      `hyperparams` argument of `train`, the others stay static.
    config: the run's settings (`config.env.env_id` names a JAX environment,
      "gymnax:..." or "brax:..."); `seed`, `num_seeds` and the logging and checkpoint
      settings are the driver's business, not this function's.
    env: the functional environment (default: `envs.make_functional(env_id,
      max_episode_steps)`).
    batch_fn: `batch_fn(batch, key) -> batch` applied to each replayed batch (SQIL's
      demonstrations), as in `training.train`. Here it is part of the program: a
      `agents.BatchFn`'s data is compiled in as a constant (the envpool driver passes it
      as an argument), which suits the small demonstrations of a JAX environment.

  Raises:
    ValueError: a bad config, a config the compiled loop cannot run
      (`training.config.MODES`), or an agent that does not fit the environment; all before
      anything compiles.
    TypeError: `make_agent` returned something else than an Agent.
  """
  if not isinstance(config, TrainConfig):
    raise ValueError(f"config must be a TrainConfig, got {config!r}")
  config.validate()  # with what a compiled run cannot use (`config.MODES`)
  if not dataclasses.is_dataclass(agent_config) or isinstance(agent_config, type):
    raise ValueError(f"agent_config must be the agent's config dataclass, got {agent_config!r}")
  if env is None:
    env = envs.make_functional(config.env.env_id, max_episode_steps=config.env.max_episode_steps)
  spec = env.batch_spec(config.env.num_envs)
  agent = check_is_agent(make_agent(spec, agent_config), "make_agent", "agents.make_impala")
  check_learns(agent, config, batch_fn)
  defaults = hyperparams_lib.hyperparams_of(agent_config)
  transformer = make_transformer(spec, config)
  replay = make_replay(config) if agent.off_policy else None
  unroll_length, num_envs = config.env.unroll_length, config.env.num_envs
  steps_per_iteration, iterations = config.steps_per_iteration, config.planned_iterations
  eval_interval, per_chunk = _eval_interval_in_train(config), _iterations_per_chunk(config)
  num_updates, eval_episodes = config.replay.num_updates_per_train_iter, config.eval.eval_episodes
  min_replay = max(config.replay.min_replay_size, 1)

  def agent_at(hp: dict) -> Agent:
    return make_agent(spec, hyperparams_lib.with_hyperparams(agent_config, hp))

  def parts(hp: dict):
    """The agent with these hyper-parameters, its policies and its rollout."""
    agent = agent_at(hp)
    act, greedy = make_policies(agent, transformer)
    rollout = envs.make_functional_rollout(env, act, unroll_length=unroll_length,
                                           num_envs=num_envs)  # fmt: skip
    return agent, act, greedy, rollout

  def init(key: jax.Array, hp: dict) -> AnakinState:
    _check_concrete_hyperparams(agent_config, hp)
    agent, act, _, rollout = parts(hp)
    agent_key, replay_key, rollout_key, eval_key = _run_keys(key)
    agent_state = agent.init(agent_key)
    transform = transformer.init()
    acting = Acting(agent_state.params, transform)
    replay_state = None
    if replay is not None:
      replay_state = replay.init(example_trajectory(act, acting, spec, config, num_envs))
    learner = LearnerState(agent_state, transform, replay_state, replay_key)
    zero = jnp.zeros((), jnp.int32)
    return AnakinState(learner, rollout.init(acting, rollout_key), eval_key, zero, zero)

  def evaluate(state: AnakinState, hp: dict) -> tuple[jax.Array, jax.Array]:
    _, _, greedy, _ = parts(hp)
    acting = Acting(state.learner.agent.params, state.learner.transform)
    key = jax.random.fold_in(state.eval_key, state.iteration)
    return greedy_returns(env, greedy, acting, key, eval_episodes)

  def iteration(state: AnakinState, hp: dict):
    agent, _, _, rollout = parts(hp)
    learner = state.learner
    rollout_state, traj, stats = rollout.unroll(Acting(learner.agent.params, learner.transform),
                                                state.rollout)  # fmt: skip
    learner, metrics, updated = learn(agent, transformer, replay, batch_fn, num_updates,
                                      min_replay, learner, traj)  # fmt: skip
    env_steps = state.env_steps + steps_per_iteration
    done = stats.done
    out = {
        "active": jnp.asarray(True),
        "env_steps": env_steps,
        "episodes": done.sum().astype(jnp.int32),
        "episode_return_sum": jnp.where(done, stats.episode_return, 0.0).sum(),
        "episode_length_sum": jnp.where(done, stats.episode_length, 0).sum().astype(jnp.float32),
        "updated": jnp.asarray(updated),
        "data_finite": jnp.isfinite(traj.reward).all() & jnp.isfinite(traj.observation).all(),
        "actions_valid": actions_valid(spec, traj.action),
        "num_updates": learner.agent.num_updates,
        **{name: jnp.asarray(value, jnp.float32) for name, value in metrics.items()},
    }
    new = AnakinState(learner, rollout_state, state.eval_key, state.iteration + 1, env_steps)
    return new, out

  # Jitted: `run` traces it once, for its output template, and reuses that trace.
  iteration = jax.jit(iteration)

  def train(key: jax.Array, hp: dict):
    _check_int32_budget(config)
    state = init(key, hp)
    nan = jnp.full((), jnp.nan, jnp.float32)

    def body(state, _):
      before = state.env_steps
      state, out = iteration(state, hp)
      if eval_interval:  # the first iteration at or after each multiple of the interval
        due = state.env_steps // eval_interval > before // eval_interval
        low_mean = jax.lax.cond(due, lambda: evaluate(state, hp), lambda: (nan, nan))
      else:
        low_mean = (nan, nan)
      return state, {**out, "eval_return": low_mean[0], "eval_return_min": low_mean[1]}

    return jax.lax.scan(body, state, None, length=iterations)

  def run(state: AnakinState, hp: dict, num_active: jax.Array):
    template = jax.eval_shape(iteration, state, hp)[1]

    def idle(state):
      return state, {**_unset(template), "env_steps": state.env_steps,
                     "num_updates": state.learner.agent.num_updates}  # fmt: skip

    def body(state, i):
      return jax.lax.cond(i < num_active, lambda s: iteration(s, hp), idle, state)

    return jax.lax.scan(body, state, jnp.arange(per_chunk))

  return CompiledTrain(
      train=train,
      init=init,
      run=run,
      evaluate=evaluate,
      hyperparams=defaults,
      agent_at=agent_at,
      env=env,
      config=config,
      iterations=iterations,
      iterations_per_chunk=per_chunk,
      steps_per_iteration=steps_per_iteration,
  )


def actions_valid(spec: envs.EnvSpec, action: jax.Array) -> jax.Array:
  """Whether every action of `action` [..., *action_shape] is one `spec`'s task takes as
  it is: a discrete action in [0, num_actions), a continuous one finite (its bounds are
  the environment's to clip)."""
  if spec.is_discrete:
    return jnp.all((action >= 0) & (action < spec.num_actions))
  return jnp.all(jnp.isfinite(action))
