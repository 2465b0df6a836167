"""Demonstrations: recording episodes, saving them, and cutting them into sequences.

A demonstration file (`.npz`) holds whole episodes back to back, each as the
TimeSteps FIRST, MID, ..., LAST with the action taken at each step (at LAST, the
policy's action on the final observation, never stepped: no transition starts there):
`observation [N, ...]`, `action [N, ...]`, `reward [N]`, `discount [N]`,
`step_type [N]`, and `episode_lengths [E]` (steps per episode, FIRST and LAST
included), plus `env_id` (the task) as metadata.

Episodes of varying length are cut into fixed-length sequences of L steps
(L - 1 transitions; consecutive pieces share one step) with the three modes of
the IMPALA document for the residual piece shorter than L:

* `drop`: discard it;
* `last` (default): take the last L steps of the episode instead (the residual
  is padded with the steps just before it);
* `null_padding`: pad it after the episode's LAST step with steps of type LAST,
  reward 0 and discount 0, whose outgoing transitions are masked out.

Episodes shorter than L steps cannot be filled from before: `last` pads them
like `null_padding`, `drop` drops them.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any
from typing import Callable
import zipfile
import zlib

import numpy as np

from offpolicy_ac import _memory
from offpolicy_ac._oserrors import naming
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST
from offpolicy_ac.envs import MID
from offpolicy_ac.envs import EnvSpec
from offpolicy_ac.envs import Trajectory

__all__ = [
    "CUT_MODES",
    "check_demo_sequences",
    "check_demos",
    "clip_to_box",
    "cut_episodes",
    "load_demos",
    "record_episodes",
    "save_demos",
]

CUT_MODES = ("drop", "last", "null_padding")
"""The ways `cut_episodes` treats an episode's residual piece (see the module docstring)."""
_FIELDS = ("step_type", "reward", "discount", "observation", "action")
# What reading a damaged or foreign file raises (zlib.error: a damaged compressed member).
_UNREADABLE = (zipfile.BadZipFile, zlib.error, ValueError, EOFError, OSError, KeyError)


def clip_to_box(policy: Callable[[np.ndarray], np.ndarray], low: Any, high: Any,
                fraction: float = 1.0) -> Callable[[np.ndarray], np.ndarray]:  # fmt: skip
  """`policy` with its continuous actions [B, *action_shape] clipped to the action box
  [low, high] (flattened bounds, one per action dimension, as `envs.EnvSpec` has them)
  shrunk to `fraction` of its width around its centre, so the actions the environment
  steps with and the actions recorded are the same.

  A Gaussian policy's actions (IMPALA's, ACER's) lie outside the box, which the
  environment clips: with `fraction` 1 the demonstrations hold the actions actually
  taken. Below 1 keeps them off the box's faces and corners, which a tanh-squashed
  learner (continuous SQL, SQIL) reaches only in the limit.

  An unbounded dimension (an infinite bound) is clipped at its finite bound only, and
  only with `fraction` 1: a box without a centre cannot be shrunk.

  Raises:
    ValueError: `fraction` outside (0, 1], bounds that are not a box (low >= high), or an
      infinite bound with `fraction` < 1.
  """
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
  low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
  if low.shape != high.shape or not np.all(low < high):
    raise ValueError(f"the action box needs low < high elementwise, got {low} and {high}")
  if fraction == 1.0:
    lo, hi = low, high
  elif not np.all(np.isfinite(low) & np.isfinite(high)):
    raise ValueError(f"fraction {fraction} shrinks the action box around its centre, which "
                     f"needs finite bounds, got {low} and {high}")  # fmt: skip
  else:
    mid, half = (low + high) / 2, (high - low) / 2 * fraction
    lo, hi = mid - half, mid + half

  def clipped(obs: np.ndarray) -> np.ndarray:
    action = np.asarray(policy(obs))
    flat = action.reshape(action.shape[0], -1)  # [B, d], as the bounds
    return np.clip(flat, lo.reshape(-1), hi.reshape(-1)).reshape(action.shape).astype(action.dtype)

  return clipped


def record_episodes(
    env: Any,
    policy: Callable[[np.ndarray], np.ndarray],
    num_episodes: int,
    max_steps: int = 10_000_000,
) -> dict[str, np.ndarray]:
  """Runs `policy(obs [B, ...]) -> action [B, ...]` and returns the first episode
  of each of `env.num_envs == num_episodes` environments (so no episode is
  chosen for being short), in the file layout above. An episode is what the
  environment's episode statistics count (`pop_episode_stats`): on Atari a whole game,
  recorded as the episodes its life losses end (as training sees them)."""
  if env.num_envs != num_episodes:
    raise ValueError(f"use a pool of num_episodes={num_episodes} envs, got {env.num_envs}")
  env.pop_episode_stats()
  ts = env.reset()
  current: list[list[tuple]] = [[] for _ in range(num_episodes)]
  pieces: list[list[list[tuple]]] = [[] for _ in range(num_episodes)]
  counted = np.zeros(num_episodes, bool)  # its episode statistics came: the next LAST ends it
  done = np.zeros(num_episodes, bool)
  for _ in range(max_steps):
    action = np.asarray(policy(ts.observation))
    for i, env_id in enumerate(ts.env_id):
      if done[env_id]:
        continue
      step = (ts.step_type[i], ts.reward[i], ts.discount[i], ts.observation[i], action[i])
      current[env_id].append(step)
      if ts.step_type[i] == LAST:
        pieces[env_id].append(current[env_id])
        current[env_id] = []
        done[env_id] = counted[env_id]
    if done.all():
      break
    ts = env.step(action)
    counted[env.pop_episode_stats().env_id] = True
  else:
    raise RuntimeError(f"{num_episodes} episodes did not finish in {max_steps} steps")
  episodes = [piece for env_pieces in pieces for piece in env_pieces]
  steps = [s for episode in episodes for s in episode]
  out = {name: np.stack([s[k] for s in steps]) for k, name in enumerate(_FIELDS)}
  out["episode_lengths"] = np.array([len(e) for e in episodes], np.int64)
  return out


def save_demos(path: str | os.PathLike, demos: dict[str, np.ndarray], *, env_id: str) -> None:
  """Writes `demos` (as `record_episodes` or `load_demos` returns them) and the task id to
  an `.npz` file.

  The file is written next to `path` (`~` expanded, as the scripts' `--out`) and renamed
  into place, so a reader never sees a partial file.

  Raises:
    ValueError: `env_id` is not a task id (a non-empty str), `demos` holds another's, or
      `demos` is not whole episodes as `load_demos` reads them (a field missing, step
      counts that disagree, ...): nothing is written.
    IsADirectoryError: `path` is a directory.
  """
  if not isinstance(env_id, str) or not env_id:
    raise ValueError(f"env_id must be a task id (a non-empty str), got {env_id!r}")
  demos = dict(demos)
  held = demos.pop("env_id", env_id)  # load_demos's dict holds it
  if str(held) != env_id:
    raise ValueError(f"the demonstrations are of {held}, and env_id is {env_id}")
  missing = [k for k in (*_FIELDS, "episode_lengths") if k not in demos]
  if missing:
    raise ValueError(f"the demonstrations lack {missing}: nothing written to {path}")
  demos = {k: np.asarray(v) for k, v in demos.items()}
  _check_episodes(demos, "the demonstrations to write")
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    raise IsADirectoryError(f"{path} is a directory: give the demonstration file's path")
  tmp = str(path) + ".tmp.npz"
  try:
    with naming(path):  # a write's error (a full disk) names the file
      np.savez_compressed(tmp, env_id=np.array(env_id), **demos)
      os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def load_demos(path: str | os.PathLike) -> dict[str, Any]:
  """Loads and validates a demonstration file (`~` expanded, as the scripts' paths).

  Raises:
    FileNotFoundError: no such file.
    ValueError: not a demonstration file (not an `.npz`, damaged, or missing fields), or
      fields that are not whole episodes: step counts that disagree, `reward`,
      `discount` or `step_type` not [N], episodes that do not run FIRST, MID, ..., LAST
      over `episode_lengths` (integers >= 2), discounts outside [0, 1], or other than 1
      before an episode's LAST step."""
  not_demos = (f"{path} is not a readable demonstration file (an .npz written by "
               "experiments/record_demos.py or demos.save_demos)")  # fmt: skip
  try:
    loaded = np.load(os.path.expanduser(path), allow_pickle=False)
  except FileNotFoundError:
    raise FileNotFoundError(f"no demonstration file {path}") from None
  except _UNREADABLE as e:
    raise ValueError(not_demos) from e
  if not isinstance(loaded, np.lib.npyio.NpzFile):  # a single array (.npy)
    raise ValueError(not_demos)
  try:
    with loaded as f:
      demos = {k: f[k] for k in f.files}
  except _UNREADABLE as e:
    raise ValueError(f"{not_demos}: {e}") from e
  missing = [k for k in (*_FIELDS, "episode_lengths", "env_id") if k not in demos]
  if missing:
    raise ValueError(f"{path} is not a demonstration file: missing {missing}")
  env_id = demos["env_id"]
  if env_id.shape or env_id.dtype.kind != "U" or not str(env_id):
    got = f"an array of shape {env_id.shape}" if env_id.shape else type(env_id.item()).__name__
    raise ValueError(f"{path} is not a demonstration file: its `env_id` must be a task id (a "
                     f"str), got {got}")  # fmt: skip
  _check_episodes(demos, path)
  demos["env_id"] = str(env_id)
  return demos


def _check_episodes(demos: dict[str, np.ndarray], path: Any) -> None:
  """Refuses fields that do not describe whole episodes in the file layout above."""
  lengths = demos["episode_lengths"]
  if lengths.shape == (0,):
    raise ValueError(f"{path}: the demonstrations hold no episode")
  if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer) or (lengths < 2).any():
    raise ValueError(f"{path}: `episode_lengths` must be integers >= 2 (an episode's FIRST to "
                     f"its LAST step), one per episode, got {lengths.dtype}{list(lengths.shape)} "
                     f"{lengths.reshape(-1)[:5].tolist()}")  # fmt: skip
  n = int(lengths.sum())
  for name in _FIELDS:
    if demos[name].shape[:1] != (n,):
      raise ValueError(f"{path}: `{name}` has {demos[name].shape[:1]} steps, episode lengths "
                       f"add up to {n}")  # fmt: skip
  for name in ("step_type", "reward", "discount"):
    if demos[name].ndim != 1:
      raise ValueError(f"{path}: `{name}` must be [N], one per step, got shape "
                       f"{demos[name].shape}")  # fmt: skip
  step_type, discount = demos["step_type"], demos["discount"]
  expected = np.full(n, MID)
  expected[np.cumsum(lengths) - lengths], expected[np.cumsum(lengths) - 1] = FIRST, LAST
  if not np.issubdtype(step_type.dtype, np.integer) or (step_type != expected).any():
    raise ValueError(f"{path}: `step_type` must be integers, each episode FIRST ({FIRST}), MID "
                     f"({MID}) ..., LAST ({LAST})")  # fmt: skip
  if not np.issubdtype(discount.dtype, np.floating) or ((discount < 0) | (discount > 1)).any():
    raise ValueError(f"{path}: `discount` must be floats in [0, 1]")
  inside = (expected != LAST) & (discount != 1)
  if inside.any():  # a 0 inside an episode would cut its bootstrap there, unseen
    k = int(np.argmax(inside))
    raise ValueError(f"{path}: `discount` must be 1 at FIRST and MID steps, got {discount[k]} at "
                     f"step {k} (a step that ends its episode is LAST: discount 0 at a "
                     "termination, 1 at a time limit)")  # fmt: skip
  if not np.issubdtype(demos["reward"].dtype, np.floating):
    raise ValueError(f"{path}: `reward` must be floats, got {demos['reward'].dtype}")


def check_demos(demos: dict[str, Any], spec: EnvSpec, where: str = "the demonstrations") -> None:
  """Refuses demonstrations that do not fit a task (`envs.EnvSpec`): observations of
  another shape or kind (integers for a float task), actions of another shape, kind or
  range (a discrete action outside [0, num_actions), a continuous one outside the action
  box or not finite), non-finite rewards, discounts or observations. The range of a LAST
  step's action is not checked (never stepped: no transition starts there); a non-finite
  action is refused there too (the file is damaged)."""
  obs, action = demos["observation"], demos["action"]
  stepped = (np.asarray(demos["step_type"]) != LAST).reshape((-1,) + (1,) * (action.ndim - 1))
  if tuple(obs.shape[1:]) != tuple(spec.observation_shape):
    raise ValueError(f"{where}: observations of shape {tuple(obs.shape[1:])}, the task's are "
                     f"{tuple(spec.observation_shape)} ({spec.task_id})")  # fmt: skip
  if np.dtype(obs.dtype).kind != np.dtype(spec.observation_dtype).kind:
    raise ValueError(f"{where}: {obs.dtype} observations, the task's are "
                     f"{spec.observation_dtype} ({spec.task_id})")  # fmt: skip
  if tuple(action.shape[1:]) != tuple(spec.action_shape):
    raise ValueError(f"{where}: actions of shape {tuple(action.shape[1:])}, the task's are "
                     f"{tuple(spec.action_shape)} ({spec.task_id})")  # fmt: skip
  if spec.is_discrete:
    if not np.issubdtype(action.dtype, np.integer):
      raise ValueError(f"{where}: {action.dtype} actions, the task's are discrete (integers)")
    bad = ((action < 0) | (action >= spec.num_actions)) & stepped
    if bad.any():
      raise ValueError(
          f"{where}: actions must lie in [0, {spec.num_actions}) for {spec.task_id}, got "
          f"{sorted(set(action[bad].tolist()))[:5]} ({int(bad.sum())} of {bad.size} steps)"
      )
  else:
    if not np.issubdtype(action.dtype, np.floating):
      raise ValueError(f"{where}: {action.dtype} actions, the task's are continuous (floats)")
    # In the actions' precision: float32 actions clipped to a bound that float32 cannot
    # hold exactly (Humanoid's 0.4) round to the float32 bound, just outside the float64 one.
    low, high = (np.asarray(b).astype(action.dtype).reshape(spec.action_shape)
                 for b in (spec.action_low, spec.action_high))  # fmt: skip
    if not np.isfinite(action).all() or (((action < low) | (action > high)) & stepped).any():
      raise ValueError(f"{where}: actions outside the task's action box [{spec.action_low}, "
                       f"{spec.action_high}] or not finite (record_demos.py "
                       "--action-box-fraction 1 records the actions the task clips them to)")  # fmt: skip
  for name in ("reward", "discount", "observation"):
    values = demos[name]
    if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
      raise ValueError(f"{where}: non-finite {name}s")


def check_demo_sequences(
    sequences: Trajectory, spec: EnvSpec, where: str = "the demonstrations"
) -> None:
  """`check_demos` for demonstrations cut into sequences (`cut_episodes`), a Trajectory
  [L, S, ...]: the checks SQIL's training runs on its `batch_fn`'s demonstrations before
  anything compiles. The range of LAST steps' actions, padding's included, is not
  checked: no transition starts there."""
  if not isinstance(sequences, Trajectory):
    raise TypeError(f"{where}: a Trajectory [L, S, ...] of sequences (demos.cut_episodes), "
                    f"got {type(sequences).__name__}")  # fmt: skip
  step_type = np.asarray(sequences.step_type)
  fields = {name: np.asarray(getattr(sequences, name)) for name in _FIELDS}
  if step_type.ndim != 2 or any(x.shape[:2] != step_type.shape for x in fields.values()):
    shapes = {name: x.shape for name, x in fields.items()}
    raise ValueError(f"{where}: sequences [L, S, ...] share their step types' two leading "
                     f"axes, got shapes {shapes}")  # fmt: skip
  flat = {name: x.reshape((-1,) + x.shape[2:]) for name, x in fields.items()}
  check_demos(flat, spec, where)  # LAST steps' actions: their range unchecked


def _pieces(n: int, length: int, mode: str) -> list[tuple[int, int]]:
  """(start, stop) of the pieces of an episode of n steps; stop - start <= length."""
  stride = length - 1
  pieces = []
  start = 0
  while start + length <= n:
    pieces.append((start, start + length))
    start += stride
  covered = pieces[-1][1] if pieces else (1 if n >= 1 else 0)
  if covered < n:  # a residual of transitions remains
    if mode == "drop":
      pass
    elif mode == "last" and n >= length:
      pieces.append((n - length, n))
    else:  # null_padding, or `last` on an episode shorter than one piece
      begin = pieces[-1][1] - 1 if pieces else 0
      pieces.append((begin, n))
  return pieces


def _check_cut_fits(demos: dict[str, Any], length: int, pieces: int) -> None:
  """Refuses a cut whose `pieces` sequences need more memory than the host has available
  (each is `length` steps, padded where the episode is shorter: a huge length was a kill).
  The cut fills its arrays in place: they are all it allocates."""
  step = 4 + sum(  # env_id (int32) and the fields
      np.dtype(demos[name].dtype).itemsize * int(np.prod(np.shape(demos[name])[1:]))
      for name in _FIELDS
  )
  _memory.check_fits(
      pieces * length * step, _memory.host_available_bytes(),
      what=f"cutting the demonstrations into sequences of {length:,} steps needs",
      details=f"{pieces:,} sequences of {length * step:,} bytes",
      free_said="of memory available", hint="a smaller --mini-batch-length (sqil.py)",
  )  # fmt: skip


def cut_episodes(demos: dict[str, Any], length: int, mode: str = "last") -> Trajectory:
  """Cuts episodes into sequences of `length` steps: a Trajectory [length, S, ...].

  Args:
    demos: as returned by `load_demos` / `record_episodes`.
    length: L >= 2 steps per sequence (mini_batch_length + 1).
    mode: "drop", "last" or "null_padding" (see the module docstring).
  """
  if mode not in CUT_MODES:
    raise ValueError(f"mode must be one of {CUT_MODES}, got {mode!r}")
  if not isinstance(length, (int, np.integer)) or isinstance(length, bool) or length < 2:
    raise ValueError(f"length must be an int >= 2, got {length!r}")
  length = int(length)
  lengths = demos["episode_lengths"]
  if not len(lengths):
    raise ValueError("the demonstrations hold no episode")
  offsets = np.concatenate([[0], np.cumsum(lengths)])
  pieces = [(int(offsets[e]) + start, int(offsets[e]) + stop)
            for e, n in enumerate(lengths) for start, stop in _pieces(int(n), length, mode)]  # fmt: skip
  if not pieces:
    longest = int(np.max(lengths))
    raise ValueError(f"no sequence of {length} steps could be cut with mode {mode!r}: the "
                     f"longest episode has {longest} steps (sqil.py: a --mini-batch-length "
                     f"below {longest}, or --cut-mode last)")  # fmt: skip
  _check_cut_fits(demos, length, len(pieces))
  # Filled in place: these arrays are all the cut allocates (what `_check_cut_fits` counts).
  # A piece shorter than `length` is padded with LAST steps that repeat its last
  # observation, with zero rewards, discounts and actions.
  cut = {name: np.zeros((length, len(pieces)) + demos[name].shape[1:], demos[name].dtype)
         for name in _FIELDS}  # fmt: skip
  for s, (lo, hi) in enumerate(pieces):
    for name in _FIELDS:
      cut[name][: hi - lo, s] = demos[name][lo:hi]
    cut["step_type"][hi - lo :, s] = LAST
    cut["observation"][hi - lo :, s] = demos["observation"][hi - 1]
  return Trajectory(
      step_type=cut["step_type"],
      reward=cut["reward"],
      discount=cut["discount"],
      observation=cut["observation"],
      env_id=np.zeros((length, len(pieces)), np.int32),
      action=cut["action"],
      extras={},
  )
