"""envpool environments with ALF's TimeStep semantics (docs/design.md, "Contract 2:
environments").

Built on envpool's *gymnasium* API: its dm_env API reports a time-limit end as discount 0,
which would stop bootstrapping at truncations.

What envpool 1.2.5 does (checked empirically, see tests/envs/test_envpool.py and
docs/envs_notes.md), and what this module turns it into:

* `reset()` returns the reset observations with `info["elapsed_step"] == 0`: FIRST.
* A step that ends an episode returns the true final observation with `terminated` or
  `truncated` set: LAST, discount 0 if terminated, 1 if truncated. envpool sets only
  `truncated` when an episode reaches a terminal state on the time limit's step; for the
  tasks whose terminal test is known (`_terminal_states`: classic control, MuJoCo's
  Hopper/Walker2d/Ant/Humanoid/InvertedPendulum, Atari's game over) that step is a
  termination again.
* The *next* step of that environment ignores its action and returns the reset observation
  with reward 0 (`elapsed_step` 0, or unchanged after an Atari life loss): FIRST, reward 0,
  discount 1. FIRST is detected from the previous step of the same `env_id`, not from
  `elapsed_step`, so life-loss resets of episodic-life Atari are FIRST too.
* Atari `info` carries `reward` (the unclipped game reward, even with `reward_clip=True`),
  `lives` and `terminated` (1 only when the whole game is over). A life loss with
  `episodic_life=True` is a LAST step with discount 0 whose next step is FIRST, but the game
  goes on; after a game over or a time-limit truncation the game restarts. Episode
  statistics for Atari follow the game, not the life.

All per-environment state (whether the next step is FIRST, episode statistics, which
environments have an action in flight) lives in arrays indexed by `env_id`, so batched
stepping (`batch_size < num_envs`: each `recv` returns whichever `batch_size` environments
are ready) never mixes environments.
"""

from __future__ import annotations

import difflib
import fnmatch
import numbers
from typing import Any
from typing import NamedTuple
import warnings

import numpy as np

from offpolicy_ac.envs._functional import GYMNAX_TASKS
from offpolicy_ac.envs._functional import is_functional
from offpolicy_ac.envs._terminal_states import TerminalTest
from offpolicy_ac.envs._terminal_states import split_limit_step
from offpolicy_ac.envs._terminal_states import terminal_test
from offpolicy_ac.envs._timestep import ENV_ID_DTYPE
from offpolicy_ac.envs._timestep import FIRST
from offpolicy_ac.envs._timestep import MID
from offpolicy_ac.envs._timestep import STEP_TYPE_DTYPE
from offpolicy_ac.envs._timestep import EnvSpec
from offpolicy_ac.envs._timestep import EpisodeStats
from offpolicy_ac.envs._timestep import TimeStep
from offpolicy_ac.envs._timestep import check_bool
from offpolicy_ac.envs._timestep import check_int

__all__ = [
    "EnvPoolEnv",
    "make",
    "make_atari",
    "spec",
    "is_atari",
    "ATARI_TRAIN_KWARGS",
    "ATARI_EVAL_KWARGS",
]

# envpool's standard Atari preprocessing: 84x84 grey, frame stack 4, frame skip 4, up to 30
# no-op starts, fire on reset, no sticky actions, a life loss ends an episode; plus, for
# training, reward clipping.
ATARI_TRAIN_KWARGS: dict[str, Any] = dict(
    img_height=84,
    img_width=84,
    gray_scale=True,
    stack_num=4,
    frame_skip=4,
    noop_max=30,
    episodic_life=True,
    reward_clip=True,
)
"""envpool options for Atari training: 84x84 grey, frame stack 4, frame skip 4, up to 30
no-op starts; a life loss ends an episode (LAST, discount 0; the game goes on, and envpool
presses FIRE as at the game's start); rewards clipped to {-1, 0, 1}."""
ATARI_EVAL_KWARGS: dict[str, Any] = {**ATARI_TRAIN_KWARGS, "reward_clip": False}
"""envpool options for Atari evaluation: `ATARI_TRAIN_KWARGS` with raw rewards. A life loss
ends an episode as in training, so that the environment serves after it as it does in
training (Breakout's ball is launched by FIRE: a policy trained with the environment
pressing it never learns to, and without episodic life its game would stall after the
first lost life); scores (`pop_episode_stats`) are of whole games either way."""

_RESERVED_KWARGS = ("num_envs", "seed", "env_seed", "gym_reset_return_info")

# envpool's integer options and their smallest valid value (envpool aborts the process on
# some bad ones, e.g. num_threads=-1, or fails a bare assertion).
_INT_OPTIONS = {"num_threads": 0, "thread_affinity_offset": -1, "max_num_players": 1,
                "frame_skip": 1, "stack_num": 1, "noop_max": 0, "img_height": 1,
                "img_width": 1}  # fmt: skip

# envpool's rendering options, outside every task's config: with render_mode="rgb_array",
# `EnvPoolEnv.render()` returns RGB frames (classic control, MuJoCo, Atari).
_RENDER_KWARGS = ("render_mode", "render_env_id", "render_width", "render_height",
                  "render_camera_id")  # fmt: skip


def _envpool():
  import envpool  # local import: importing envpool is slow and only needed to make envs

  return envpool


class _RawStep(NamedTuple):
  """What one envpool `recv` gives, before conversion to a TimeStep."""

  obs: np.ndarray
  reward: np.ndarray
  terminated: np.ndarray  # bool, done and not truncated
  truncated: np.ndarray
  env_id: np.ndarray
  game_reward: np.ndarray | None  # Atari: info["reward"], the unclipped reward
  game_over: np.ndarray | None  # Atari: info["terminated"], the whole game is over


class _PublicPoolIO:
  """send/recv through envpool's public gymnasium API."""

  def __init__(self, pool: Any, atari: bool, terminal: TerminalTest | None):
    self._pool, self._atari, self._terminal = pool, atari, terminal

  def send(self, action: np.ndarray, env_id: np.ndarray) -> None:
    self._pool.send(action, env_id)

  def recv(self) -> _RawStep:
    obs, reward, terminated, truncated, info = self._pool.recv()
    game_over = info["terminated"] if self._atari else None
    terminated, truncated = split_limit_step(
        obs, terminated, truncated, game_over, self._terminal, np
    )
    game_reward = info["reward"] if self._atari else None
    return _RawStep(obs, reward, terminated, truncated, info["env_id"], game_reward, game_over)


class _FastPoolIO:
  """send/recv through envpool's `_send`/`_recv`, skipping its per-call Python wrappers.

  Those wrappers (dict building, `config` rebuilt on every send, optree unflatten) cost
  more than stepping a batch of CartPoles. Field positions are looked up once; this is
  used only when the pool has the layout checked in `try_make` (single player, one
  array observation, actions `env_id, players.env_id, action`), and
  tests/envs/test_envpool.py checks it returns exactly what the public API does.
  """

  def __init__(self, pool: Any, atari: bool, terminal: TerminalTest | None,
               index: dict[str, int], action_dtype: np.dtype):  # fmt: skip
    self._send_fn, self._recv_fn = pool._send, pool._recv
    self._atari, self._terminal = atari, terminal
    self._i = index
    self._action_dtype = action_dtype

  @staticmethod
  def try_make(
      pool: Any, atari: bool, terminal: TerminalTest | None, action_dtype: np.dtype | None
  ) -> _FastPoolIO | None:
    if action_dtype is None:
      return None
    try:
      state_keys = list(pool._state_keys)
      action_keys = list(pool._action_keys)
      single_player = pool.config["max_num_players"] == 1
      callable_ = callable(pool._send) and callable(pool._recv)
    except (AttributeError, KeyError, IndexError, TypeError):
      return None
    needed = ["info:env_id", "done", "trunc", "reward", "obs"]
    if atari:
      needed += ["info:reward", "info:terminated"]
    if (
        not callable_
        or not single_player
        or action_keys != ["env_id", "players.env_id", "action"]
        or any(k not in state_keys for k in needed)
    ):
      return None
    index = {k: state_keys.index(k) for k in needed}
    return _FastPoolIO(pool, atari, terminal, index, action_dtype)

  def send(self, action: np.ndarray, env_id: np.ndarray) -> None:
    if action.dtype != self._action_dtype or not (
        action.flags.writeable and action.flags.c_contiguous
    ):
      action = np.array(action, self._action_dtype, order="C")  # envpool writes into it
    self._send_fn([env_id, env_id, action])

  def recv(self) -> _RawStep:
    state = self._recv_fn()
    i = self._i
    obs, truncated = state[i["obs"]], state[i["trunc"]]
    game_over = state[i["info:terminated"]] if self._atari else None
    terminated, truncated = split_limit_step(
        obs, state[i["done"]] & ~truncated, truncated, game_over, self._terminal, np
    )
    game_reward = state[i["info:reward"]] if self._atari else None
    env_id = state[i["info:env_id"]]
    return _RawStep(obs, state[i["reward"]], terminated, truncated, env_id, game_reward, game_over)


class EnvPoolEnv:
  """A pool of `num_envs` environments returning batched `TimeStep`s.

  Stateful by nature (it owns the simulators). Use `reset()` then `step(action)`, or,
  with batched stepping, `send(action, env_id)` and `recv()`. Actions are validated before
  anything is sent: wrong shape, wrong dtype kind, out-of-range discrete actions and
  non-finite continuous actions raise `ValueError`; continuous actions are clipped to
  their bounds.

  Attributes:
    spec: the `EnvSpec`.
    num_envs, batch_size, is_batched: the pool's layout.
    is_atari: Atari-like task: an episode is a whole game (all lives), scored with the
      unclipped game reward.
    pool_action_dtype: the dtype envpool itself takes actions in (float64 for MuJoCo,
      whatever `spec.action_dtype` says); None if envpool does not report it.
    terminal_test: (obs, xp) -> bool, the task's terminal test, used to tell a termination
      on the time limit's step from a truncation (module docstring); None where unknown.
  """

  def __init__(self, pool: Any, spec: EnvSpec, *, atari: bool, fast_io: bool = True):
    self._pool = pool
    self.spec = spec
    self.num_envs = spec.num_envs
    self.batch_size = spec.batch_size
    self.is_batched = spec.is_batched
    self.is_atari = atari
    self.pool_action_dtype = _pool_action_dtype(pool)
    self.terminal_test = terminal_test(
        spec.task_id, _task_family(_envpool(), spec.task_id), pool.config
    )
    terminal = self.terminal_test
    fast = _FastPoolIO.try_make(pool, atari, terminal, self.pool_action_dtype) if fast_io else None
    self._io = fast or _PublicPoolIO(pool, atari, terminal)
    n = self.num_envs
    self._last_env_id: np.ndarray | None = None
    self._in_flight = np.zeros((n,), bool)
    self._num_in_flight = 0
    self._next_is_first = np.ones((n,), bool)
    self._next_starts_episode = np.ones((n,), bool)
    self._episode_return = np.zeros((n,), np.float64)
    self._episode_length = np.zeros((n,), np.int64)
    self._finished: list[EpisodeStats] = []
    self._was_reset = False
    self._closed = False
    self._obs_dtype = np.dtype(spec.observation_dtype)
    self._convert_obs = self._obs_dtype != np.dtype(pool.observation_space.dtype)
    self._check_action = ActionChecker(spec)

  # ------------------------------------------------------------------ stepping

  def reset(self) -> TimeStep:
    """Resets every environment; returns FIRST steps.

    All `num_envs` environments, or with batched stepping the first `batch_size` of them
    to finish resetting; the others come out of later `recv()` calls, also as FIRST.
    Statistics of unfinished episodes are dropped (finished ones wait for
    `pop_episode_stats`). Raises RuntimeError if an action is
    still in flight (receive it first).
    """
    self.async_reset()
    return self.recv()

  def async_reset(self) -> None:
    """Starts resetting every environment without waiting: their FIRST steps come out
    of the following `recv()` calls. Same preconditions as `reset()`."""
    self.check_open()
    if self._num_in_flight:
      raise RuntimeError(
          f"reset with {self._num_in_flight} environment(s) still stepping; call "
          "recv() until none is in flight first"
      )
    self._next_is_first[:] = True
    self._next_starts_episode[:] = True
    self._episode_return[:] = 0.0
    self._episode_length[:] = 0
    self._pool.async_reset()
    self._in_flight[:] = True
    self._num_in_flight = self.num_envs
    self._last_env_id = None
    self._was_reset = True

  def step(self, action: Any, env_id: Any = None) -> TimeStep:
    """`send(action, env_id)` then `recv()`. Raises ValueError, before anything is sent,
    when fewer than `batch_size` environments would then be in flight (the `recv` would
    never return, and the actions sent would leave the pool stepping)."""
    # Counted only: `send` validates env_id (and action) before anything is sent.
    given = self._last_env_id if env_id is None else np.atleast_1d(np.asarray(env_id))
    k = 0 if given is None else given.shape[0]
    if self._was_reset and k and self._num_in_flight + k < self.batch_size:
      raise ValueError(
          f"step() with actions for {k} environment(s) and "
          f"{self._num_in_flight} in flight: a batch is {self.batch_size}, so its recv() "
          "would never return; send() them, and recv() once a batch is in flight"
      )
    self.send(action, env_id)
    return self.recv()

  def send(self, action: Any, env_id: Any = None) -> None:
    """Validates `action` [k, *action_shape] and sends it to environments `env_id` [k].

    `env_id` defaults to the environments of the last `recv()`/`reset()` (all of them
    unless stepping is batched). Raises ValueError for a bad action or env_id, or an env that already has
    an action in flight, before anything is sent. Continuous actions are clipped to
    their bounds.
    """
    self.check_open()
    if not self._was_reset:
      raise RuntimeError("call reset() before the first send()/step()")
    env_id = self._check_env_id(env_id)
    action = self._check_action(action, env_id.shape[0])
    self._io.send(action, env_id)
    self._in_flight[env_id] = True
    self._num_in_flight += env_id.shape[0]
    self._last_env_id = None

  def recv(self) -> TimeStep:
    """Receives the next `batch_size` steps (whichever environments are ready)."""
    raw = self.recv_raw()
    lo, hi = np.zeros_like(raw.env_id), np.ones_like(raw.env_id)
    step_type, reward, discount = self.convert_block(
        raw.env_id, lo, hi, *(None if x is None else x[None] for x in raw[1:4] + raw[5:])
    )
    return TimeStep(step_type[0], reward[0], discount[0], raw.obs, raw.env_id)

  def recv_raw(self) -> _RawStep:
    """envpool's recv and the in-flight bookkeeping, no conversion (see `convert_block`).

    For rollouts, which convert a whole unroll at once: returns (obs, reward, terminated,
    truncated, env_id, game_reward, game_over) as envpool gives them (the last two None
    unless `is_atari`), observations already in `spec.observation_dtype`.
    """
    if self._num_in_flight < self.batch_size:
      raise RuntimeError(
          f"recv() would block forever: {self._num_in_flight} environment(s) in flight "
          f"but a batch is {self.batch_size}; send() actions first"
      )
    raw = self._io.recv()
    self._in_flight[raw.env_id] = False
    self._num_in_flight -= raw.env_id.shape[0]
    self._last_env_id = raw.env_id
    if self._convert_obs:
      raw = raw._replace(obs=raw.obs.astype(self._obs_dtype))
    return raw

  def convert_block(
      self,
      env_id: np.ndarray,
      lo: np.ndarray,
      hi: np.ndarray,
      reward: np.ndarray,
      terminated: np.ndarray,
      truncated: np.ndarray,
      game_reward: np.ndarray | None,
      game_over: np.ndarray | None,
  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Converts raw envpool steps to (step_type, reward, discount), in time-major blocks.

    Column j holds consecutive steps of environment `env_id[j]`, rows `lo[j] <= r <
    hi[j]` in time order, following on from that environment's previous step; other rows
    are ignored (their outputs are meaningless). One vectorised pass over the block also
    advances the per-environment state (is the next step FIRST, episode statistics).
    `recv()` calls it with one row, the host-loop rollout once per unroll with T rows, on
    what `recv_raw()` returned.

    Args:
      env_id: [B] distinct environment ids.
      lo, hi: [B] int, the valid rows of each column.
      reward, terminated, truncated: [R, B] as envpool gives them.
      game_reward, game_over: [R, B] Atari `info["reward"]`, `info["terminated"]`.

    Returns:
      step_type [R, B] int32, reward [R, B] float32 (0 at FIRST), discount [R, B] float32.
    """
    rows = np.arange(terminated.shape[0])[:, None]
    valid = (rows >= lo) & (rows < hi)
    at_lo = rows == lo
    done = terminated | truncated
    # FIRST: the previous step of the same environment ended its episode.
    first = np.empty_like(done)
    first[1:] = done[:-1]
    first[0] = False
    first = np.where(at_lo, self._next_is_first[env_id], first)
    step_type = done.astype(STEP_TYPE_DTYPE)
    step_type += MID
    step_type[first] = FIRST
    reward = np.where(first, np.float32(0.0), reward.astype(np.float32, copy=False))
    discount = (~terminated).astype(np.float32)  # a reset step is never terminated

    # Episode statistics. For Atari an episode is a whole game scored with raw rewards.
    if self.is_atari:
      assert game_reward is not None and game_over is not None
      score = np.where(first, 0.0, game_reward)
      over = done & (truncated | game_over.astype(bool))
    else:
      score, over = reward, done
    starts = np.empty_like(over)
    starts[1:] = over[:-1]
    starts[0] = False
    starts = np.where(at_lo, self._next_starts_episode[env_id], starts) & valid
    score = np.where(valid, score, 0.0)
    counted = valid & ~first
    # Sums since the latest episode start (inclusive), else carried sums plus all rows.
    last_start = np.maximum.accumulate(np.where(starts, rows, -1), axis=0)
    from_start = last_start >= 0
    start_row = np.maximum(last_start, 0)
    returns, lengths = [], []
    for x, carried in ((score, self._episode_return), (counted, self._episode_length)):
      cum = np.cumsum(x, axis=0, dtype=carried.dtype)
      before = np.take_along_axis(cum, start_row, axis=0) - np.take_along_axis(x, start_row, axis=0)
      (returns if x is score else lengths).append(
          np.where(from_start, cum - before, cum + carried[env_id])
      )
    ret, length = returns[0], lengths[0]
    finished = over & valid
    if finished.any():
      r, c = np.nonzero(finished)
      self._finished.append(EpisodeStats(env_id[c].copy(), ret[r, c], length[r, c]))
    # Carry the state of each column's newest valid step.
    has = hi > lo
    if has.any():
      last, cols, ids = (hi - 1)[has], np.flatnonzero(has), env_id[has]
      self._next_is_first[ids] = done[last, cols]
      self._next_starts_episode[ids] = over[last, cols]
      self._episode_return[ids] = ret[last, cols]
      self._episode_length[ids] = length[last, cols]
    return step_type, reward, discount

  def pop_episode_stats(self) -> EpisodeStats:
    """Episodes finished since the last call, in the order they finished."""
    stats = EpisodeStats.concatenate(self._finished)
    self._finished = []
    return stats

  def render(self, env_ids: Any = None) -> np.ndarray:
    """RGB frames of environments' current states: [len(env_ids), H, W, 3] uint8.

    The pool must be made with `render_mode="rgb_array"` (`make(...,
    render_mode="rgb_array")`; `render_width` / `render_height` set the size where the
    task allows). Atari frames are the emulator's full-size colour screen, not the
    preprocessed observation.

    Args:
      env_ids: which environments, integers (default: the `render_env_id` given to
        `make`, else environment 0).
    """
    if getattr(self._pool, "render_mode", None) != "rgb_array":
      raise ValueError("render() needs a pool made with render_mode='rgb_array'")
    if env_ids is None:  # envpool's own default: render_env_id
      return np.array(self._pool.render(), copy=True)
    ids = np.atleast_1d(np.asarray(env_ids))
    if (
        ids.ndim != 1
        or ids.dtype.kind not in "iu"
        or (ids < 0).any()
        or (ids >= self.num_envs).any()
    ):
      raise ValueError(f"env_ids must be ints in [0, {self.num_envs}), got {env_ids!r}")
    return np.array(self._pool.render(env_ids=ids.astype(np.int32)), copy=True)

  def close(self) -> None:
    """Releases the simulators; `reset`, `send` and `step` raise RuntimeError after it."""
    self._closed = True
    close = getattr(self._pool, "close", None)
    if close is not None:
      close()

  def check_open(self) -> None:
    """Raises (RuntimeError) once `close()` has run."""
    if self._closed:
      raise RuntimeError(f"{self.spec.task_id}: the environments were closed (close())")

  def __enter__(self) -> EnvPoolEnv:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def __repr__(self) -> str:
    return (
        f"EnvPoolEnv({self.spec.task_id!r}, num_envs={self.num_envs}, "
        f"batch_size={self.batch_size})"
    )

  @property
  def num_in_flight(self) -> int:
    """How many environments have an action sent and not yet received."""
    return self._num_in_flight

  def mark_in_flight(self, env_id: np.ndarray, in_flight: bool) -> None:
    """Records that environments `env_id` have (or no longer have) an action in flight,
    for sends and receives made around this object (the compiled rollout's, through
    `pool`), so that `num_in_flight` stays true."""
    env_id = np.asarray(env_id, ENV_ID_DTYPE)
    self._num_in_flight += (1 if in_flight else -1) * int(
        (self._in_flight[env_id] != in_flight).sum()
    )
    self._in_flight[env_id] = in_flight

  @property
  def in_flight(self) -> np.ndarray:
    """[num_envs] bool (a copy): which environments have an action in flight."""
    return self._in_flight.copy()

  @property
  def pool(self) -> Any:
    """The underlying envpool gymnasium environment (for its XLA interface)."""
    return self._pool

  # ------------------------------------------------------------------ validation

  def _check_env_id(self, env_id: Any) -> np.ndarray:
    if env_id is None:
      if self._last_env_id is None:
        raise ValueError("send() needs env_id: no recv() since the last send()")
      return self._last_env_id
    env_id = np.asarray(env_id)
    if env_id.ndim != 1 or env_id.dtype.kind not in "iu":
      raise ValueError(
          f"env_id must be a 1-D integer array, got shape {env_id.shape} dtype {env_id.dtype}"
      )
    if env_id.size == 0:
      raise ValueError("env_id is empty")
    if env_id.min() < 0 or env_id.max() >= self.num_envs:
      raise ValueError(f"env_id out of range [0, {self.num_envs}): {env_id}")
    env_id = env_id.astype(ENV_ID_DTYPE, copy=False)
    if np.unique(env_id).shape[0] != env_id.shape[0]:
      raise ValueError(f"env_id has duplicates: {env_id}")
    if self._in_flight[env_id].any():
      raise ValueError(f"env_id {env_id[self._in_flight[env_id]]} already have an action in flight")
    return env_id


class ActionChecker:
  """Validates a batch of actions on the host, before anything is sent to environments.

  `checker(action, k)` takes `action` [k, *action_shape]: wrong shape, wrong dtype kind,
  out-of-range discrete actions and non-finite continuous actions raise `ValueError`;
  returns a private copy, int32 (discrete), or clipped to the spec's bounds (continuous).
  """

  def __init__(self, spec: EnvSpec):
    self._spec = spec
    if spec.is_discrete:
      self._num_actions = spec.num_actions
    else:
      self._low = np.asarray(spec.action_low, np.float32).reshape(spec.action_shape)
      self._high = np.asarray(spec.action_high, np.float32).reshape(spec.action_shape)

  def __call__(self, action: Any, k: int) -> np.ndarray:
    action = np.asarray(action)
    spec = self._spec
    expected = (k, *spec.action_shape)
    if spec.is_discrete:
      if action.dtype.kind not in "iu":
        raise ValueError(
            f"{spec.task_id}: discrete actions must have an integer dtype, " f"got {action.dtype}"
        )
      if action.shape != expected:
        raise ValueError(
            f"{spec.task_id}: action shape {action.shape}, expected {expected} "
            f"(one action per environment sent to)"
        )
      if action.min() < 0 or action.max() >= self._num_actions:
        bad = action[(action < 0) | (action >= self._num_actions)]
        raise ValueError(
            f"{spec.task_id}: discrete actions must be in [0, {self._num_actions}), " f"got {bad}"
        )
      return np.array(action, np.int32)  # a private, writeable copy (envpool writes into it)
    if action.dtype.kind != "f":
      raise ValueError(
          f"{spec.task_id}: continuous actions must have a floating dtype, got {action.dtype}"
      )
    if action.shape != expected:
      raise ValueError(
          f"{spec.task_id}: action shape {action.shape}, expected {expected} "
          f"(one action per environment sent to)"
      )
    if not np.isfinite(action).all():
      raise ValueError(f"{spec.task_id}: continuous actions must be finite, got {action}")
    return np.clip(action, self._low, self._high)


# ---------------------------------------------------------------------- factories


def _pool_action_dtype(pool: Any) -> np.dtype | None:
  """The dtype envpool takes actions in (its action spec's last entry), or None."""
  return action_dtype_of(pool.spec)


def action_dtype_of(pool_spec: Any) -> np.dtype | None:
  """The dtype envpool takes actions in (its action spec's last entry) in envpool's pool
  spec `pool_spec`, or None."""
  try:
    return np.dtype(pool_spec.action_array_spec["action"].dtype)
  except (AttributeError, KeyError, TypeError):
    return None


def pool_action_dtype(task_id: str, **envpool_kwargs: Any) -> np.dtype | None:
  """The dtype envpool takes the task's actions in (float64 for MuJoCo, where `spec` says
  float32), without making a pool; None where envpool does not report it."""
  envpool = check_task_id(task_id)
  return action_dtype_of(pool_spec_of(envpool, task_id, 1, dict(envpool_kwargs)))


def _spec_from_spaces(
    task_id: str, obs_space: Any, act_space: Any, num_envs: int, batch_size: int
) -> EnvSpec:
  """The `EnvSpec` of envpool's gymnasium observation and action spaces."""
  import gymnasium

  if not isinstance(obs_space, gymnasium.spaces.Box):
    raise ValueError(f"{task_id}: only Box observation spaces are supported, got {obs_space}")
  obs_dtype = np.dtype(obs_space.dtype)
  if obs_dtype == np.float64:
    obs_dtype = np.dtype(np.float32)
  if isinstance(act_space, gymnasium.spaces.Discrete):
    if int(act_space.start) != 0:
      raise ValueError(f"{task_id}: Discrete action spaces must start at 0, got {act_space}")
    return EnvSpec(
            task_id, tuple(obs_space.shape), obs_dtype.name, True, int(act_space.n), (),
            "int32", None, None, num_envs, batch_size,
        )  # fmt: skip
  if isinstance(act_space, gymnasium.spaces.Box):
    low = np.broadcast_to(act_space.low, act_space.shape).astype(np.float64).ravel()
    high = np.broadcast_to(act_space.high, act_space.shape).astype(np.float64).ravel()
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
      raise ValueError(f"{task_id}: continuous action bounds must be finite, got {act_space}")
    if max(np.abs(low).max(), np.abs(high).max()) > np.finfo(np.float32).max:
      raise ValueError(  # ViZDoom's [2.2e-308, 1.8e308]: float64 limits standing for none
          f"{task_id}: continuous action bounds must be finite in float32, the agents' "
          f"actions, got {act_space}"
      )
    return EnvSpec(
            task_id, tuple(obs_space.shape), obs_dtype.name, False, None,
            tuple(act_space.shape), "float32", tuple(low.tolist()), tuple(high.tolist()),
            num_envs, batch_size,
        )  # fmt: skip
  raise ValueError(f"{task_id}: unsupported action space {act_space}")


def check_task_id(task_id: Any) -> Any:
  """The envpool module, once `task_id` is known to be one of its task ids (ValueError
  otherwise, with the closest ids as a hint)."""
  envpool = _envpool()
  if not isinstance(task_id, str):
    raise ValueError(f"task_id must be a str, got {task_id!r}")
  if is_functional(task_id):
    raise ValueError(f"{task_id!r} is a JAX environment: make it with envs.make_functional "
                     "(envpool takes ids such as CartPole-v1)")  # fmt: skip
  all_ids = envpool.list_all_envs()
  if task_id not in all_ids:
    if task_id in GYMNAX_TASKS:  # MinAtar: gymnax's alone
      raise ValueError(f"unknown task id {task_id!r}: envpool has no {task_id}; the JAX "
                       f"environment is 'gymnax:{task_id}'")  # fmt: skip
    close = difflib.get_close_matches(task_id, all_ids, n=5)
    hint = f"; did you mean one of {close}?" if close else "; see envpool.list_all_envs()"
    if ":" in task_id and not close:  # not a JAX environment's prefix either
      hint += " (JAX environments: gymnax:NAME, brax:NAME)"
    raise ValueError(f"unknown task id {task_id!r}{hint}")
  return envpool


def _is_atari(envpool: Any, task_id: str) -> bool:
  spec = _make_spec(envpool, task_id)
  keys = set(spec.state_array_spec)
  return "episodic_life" in spec.config._fields and {"info:reward", "info:terminated"} <= keys


def is_atari(task_id: str) -> bool:
  """Whether `task_id` is an Atari-like envpool task (what `make_atari` takes).

  Atari-like: envpool's Atari options (episodic life, ...) and, in `info`, the unclipped
  game reward and a game-over flag, so that episodes can be scored as whole games.

  Raises:
    ValueError: unknown task id.
  """
  return _is_atari(check_task_id(task_id), task_id)


LIMIT_NOT_APPLIED = (
    "envpool.highway *", "envpool.gfootball *", "envpool.pgx *", "envpool.toy_text Catch-*",
    "envpool.toy_text *CliffWalking*", "envpool.toy_text Blackjack-*",
)  # fmt: skip
"""envpool tasks whose episodes do not end at a `max_episode_steps` given to them, as
"<envpool module> <task id>" patterns (measured with envpool 1.2.5 at limits of 1 to 3:
highway-env, Google Research Football and pgx episodes ran past it, bsuite's Catch to 9
steps, CliffWalking on, Blackjack's hands to their natural end; FrozenLake, Taxi and NChain
end at it). envpool still flags every episode end past the limit as a truncation, so their
terminations would be learned as time limits (discount 1): the option is refused for
them."""


def _task_family(envpool: Any, task_id: str) -> str:
  """envpool's module of the task ("envpool.classic_control", "envpool.atari", ...)."""
  entry = envpool.registration.registry.specs.get(task_id)
  return entry[0] if isinstance(entry, tuple) and entry else ""


def _option_like(name: str, value: Any, default: Any) -> Any:
  """`value` of envpool option `name` as the type of its `default` (bool, int, float or
  str); raises ValueError naming the option otherwise (envpool's constructor would refuse
  it listing every option's type, none by name)."""
  if isinstance(default, bool):
    return check_bool(name, value)
  if isinstance(default, int):
    return check_int(name, value, -(2**31), 2**31)
  if isinstance(default, float):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
      raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)
  if isinstance(default, str) and not isinstance(value, str):
    raise ValueError(f"{name} must be a str, got {value!r}")
  return value


def _pool_kwargs(
    envpool: Any, task_id: str, num_envs: Any, envpool_kwargs: dict[str, Any]
) -> tuple[int, int, dict[str, Any]]:
  """Validates `num_envs` and envpool options: (num_envs, batch_size, the other options)."""
  num_envs = check_int("num_envs", num_envs)
  envpool_kwargs = dict(envpool_kwargs)
  if envpool_kwargs.pop("gym_reset_return_info", True) is not True:
    raise ValueError("gym_reset_return_info=False is not supported (env_id comes from info)")
  defaults = _make_spec(envpool, task_id).config._asdict()
  valid = (set(defaults) - set(_RESERVED_KWARGS)) | set(_RENDER_KWARGS)
  unknown = sorted(set(envpool_kwargs) - valid)
  if unknown:
    raise ValueError(f"unknown envpool option(s) {unknown} for {task_id}; valid: {sorted(valid)}")
  batch_size = envpool_kwargs.pop("batch_size", num_envs)
  batch_size = check_int("batch_size", batch_size)
  if batch_size > num_envs:
    raise ValueError(f"batch_size ({batch_size}) must be <= num_envs ({num_envs})")
  if "max_episode_steps" in envpool_kwargs:
    check_int("max_episode_steps", envpool_kwargs["max_episode_steps"], 1, 2**31)
    family = _task_family(envpool, task_id)
    if any(fnmatch.fnmatchcase(f"{family} {task_id}", p) for p in LIMIT_NOT_APPLIED):
      raise ValueError(
          f"max_episode_steps: {task_id} ({family}) does not end its episodes at it, and "
          "envpool would flag its terminations past it as truncations (discount 1): leave "
          "it unset"
      )
  for name, low in _INT_OPTIONS.items():
    if name in envpool_kwargs:
      check_int(name, envpool_kwargs[name], low, 2**31)
  for name, value in envpool_kwargs.items():  # the bounded ints' own messages came first
    if name in defaults:
      envpool_kwargs[name] = _option_like(name, value, defaults[name])
  sticky = envpool_kwargs.get("repeat_action_probability", 0.0)  # a float by now
  if not 0 <= sticky <= 1:
    raise ValueError(f"repeat_action_probability must be a number in [0, 1], got {sticky!r}")
  return num_envs, batch_size, envpool_kwargs


def make(task_id: str, num_envs: int, seed: int, **envpool_kwargs: Any) -> EnvPoolEnv:
  """Makes `num_envs` envpool environments with ALF's TimeStep semantics.

  Args:
    task_id: an envpool task id ("CartPole-v1", "Pendulum-v1", "Pong-v5", "Hopper-v4").
    num_envs: number of environments, >= 1.
    seed: base seed; envpool seeds environment i with `seed + i`.
    **envpool_kwargs: passed to `envpool.make_gymnasium`, e.g. `batch_size` (< num_envs
      for batched stepping), `num_threads`, `max_episode_steps`, Atari options.

  Returns:
    An `EnvPoolEnv`. Call `reset()` before stepping.

  Raises:
    ValueError: unknown task id, bad num_envs / seed / batch_size, unknown envpool option,
      an unsupported observation or action space, a task of several players, or one
      whose envpool module cannot load.
  """
  envpool = check_task_id(task_id)
  check_int("seed", seed, 0, 2**31)  # envpool's seeds are int32
  for key in _RESERVED_KWARGS[:3]:
    if key in envpool_kwargs:
      arg = "seed" if key == "env_seed" else key  # env_seed would override seed, silently
      raise ValueError(f"pass {arg} as an argument of make(), not {key} in envpool_kwargs")
  num_envs, batch_size, envpool_kwargs = _pool_kwargs(envpool, task_id, num_envs, envpool_kwargs)
  # The spaces are checked on envpool's spec, before a pool exists: a refused task starts
  # no simulator.
  pool_spec = _checked_pool_spec(envpool, task_id, num_envs, batch_size, envpool_kwargs)
  spec_ = _spec_of_pool(task_id, pool_spec)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # gymnasium's float64 Box casting notes
    pool = envpool.make_gymnasium(
        task_id,
        num_envs=num_envs,
        batch_size=batch_size,
        seed=int(seed),
        gym_reset_return_info=True,
        **envpool_kwargs,
    )
    return EnvPoolEnv(pool, spec_, atari=_is_atari(envpool, task_id))  # reads pool's spaces


def atari_kwargs(envpool: Any, task_id: str, train: bool, envpool_kwargs: dict[str, Any],
                 caller: str = "make_atari"):  # fmt: skip
  """The Atari preset's envpool options with `envpool_kwargs` on top (checks the id;
  `caller` names the function a refusal is about)."""
  check_bool(f"{caller}'s train", train)
  if not _is_atari(envpool, task_id):
    raise ValueError(f"{caller} expects an envpool Atari id such as 'Pong-v5', got {task_id!r}")
  return {**(ATARI_TRAIN_KWARGS if train else ATARI_EVAL_KWARGS), **envpool_kwargs}


def make_atari(
    task_id: str, num_envs: int, seed: int, *, train: bool = True, **envpool_kwargs: Any
) -> EnvPoolEnv:
  """Makes Atari environments with envpool's standard preprocessing.

  Observations are [4, 84, 84] uint8 (grey, frame stack 4, frame skip 4), with up to 30
  no-op starts. A life loss ends an episode (LAST, discount 0; the game goes on after the
  FIRST step that follows, in which envpool presses FIRE, as at the game's start). With
  `train=True` rewards are clipped to {-1, 0, 1}; with `train=False` they are the raw game
  rewards. Either way `pop_episode_stats()` reports the raw game score and length of whole
  games.

  Args:
    task_id: an envpool Atari id, e.g. "Pong-v5", "Breakout-v5".
    num_envs, seed: as in `make`.
    train: reward clipping on (training) or off (evaluation).
    **envpool_kwargs: override any preset option, or add others (batch_size, ...).
  """
  envpool = check_task_id(task_id)
  return make(task_id, num_envs, seed, **atari_kwargs(envpool, task_id, train, envpool_kwargs))


def spec(task_id: str, *, atari: bool = False, num_envs: int = 1, **envpool_kwargs: Any) -> EnvSpec:
  """The `EnvSpec` of a task, without making any environment (from `envpool.make_spec`).

  Equal to `make(task_id, num_envs, seed, **envpool_kwargs).spec`, or with `atari=True`
  to `make_atari(...).spec` (the Atari preset's [4, 84, 84] uint8 observations), for any
  seed. `EnvSpec` also describes a pool's layout: `num_envs` and `batch_size` are the ones
  given here (defaults: 1, and `batch_size = num_envs`); nothing else depends on them.

  Args:
    task_id: an envpool task id.
    atari: apply the Atari preset, as `make_atari` does.
    num_envs: the `num_envs` the spec reports.
    **envpool_kwargs: as in `make` / `make_atari` (options that change the spaces, e.g.
      `img_height`, matter; `batch_size` is reported).

  Raises:
    ValueError: as `make` / `make_atari` would for these arguments.
  """
  envpool = check_task_id(task_id)
  if "seed" in envpool_kwargs:
    raise ValueError("spec() takes no seed: the spec does not depend on it")
  if check_bool("atari", atari):
    envpool_kwargs = atari_kwargs(envpool, task_id, True, envpool_kwargs, "spec(atari=True)")
  return _spec_of_pool(task_id, pool_spec_of(envpool, task_id, num_envs, envpool_kwargs))


def _spec_of_pool(task_id: str, pool_spec: Any) -> EnvSpec:
  """The `EnvSpec` of the pool envpool's spec `pool_spec` describes (no pool made), refused
  (ValueError) for spaces the agents cannot use."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # gymnasium's float64 Box casting notes
    return _spec_from_spaces(
        task_id,
        pool_spec.gymnasium_observation_space,
        pool_spec.gymnasium_action_space,
        pool_spec.config.num_envs,
        pool_spec.config.batch_size,
    )


def pool_spec_of(envpool: Any, task_id: str, num_envs: int, envpool_kwargs: dict[str, Any]) -> Any:
  """envpool's spec of a pool (`envpool.make_spec`): its config and spaces, no pool made.
  Refuses (ValueError) a task of several players or one whose module cannot load."""
  num_envs, batch_size, envpool_kwargs = _pool_kwargs(envpool, task_id, num_envs, envpool_kwargs)
  return _checked_pool_spec(envpool, task_id, num_envs, batch_size, envpool_kwargs)


def _make_spec(envpool: Any, task_id: str, **envpool_kwargs: Any) -> Any:
  """`envpool.make_spec`, its module's ImportError (Procgen without the system's Qt 5, say)
  as a ValueError naming the task."""
  try:
    return envpool.make_spec(task_id, **envpool_kwargs)
  except ImportError as e:
    raise ValueError(f"{task_id}: envpool cannot load this task's module: {e}") from e


def _checked_pool_spec(envpool: Any, task_id: str, num_envs: int, batch_size: int,
                       envpool_kwargs: dict[str, Any]) -> Any:  # fmt: skip
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)  # gymnasium's float64 Box casting notes
    pool_spec = _make_spec(
        envpool, task_id, num_envs=num_envs, batch_size=batch_size, **envpool_kwargs
    )
  players = pool_spec.config.max_num_players
  if players != 1 or "players.action" in pool_spec.action_array_spec:
    raise ValueError(
        f"{task_id}: tasks of several players are not supported (envpool's max_num_players "
        f"is {players}, and each player takes its own action)"
    )
  return pool_spec
