"""The training run's settings, grouped by concern, and every rule between them.

    config = TrainConfig(env=EnvConfig(env_id="Pong-v5", atari=True),
                         acting=ActorsConfig(actors="async", num_actors=4))
    config.validate()          # every cross-field rule, before anything compiles

Each group is a frozen dataclass; the experiment scripts parse them with flat flags
(`--env-id`, `--num-envs`, `--actors async --num-actors 4`, ...: field names are
unique across groups). Derived quantities are properties, never fields written back after
parsing. What each run shape supports is one table, `MODES`; the settings that have an
effect only in some configurations are another, `CONDITIONAL_FIELDS`.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any
from typing import Literal
from typing import Optional
from typing import get_args

from offpolicy_ac import envs
from offpolicy_ac.agents.base import check_bool_fields
from offpolicy_ac.agents.base import check_int32
from offpolicy_ac.agents.base import unlike_default
from offpolicy_ac.training.parallel import check_distributed_args

ActorMode = Literal["inline", "pools", "async"]
CompileFor = Literal["speed", "startup"]
WandbMode = Literal["online", "offline"]

MAX_SEED = 2**32
"""Seeds lie below this: `jax.random.PRNGKey` keeps a seed's low 32 bits (without x64)."""

AUTO_EVALUATIONS = 20
"""Evaluations over a run's budget when `EvalConfig.eval_every` is None."""


@dataclasses.dataclass(frozen=True)
class EnvConfig:
  """The training environments and how they are stepped."""

  env_id: str = "CartPole-v1"
  """The task to learn. An envpool id (CartPole-v1, Pong-v5, HalfCheetah-v4, ...), or
  gymnax:NAME / brax:NAME for a JAX environment, whose whole run is one compiled program."""
  num_envs: int = 16
  """Environments stepped together. With actor threads (--actors pools or async), each
  actor steps this many."""
  env_batch_size: int = 0
  """Asynchronous stepping: each step acts on the first this-many environments to finish
  their previous step (envpool's batch_size). 0: every environment, every step. Which
  environments finish first depends on thread timing, so such a run is not reproducible:
  a rerun or a resumed run does not repeat it exactly."""
  unroll_length: int = 16
  """Steps each environment takes per unroll. An unroll gives the learner num_envs
  sequences of this length."""
  max_episode_steps: Optional[int] = None
  """The task's time limit in steps (default: the task's own)."""
  atari: bool = False
  """Atari preprocessing (84x84 grey, frame stack 4, no-op starts, episodic life; rewards
  clipped to {-1, 0, 1} for training only); returns are raw game scores."""
  rollout: envs.Backend = "host"
  """How envpool environments are stepped. 'host': one step at a time from Python (any
  task). 'compiled': each unroll is one compiled loop, with no Python per step, so actor
  threads get in each other's way less (the policy runs on the CPU; int32/float32 actions
  only)."""


@dataclasses.dataclass(frozen=True)
class TransformConfig:
  """Observation normalisation, reward clipping and scaling: applied once to every batch the
  agent learns from."""

  normalize_observations: bool = False
  """Normalise observations with their running mean and variance (from fresh data;
  saved in checkpoints). The policy acts on normalised observations too."""
  obs_clip: float = 5.0
  """Normalised observations are clipped to [-obs_clip, obs_clip]."""
  reward_clip: Optional[tuple[float, float]] = None
  """Clip rewards to (low, high), with low <= 0 <= high, before scaling them."""
  reward_scale: float = 1.0
  """Multiply rewards by this before learning from them (after --reward-clip)."""


@dataclasses.dataclass(frozen=True)
class BudgetConfig:
  """Seeds, the step budget, the logging schedule and what a compiled run compiles for."""

  seed: int = 0
  """Seeds the agent, the environments and replay sampling."""
  total_env_steps: int = 500_000
  """Environment steps to train for. All environments together, per seed."""
  log_every: int = 5_000
  """Environment steps between metrics lines; an evaluation adds a line at its step (but the
  one at the end of the budget: its score is summary.json's last_eval_return). Each goes to
  metrics.jsonl and to the progress shown on screen."""
  num_seeds: int = 1
  """Seeds to train (seed, seed + 1, ...). Each has its own environments, logs and run
  directory <run-dir>/seed<k>, and a plot shows them all. The seeds learn together, as one
  vectorised (vmapped) learner, unless --no-vmap-seeds is given or a setting rules it out
  (actor threads, a learner on several devices or processes); then they run one after the
  other."""
  vmap_seeds: bool = True
  """With --num-seeds > 1: train the seeds together as one vectorised learner (see
  --num-seeds)."""
  sweep: tuple[str, ...] = ()
  """Sweep an agent setting over values: FIELD=V1,V2,...; repeat the flag for more fields
  (`--sweep learning_rate=1e-3,3e-3 --sweep gamma=0.99,0.995`). One learner per combination
  and seed, each with its own environments, all trained together as one vectorised learner
  (the settings that --num-seeds can vectorise). Numeric settings such as the learning rate
  and the discount can be swept; a setting that cannot is refused with the list of those
  that can."""
  compile_for: CompileFor = "speed"
  """JAX environments: compile the run for "speed" or "startup". On a CPU, "startup"
  compiles IMPALA's CartPole program in about 0.7 s instead of 3.5 to 4.5 s, and the program
  runs 2 to 3 times slower, with float results that differ slightly from the optimised
  program's: for runs that train in less time than they compile (the gymnax-cartpole
  preset). Other devices than the CPU ignore it."""


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
  """Off-policy agents: the sequence replay buffer and the updates per iteration (refused
  for an agent that learns on-policy)."""

  replay_capacity: int = 2_000
  """Sequences the replay buffer holds (each unroll adds num_envs of them)."""
  min_replay_size: int = 64
  """Sequences stored before training starts."""
  num_updates_per_train_iter: int = 1
  """Replayed updates after each learner iteration (one unroll; with --actors pools, one of
  every pool)."""
  mini_batch_size: int = 64
  """Sequences per update."""
  mini_batch_length: int = 8
  """Transitions per sampled sequence (windows of length + 1 steps)."""


@dataclasses.dataclass(frozen=True)
class ActorsConfig:
  """Who steps the training environments."""

  actors: ActorMode = "inline"
  """Who steps the environments. 'inline': the learner unrolls, then updates (a resumed
  run continues exactly). 'pools': --num-actors threads unroll with the same parameters,
  and the learner waits for them every iteration (see --min-pools). 'async': --num-actors
  threads unroll with the newest parameters they have, and the learner updates on each
  trajectory as it arrives (IMPALA's actor-learner)."""
  num_actors: int = 1
  """Actor threads (pools or async); 1 with 'inline'."""
  max_policy_lag: Optional[int] = None
  """Async: drop trajectories from parameters more than L updates old (counted as
  dropped_trajectories). Every update counts, replayed ones too, so with replayed updates
  (ACER, SQL, SQIL) one iteration ages the parameters by several updates. None: use every
  trajectory."""
  actor_queue_size: int = 0
  """Async: trajectories waiting for the learner before actors block (back-pressure).
  0: one per actor."""
  min_pools: int = 0
  """Pools: go on once this many pools reported, waiting at most --grace-period-s for the
  others; a late trajectory is dropped and counted. 0: wait for every pool."""
  grace_period_s: float = 0.5
  """Pools: how long to wait for the remaining pools once --min-pools reported."""


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
  """The learner across devices and hosts."""

  learner_devices: int = 1
  """Devices the learner splits each batch over. Data parallel: each device takes a part
  of the batch and the gradients are averaged over the devices (all-reduced); with
  --num-processes, the devices of each process. On a CPU the scripts create that many host
  devices."""
  num_processes: int = 1
  """Processes of a multi-host job (jax.distributed); each runs its own actors and a
  learner shard, and learners all-reduce gradients every update."""
  process_id: int = 0
  """This process's index in [0, --num-processes)."""
  coordinator_address: Optional[str] = None
  """HOST:PORT (or [IPV6]:PORT) of process 0 (multi-host only)."""


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Greedy evaluation, on environments of its own."""

  eval_every: Optional[int] = None
  """Environment steps between greedy evaluations (by default about 20 over the run, each at
  a metrics line, so at most one per --log-every; 0: never)."""
  eval_episodes: int = 5
  """Episodes per evaluation, each on its own environment (per process of a multi-host
  job)."""
  target_return: Optional[float] = None
  """Stop once an evaluation's mean return reaches this (every learner's)."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Checkpoints, from which --resume continues a run."""

  checkpoint_every: int = 10_000
  """Environment steps between checkpoints. 0: none, not even at the end. An envpool run
  with --actors inline starts new environments at each (docs/concepts/resume.md): every
  episode is cut (a truncation, bootstrapped) after at most about checkpoint_every /
  (num_envs x num_processes) steps of its environment (rounded up to whole unrolls), so
  keep that above the task's time limit to see whole episodes (the run warns when it is
  not)."""
  keep_checkpoints: int = 3
  """How many of the newest checkpoints are kept."""


@dataclasses.dataclass(frozen=True)
class TrackingConfig:
  """Experiment tracking with Weights & Biases (needs `pip install offpolicy_ac[track]`).
  Changes nothing that is learned; may change when a run is resumed."""

  track: bool = False
  """Also log every metrics line to Weights & Biases. The W&B run is named after the run
  directory, with config.json as its config; a resumed run continues the same W&B run."""
  wandb_project: str = "offpolicy_ac"
  """W&B project."""
  wandb_entity: Optional[str] = None
  """W&B entity (user or team; default: yours)."""
  wandb_mode: Optional[WandbMode] = None
  """'offline': write W&B's files locally (`wandb sync` uploads them later); 'online':
  upload as it goes. Default: wandb's own choice (its WANDB_MODE variable, else online)."""


def _check_types(config: "TrainConfig") -> None:
  """Refuses a number, str or list field holding another type (a hand-edited config.json, a
  mistyped Python config), by the type of its default: "10" for a float would fail a
  comparison later with a TypeError. Bools are `check_bool_fields`', ints `_check_ints`',
  fields that default to None (Optional) their own checks'."""
  for f in dataclasses.fields(config):
    group = getattr(config, f.name)
    for name, default in dataclasses.asdict(type(group)()).items():
      if type(default) in (float, str, tuple):  # exactly: a bool default is not an int's
        value = getattr(group, name)
        said = unlike_default(value, default)
        if said:
          # A number of another type (NumPy's, JAX's) is refused too, with the fix:
          # config.json holds Python numbers.
          other = isinstance(value, numbers.Real) and not isinstance(value, (int, float, bool))
          kind = f"{type(value).__module__}.{type(value).__name__}"
          hint = f" ({kind}, not float: pass float(...))" if other and said == "a number" else ""
          raise ValueError(f"{name} must be {said}, got {value!r}{hint}")


MAX_EPISODES = 2**20
"""The most episodes one evaluation plays: envpool seeds environment i of a pool seed + i,
below 2**31, and `sources.pool_seed` leaves room for 2**20."""

MAX_SEEDS = 65_536
"""The most seeds one run trains (each a learner)."""

_SIZES = ("num_envs", "unroll_length", "replay_capacity", "num_updates_per_train_iter",
          "mini_batch_size", "mini_batch_length", "eval_episodes", "keep_checkpoints",
          "num_actors", "learner_devices", "env_batch_size", "min_replay_size",
          "actor_queue_size", "min_pools", "max_episode_steps")  # fmt: skip
"""Fields that size arrays, buffers and loops, which the program counts in 32-bit ints."""


def _check_ints(values: dict, low: int, *names: str) -> None:
  """Refuses a field of `names` that is not an int (a bool is not) >= `low` (0 or 1), or,
  of `_SIZES`, above 2**31 - 1 (`check_int32`)."""
  for name in names:
    value = values[name]
    if name in _SIZES and isinstance(value, int) and not isinstance(value, bool):
      check_int32(name, value)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      kind = f"{type(value).__module__}.{type(value).__name__}"
      # An integer of another type (NumPy's, JAX's) is refused too, with the fix.
      other_int = isinstance(value, numbers.Integral) and not isinstance(value, (int, bool))
      hint = f" ({kind}, not int: pass int(...))" if other_int else ""
      raise ValueError(
          f"{name} must be {'a positive int' if low else 'an int >= 0'}, got {value!r}{hint}"
      )


def _check_choice(name: str, value: Any, choices: tuple) -> None:
  """Refuses a `value` of the field `name` that is not one of `choices`."""
  if value not in choices:
    said = " or ".join([", ".join(map(repr, choices[:-1])), repr(choices[-1])])
    raise ValueError(f"{name} must be {said}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Every setting of a training run, grouped by concern."""

  env: EnvConfig = EnvConfig()
  transform: TransformConfig = TransformConfig()
  budget: BudgetConfig = BudgetConfig()
  replay: ReplayConfig = ReplayConfig()
  acting: ActorsConfig = ActorsConfig()
  parallel: ParallelConfig = ParallelConfig()
  eval: EvalConfig = EvalConfig()
  checkpoint: CheckpointConfig = CheckpointConfig()
  tracking: TrackingConfig = TrackingConfig()

  def __post_init__(self):
    for f in dataclasses.fields(self):
      group = getattr(self, f.name)
      said = unlike_default(group, getattr(TrainConfig, f.name))  # a dict: AttributeErrors later
      if said:
        raise ValueError(f"TrainConfig's {f.name} must be {said}, got {group!r}")
      lists = {k: tuple(v) for k, v in vars(group).items() if isinstance(v, list)}
      if lists:  # lists given from Python (reward_clip, sweep) become tuples: hashable
        object.__setattr__(self, f.name, dataclasses.replace(group, **lists))

  @classmethod
  def from_dict(cls, values: dict) -> "TrainConfig":
    """Rebuilds the config from its JSON form (config.json's `train`; an earlier version's
    removed fields are dropped or refused, `without_removed_fields`)."""
    values = without_removed_fields(values)
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f"unknown TrainConfig groups: {sorted(unknown)}")
    groups = {}
    for f in dataclasses.fields(cls):
      group_cls = type(getattr(cls(), f.name))
      given = dict(values.get(f.name, {}))
      unknown = set(given) - _field_names(group_cls)
      if unknown:
        raise ValueError(f"unknown {group_cls.__name__} fields: {sorted(unknown)}")
      groups[f.name] = group_cls(
          **{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()}
      )
    return cls(**groups)

  @classmethod
  def of(cls, **fields) -> "TrainConfig":
    """The defaults with fields changed by name: `TrainConfig.of(env_id="Pong-v5")`."""
    return cls().replace(**fields)

  def replace(self, **groups_or_fields) -> "TrainConfig":
    """A copy with fields changed by name (`seed=1`, `num_envs=4`) or groups replaced
    (`env=EnvConfig(...)`); field names are unique across groups."""
    groups = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    for name, value in groups_or_fields.items():
      if name in groups:
        groups[name] = value
        continue
      owner = next((g for g, v in groups.items() if name in _field_names(v)), None)
      if owner is None:
        raise TypeError(f"TrainConfig has no field {name!r}")
      groups[owner] = dataclasses.replace(groups[owner], **{name: value})
    return TrainConfig(**groups)

  def fields_by_name(self) -> dict[str, Any]:
    """Every field of every group, by its name (names are unique across groups)."""
    return {k: v for group in dataclasses.asdict(self).values() for k, v in group.items()}

  @property
  def steps_per_unroll(self) -> int:
    """Env steps of one unroll of one pool: T x num_envs."""
    return self.env.unroll_length * self.env.num_envs

  @property
  def unrolls_per_iteration(self) -> int:
    """Unrolls a learner iteration learns from: one per pool with `--actors pools`, one
    per process of a multi-host job (their batches are joined), else one."""
    pools = self.acting.num_actors if self.acting.actors == "pools" else 1
    return pools * self.parallel.num_processes

  def planned_updates(self, *, off_policy: bool) -> int:
    """Learner updates in the whole run, per seed: one per iteration (its unrolls of T x
    num_envs env steps, `unrolls_per_iteration`) for an on-policy learner;
    `num_updates_per_train_iter` per iteration once `min_replay_size` sequences are
    stored for an off-policy one. Exact unless iterations drop trajectories (async actors'
    `max_policy_lag`, pools' `min_pools`). Raises ValueError where `validate` does."""
    self.validate()
    iterations = self.planned_iterations
    if not off_policy:
      return iterations
    updating = max(0, iterations - self.filling_iterations + 1)
    return updating * self.replay.num_updates_per_train_iter

  @property
  def planned_iterations(self) -> int:
    """Learner iterations in the whole run: the budget rounded up to whole iterations (a
    run ends at the first iteration boundary at or after it)."""
    return -(-self.budget.total_env_steps // self.steps_per_iteration)

  @property
  def fixed_iterations(self) -> bool:
    """Whether every iteration takes `steps_per_iteration` env steps (asynchronous actors
    and --min-pools make iterations of varying size)."""
    return self.acting.actors != "async" and not self.acting.min_pools

  @property
  def steps_per_iteration(self) -> int:
    """Env steps of one learner iteration: `steps_per_unroll` x `unrolls_per_iteration`."""
    return self.steps_per_unroll * self.unrolls_per_iteration

  @property
  def filling_iterations(self) -> int:
    """Iterations until the replay holds `min_replay_size` sequences (at least one): the
    first update of an off-policy learner follows the last of them."""
    added = self.env.num_envs * self.unrolls_per_iteration
    return max(1, -(-self.replay.min_replay_size // added))

  def cooldown_updates(self, fraction: float, *, off_policy: bool) -> tuple[int, int]:
    """(decay_begin, decay_updates): a step size that falls linearly to 0 over the last
    `fraction` (in (0, 1]) of the run's planned updates (1: PPO's annealing over the whole
    run), in updates, as `agents.base.make_optimizer` takes them."""
    if isinstance(fraction, bool) or not 0.0 < fraction <= 1.0:
      raise ValueError(
          f"the learning-rate cool-down is a fraction of the run's updates in (0, 1], got "
          f"{fraction!r}"
      )
    updates = self.planned_updates(off_policy=off_policy)
    decay = max(1, round(fraction * updates))
    return max(0, updates - decay), decay

  @property
  def eval_interval(self) -> int:
    """Env steps between greedy evaluations (0: none): `eval.eval_every` when set, else
    the budget over `AUTO_EVALUATIONS`, rounded to a multiple of `log_every` (at least
    one), so evaluations fall on log points."""
    if self.eval.eval_every is not None:
      return self.eval.eval_every
    log_every = self.budget.log_every
    return log_every * max(1, round(self.budget.total_env_steps / AUTO_EVALUATIONS / log_every))

  @property
  def uses_actor_threads(self) -> bool:
    return self.acting.actors != "inline"

  @property
  def seeds(self) -> list[int]:
    return [self.budget.seed + k for k in range(self.budget.num_seeds)]

  def vmap_unsupported_reason(self) -> Optional[str]:
    """Why this config's seeds cannot share one vmapped learner (None: they can)."""
    return unsupported_reason(self, "vmapped")

  @property
  def compiled(self) -> bool:
    """Whether the run is one compiled program: `env_id` names a JAX environment
    ("gymnax:...", "brax:..."; `envs.make_functional`)."""
    return envs.is_functional(self.env.env_id)

  def validate(self) -> None:
    """Raises ValueError naming the field for any bad value or combination."""
    env, budget, replay, actors = self.env, self.budget, self.replay, self.acting
    parallel, evaluation = self.parallel, self.eval
    flat = self.fields_by_name()
    _check_ints(flat, 1, "num_envs", "unroll_length", "total_env_steps", "log_every",
                "num_seeds", "replay_capacity", "num_updates_per_train_iter", "mini_batch_size",
                "mini_batch_length", "eval_episodes", "keep_checkpoints", "num_actors",
                "learner_devices")  # fmt: skip
    # The seed >= 0 as envpool's and the evaluation tools' seeds; eval_every may be None.
    eval_every = () if evaluation.eval_every is None else ("eval_every",)
    _check_ints(flat, 0, "env_batch_size", "seed", *eval_every, "checkpoint_every",
                "min_replay_size", "actor_queue_size", "min_pools")  # fmt: skip
    if evaluation.eval_episodes > MAX_EPISODES:
      raise ValueError(f"eval_episodes must be at most {MAX_EPISODES:,}, got "
                       f"{evaluation.eval_episodes:,}")  # fmt: skip
    if budget.num_seeds > MAX_SEEDS:
      raise ValueError(f"num_seeds must be at most {MAX_SEEDS:,} (one learner each), got "
                       f"{budget.num_seeds:,}")  # fmt: skip
    last_seed = budget.seed + budget.num_seeds - 1
    if last_seed >= MAX_SEED:
      last = f" (the last seed, seed + num_seeds - 1: {last_seed})" * (budget.num_seeds > 1)
      raise ValueError(f"seed must be below 2**32, got {budget.seed}{last}: JAX's PRNG keys "
                       "take 32 bits (seed 2**32 would repeat seed 0)")  # fmt: skip
    _check_choice("compile_for", budget.compile_for, get_args(CompileFor))
    if budget.compile_for == "startup" and not self.compiled:
      raise ValueError(
          "--compile-for startup applies to a JAX environment's compiled run "
          "(--env-id gymnax:... or brax:...); envpool runs compile for speed"
      )
    _check_choice("rollout", env.rollout, get_args(envs.Backend))
    if env.env_batch_size > env.num_envs:
      raise ValueError(f"env_batch_size ({env.env_batch_size}) exceeds num_envs ({env.num_envs})")
    if env.max_episode_steps is not None:
      _check_ints(flat, 1, "max_episode_steps")
    if not isinstance(env.env_id, str) or not env.env_id:
      raise ValueError(f"env_id must be a task id (a non-empty str), got {env.env_id!r}")
    for group in dataclasses.fields(self):
      check_bool_fields(getattr(self, group.name))
    _check_types(self)
    _check_finite_floats(flat)
    if env.atari and not self.compiled and not envs.is_atari(env.env_id):
      raise ValueError(f"--atari applies to Atari tasks (envpool ids such as Pong-v5), not to "
                       f"{env.env_id}")  # fmt: skip
    first = self.steps_per_iteration
    if first > budget.total_env_steps:
      raise ValueError(
          f"one iteration takes {first:,} env steps (num_envs {env.num_envs} x unroll_length "
          f"{env.unroll_length}{' x num_actors' if actors.actors == 'pools' else ''}"
          f"{' x num_processes' if parallel.num_processes > 1 else ''}), more than the whole "
          f"budget, total_env_steps {budget.total_env_steps:,}"
      )
    _check_transform(self.transform)
    if self.tracking.wandb_mode is not None:
      _check_choice("wandb_mode", self.tracking.wandb_mode, get_args(WandbMode))
    if not self.tracking.track and self.tracking != TrackingConfig():
      raise ValueError("wandb_project, wandb_entity and wandb_mode apply to --track")
    target = evaluation.target_return
    if target is not None and (not isinstance(target, numbers.Real) or isinstance(target, bool)):
      raise ValueError(f"target_return must be a number, got {target!r}")
    if evaluation.target_return is not None and evaluation.eval_every == 0:
      raise ValueError("target_return needs evaluations: set eval_every > 0")
    if replay.min_replay_size > replay.replay_capacity:
      raise ValueError(
          f"min_replay_size ({replay.min_replay_size}) exceeds "
          f"replay_capacity ({replay.replay_capacity})"
      )
    _check_actors(actors)
    if self.compiled and (reason := unsupported_reason(self, "compiled")) is not None:
      raise ValueError(f"a compiled (Anakin) run cannot use {reason}")
    if budget.sweep and (reason := unsupported_reason(self, "vmapped")) is not None:
      raise ValueError(
          f"--sweep trains its learners as lanes of one vmapped learner, which cannot use {reason}"
      )
    if budget.sweep and not budget.vmap_seeds:
      raise ValueError("--sweep runs its learners in one vmapped program: drop --no-vmap-seeds")
    if env.num_envs % parallel.learner_devices:
      raise ValueError(
          f"num_envs ({env.num_envs}) must divide evenly over "
          f"learner_devices ({parallel.learner_devices})"
      )
    check_distributed_args(
        parallel.num_processes, parallel.process_id, parallel.coordinator_address
    )
    if parallel.num_processes > 1 and 0 < actors.min_pools < actors.num_actors:
      raise ValueError(
          "min_pools < num_actors gives batches of varying size, which processes of a "
          "multi-host job cannot agree on; use all pools"
      )


# What a run shape supports: one table, checked by `TrainConfig.validate` before anything
# is built or compiled. Each mode a config can ask for, and the run shapes that cannot
# give it: "compiled", a JAX environment's run as one compiled program
# (`training.make_train`); "vmapped", learners that are lanes of one vmapped learner
# (several seeds, a sweep).
MODES = (
    ("actor threads (--actors pools / async)",
     lambda c: c.acting.actors != "inline", ("compiled", "vmapped")),
    ("a learner over several devices or processes",
     lambda c: c.parallel.learner_devices > 1 or c.parallel.num_processes > 1,
     ("compiled", "vmapped")),
    ("batched env stepping (--env-batch-size): JAX environments step together",
     lambda c: c.env.env_batch_size > 0, ("compiled",)),
    ("--rollout compiled (an envpool backend): JAX environments always compile",
     lambda c: c.env.rollout != "host", ("compiled",)),
    ("--atari (envpool's Atari preprocessing)", lambda c: c.env.atari, ("compiled",)),
)  # fmt: skip


# Settings that have an effect only in some configurations: (field, whether it has one in a
# config, where it has). The scripts refuse a flag that changes such a field from its
# preset's (or the default's) value where it has none (`cli.parse_args`).
CONDITIONAL_FIELDS = (
    ("obs_clip", lambda c: c.transform.normalize_observations, "with normalize_observations"),
    ("eval_episodes", lambda c: c.eval_interval > 0, "to evaluations (eval_every > 0)"),
    ("keep_checkpoints", lambda c: c.checkpoint.checkpoint_every > 0,
     "to checkpoints (checkpoint_every > 0)"),
    ("vmap_seeds", lambda c: c.budget.num_seeds > 1 and c.vmap_unsupported_reason() is None,
     "to several seeds (num_seeds > 1) that can share one vmapped learner: with actor "
     "threads or a learner over several devices or processes, seeds run one after the other"),
    ("grace_period_s", lambda c: c.acting.min_pools > 0, "to --actors pools with --min-pools"),
)  # fmt: skip


def fields_without_effect(config: TrainConfig) -> dict[str, str]:
  """The fields of `CONDITIONAL_FIELDS` that have no effect in `config`, each with where it
  has one ("with normalize_observations")."""
  return {name: where for name, applies, where in CONDITIONAL_FIELDS if not applies(config)}


def unsupported_reason(config: TrainConfig, shape: str) -> Optional[str]:
  """The first mode of `config` that run shape `shape` ("compiled", "vmapped") cannot
  give (`MODES`), or None."""
  return next((reason for reason, used, shapes in MODES if shape in shapes and used(config)), None)


def _check_finite_floats(values: dict) -> None:
  """Refuses NaN and infinite values in every float setting (a target return included)."""
  for name, value in values.items():
    items = value if isinstance(value, tuple) else (value,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in items):
      raise ValueError(f"{name} must be finite, got {value!r}")


def _check_transform(transform: TransformConfig) -> None:
  if not transform.obs_clip > 0:
    raise ValueError(f"obs_clip must be > 0, got {transform.obs_clip}")
  if not transform.reward_scale > 0:
    raise ValueError(f"reward_scale must be > 0, got {transform.reward_scale}")
  if transform.reward_clip is not None:
    clip = transform.reward_clip
    if not (isinstance(clip, (tuple, list)) and len(clip) == 2
            and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in clip)):  # fmt: skip
      raise ValueError(f"reward_clip must be a pair of numbers (low, high), got {clip!r}")
    low, high = clip
    if not (low <= 0.0 <= high and low < high):
      raise ValueError(
          f"reward_clip must be (low, high) with low <= 0 <= high, got {transform.reward_clip}"
      )


def _check_actors(actors: ActorsConfig) -> None:
  _check_choice("actors", actors.actors, get_args(ActorMode))
  if actors.actors == "inline" and actors.num_actors != 1:
    raise ValueError(f"num_actors={actors.num_actors} needs actor threads: --actors pools or async")
  if actors.min_pools and actors.actors != "pools":
    raise ValueError("min_pools applies to --actors pools")
  if actors.actor_queue_size and actors.actors != "async":
    raise ValueError("actor_queue_size applies to --actors async (pools unroll once per "
                     "round, so at most num_actors trajectories ever wait)")  # fmt: skip
  if actors.min_pools > actors.num_actors:
    raise ValueError(f"min_pools ({actors.min_pools}) exceeds num_actors ({actors.num_actors})")
  if actors.min_pools and actors.min_pools == actors.num_actors:
    raise ValueError(f"min_pools {actors.min_pools} waits for every one of the num_actors "
                     f"{actors.num_actors} pools, as min_pools 0 does: it has no effect")  # fmt: skip
  if not actors.grace_period_s >= 0:
    raise ValueError(f"grace_period_s must be >= 0, got {actors.grace_period_s}")
  if actors.grace_period_s != ActorsConfig.grace_period_s and not actors.min_pools:
    raise ValueError("grace_period_s applies to --actors pools with --min-pools (below "
                     "num_actors)")  # fmt: skip
  if actors.max_policy_lag is not None:
    if actors.actors != "async":
      raise ValueError("max_policy_lag applies to --actors async")
    _check_ints({"max_policy_lag": actors.max_policy_lag}, 0, "max_policy_lag")


REMOVED_FIELDS = {
    ("replay", "whole_replay_buffer_training"): (False, "offpolicy_ac 0.2"),
}
"""Fields of an earlier version's config.json (`train`) that this version removed, by
(group, field): the value with which the run trained as this version trains, and the
version that trains with another value."""


def without_removed_fields(values: dict) -> dict:
  """config.json's `train` without the `REMOVED_FIELDS` it holds at the value that means
  what this version does (an earlier version's run reads as this version's).

  Raises:
    ValueError: a removed field at another value: the run trained in a way this version
      cannot, named with the version that can.
  """
  values = dict(values)
  for (group, name), (same, version) in REMOVED_FIELDS.items():
    fields = values.get(group)
    if not isinstance(fields, dict) or name not in fields:
      continue
    if fields[name] != same:
      raise ValueError(
          f"the run was written by an earlier offpolicy_ac with {group}.{name} = "
          f"{fields[name]!r}, which this version removed: load or resume it with {version}"
      )
    values[group] = {k: v for k, v in fields.items() if k != name}
  return values


def _field_names(group) -> set[str]:
  return {f.name for f in dataclasses.fields(group)}
