"""Asynchronous actors against the synchronous loop and raw envpool stepping (IMPALA, CPU).

    python experiments/bench_async.py                                   # CartPole and Pong
    python experiments/bench_async.py --tasks Pong-v5 --repeats 5 --out results/speed/async_cpu
    python experiments/bench_async.py --cartpole-steps 20000 --pong-steps 3000 --repeats 1

It answers two questions: how many env steps per second the asynchronous loop gains over
the synchronous one, and how close it comes to raw envpool stepping with the same
environments when the learner keeps up. For each task, in one process, `repeats` rounds,
each measuring in turn:

  probe:          one actor's unroll ([T+1, num_envs] with the agent's jitted `act`, as an
                  actor thread runs it) and one learner update on such a trajectory, timed
                  alone: which side is the bottleneck ("the learner keeps up" when one
                  update takes no longer than an unroll / K, K actors producing at once);
  raw:            envpool's gymnasium `step` with pre-drawn random actions, nothing else, on
                  pools built exactly as the loop builds them: `1 x N` (the sync loop's
                  pool), `1 x K*N` (one pool with as many envs as the async run), and
                  `K x N` (K pools stepped in K threads: the async run's layout, the base
                  of the async/raw ratio);
  sync:           `train` with --actors inline (one pool of N envs, unroll then update);
  sync_pools:     `train` with --actors pools (K pools in K threads, same parameters, one
                  update on their concatenation per iteration);
  async:          `train` with --actors async (K actor threads, K pools of N envs, an update
                  per trajectory, dropped if more than max_policy_lag updates old);
  async_nolearn:  the same with a no-op update (the learner always keeps up): the ceiling
                  of the asynchronous machinery itself.
  *_xla:          the same loops with `--rollout compiled`: every unroll is one compiled loop
                  (envpool's XLA interface), so an actor thread holds the GIL only
                  between unrolls instead of at every step.

Training runs use no checkpoints, no evaluation and a logger that only records each
metrics line with its wall-clock and process CPU time (a line per iteration). Env steps per
second are measured between the first line past `warmup_fraction` of the budget and the
second-to-last line, which leaves out environment creation, compilation, the actors' start
and the run's one-off end work; env
steps count every step the actors took, dropped trajectories included ('env steps/s', which
/raw divides: the acting), and 'learned/s' those of the trajectories the learner trained on
(which /sync divides: an async run that drops a sixth of its trajectories learns from five
sixths of its steps). Medians of the
repeats are printed with the ratios, learner updates per second, steps per CPU-second of
the whole process (on a shared machine wall-clock ratios swing with the scheduler, CPU
cost does not), the fraction of dropped trajectories and the mean policy lag of those
used. The 'cores' column (CPU-seconds per second) and the load average in the header
show whether the process had the machine to itself: async gains come from running actors
and learner on different cores, so on a loaded machine they shrink. `--out PATH` also
writes PATH.txt (the printed report) and PATH.json (every repeat).

Networks: CartPole uses IMPALA's default MLP (64, 64). Pong uses the Atari preset's agent
(`experiments/impala.py --preset atari`) with the library's SMALL pixel torso by default
(`small_cnn`: 4x4 max pooling, two small convs, dense 128): a Nature CNN
update on a [21, 8] batch takes over a second on 2 CPU cores (the learner could never keep
up), and an MLP on the raw 4x84x84 frames costs the actors more per step than the small
CNN (`--pong-torso nature_cnn` / `mlp` for those).

`jax_cpu_enable_async_dispatch` is turned off at start, as `run_experiment` does on CPU.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import platform
import statistics
import threading
import time
from typing import Any
from typing import Literal
from typing import Optional

import jax
import numpy as np

from offpolicy_ac.agents import make_impala
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals
from offpolicy_ac.training.sources import task_spec

Mode = Literal[
    "sync", "sync_pools", "async", "async_nolearn", "sync_xla", "async_xla", "async_xla_nolearn"
]
RAW_NAMES = ("raw_1xN", "raw_1xKN", "raw_KxN")


@dataclasses.dataclass(frozen=True)
class Args:
  tasks: tuple[str, ...] = ("CartPole-v1", "Pong-v5")
  """envpool task ids (Atari ids, `envs.is_atari`, get Atari preprocessing)."""
  modes: tuple[Mode, ...] = (
      "sync",
      "sync_pools",
      "async",
      "async_nolearn",
      "sync_xla",
      "async_xla",
      "async_xla_nolearn",
  )
  """Training loops to time (raw envpool and the probe always run)."""
  actors: int = 2
  """K: actor threads of the async runs, pools of sync_pools, pools of raw K x N."""
  max_policy_lag: Optional[int] = 4
  """Async: drop trajectories more than this many updates old (None: keep all)."""
  actor_queue_size: int = 0
  """Async: trajectories waiting for the learner before actors block (0: K)."""
  cartpole_steps: int = 200_000
  """Env steps of each training run, non-Atari tasks."""
  pong_steps: int = 30_000
  """Env steps of each training run, Atari tasks."""
  cartpole_envs: int = 16
  """N: environments per pool, non-Atari tasks."""
  pong_envs: int = 8
  """N: environments per pool, Atari tasks."""
  cartpole_unroll: int = 16
  """T, non-Atari tasks."""
  pong_unroll: int = 20
  """T, Atari tasks."""
  pong_torso: str = "small_cnn"
  """Torso of the Atari agent: 'small_cnn', 'mlp' (on flattened frames), 'nature_cnn',
  'impala_resnet'."""
  pong_hidden_sizes: tuple[int, ...] = (32,)
  """MLP layer sizes of the Atari agent (with --pong-torso mlp)."""
  env_batch_size: int = 0
  """Batched stepping of the training runs' pools: each recv returns this many of their N
  environments, so the others step while the policy runs (0: all N, no batched stepping).
  Raw stepping is never batched."""
  warmup_fraction: float = 0.3
  """Leading fraction of each training run's env steps left out of its rate."""
  raw_seconds: float = 2.0
  """Duration of each raw envpool measurement."""
  probe_seconds: float = 1.0
  """At least this long (and 3 calls) for each of the probe's unroll and update timings."""
  repeats: int = 3
  """Rounds (medians are reported); the measurements of a round are interleaved."""
  seed: int = 0
  """Seed of agents and environments (the same in every repeat)."""
  out: Optional[str] = None
  """Also write OUT.txt and OUT.json (e.g. results/speed/async_cpu). Default: print only."""


# ---------------------------------------------------------------------------- set-up


@dataclasses.dataclass(frozen=True)
class Task:
  task: str
  atari: bool
  num_envs: int
  unroll_length: int
  total_env_steps: int
  loop: Any  # TrainConfig of the sync run
  agent: Any  # ImpalaConfig


def _task(task: str, args: Args, presets: dict) -> Task:
  from offpolicy_ac import envs

  atari = envs.is_atari(task)
  preset = presets["atari" if atari else "cartpole"]
  n = args.pong_envs if atari else args.cartpole_envs
  t = args.pong_unroll if atari else args.cartpole_unroll
  steps = args.pong_steps if atari else args.cartpole_steps
  loop = preset.train.replace(
      env_id=task,
      atari=atari,
      seed=args.seed,
      total_env_steps=steps,
      num_envs=n,
      unroll_length=t,
      log_every=n * t,
      eval_every=0,
      checkpoint_every=0,
      target_return=None,
      num_seeds=1,
  )
  agent = preset.agent
  if atari:  # the MLP's sizes apply to the mlp torso only (the agents refuse them otherwise)
    mlp = {"hidden_sizes": tuple(args.pong_hidden_sizes)} if args.pong_torso == "mlp" else {}
    agent = dataclasses.replace(agent, torso=args.pong_torso, **mlp)
  return Task(task, atari, n, t, steps, loop, agent)


def _loop_for(task: Task, mode: str, args: Args):
  k = args.actors
  loop = task.loop.replace(
      rollout="compiled" if "xla" in mode else "host", env_batch_size=args.env_batch_size
  )
  if mode in ("sync", "sync_xla"):
    return loop
  if mode == "sync_pools":
    return loop.replace(actors="pools", num_actors=k)
  return loop.replace(
      actors="async",
      num_actors=k,
      max_policy_lag=args.max_policy_lag,
      actor_queue_size=args.actor_queue_size,
  )


class _Agents:
  """One agent per (task, no-op learner): its jitted functions stay compiled across runs."""

  def __init__(self):
    self._cache: dict = {}

  def get(self, task: Task, spec: Any, nolearn: bool = False):
    key = (task.task, task.agent, nolearn)
    if key not in self._cache:
      agent = make_impala(spec, task.agent)
      if nolearn:

        @jax.jit
        def noop_update(state, traj):
          del traj
          return state._replace(num_updates=state.num_updates + 1), {}

        agent = agent._replace(update=noop_update)
      self._cache[key] = agent
    return self._cache[key]


# ---------------------------------------------------------------------------- raw envpool


def raw_rate(task: Task, pools: int, envs_per_pool: int, seconds: float, seed: int) -> dict:
  """Env steps/s of `pools` envpool pools of `envs_per_pool` envs (built as the loop builds
  them), each stepped in its own thread with envpool's gymnasium `step` and pre-drawn
  random actions."""
  from offpolicy_ac.envs import random_actions  # the raw baseline of bench_envs.py too
  from offpolicy_ac.training.sources import make_env

  envs_ = [make_env(task.loop, envs_per_pool, seed + 1009 * i) for i in range(pools)]
  try:
    counts = [0] * pools
    stop = threading.Event()
    start = threading.Barrier(pools + 1)
    errors: list = []

    def run(i: int) -> None:
      try:
        pool = envs_[i].pool
        actions = random_actions(
            envs_[i].spec, (1024, envs_per_pool), np.random.default_rng(seed + i)
        )
        pool.reset()
        for j in range(20):  # warm up
          pool.step(actions[j])
        start.wait()
        j = 0
        while not stop.is_set():
          pool.step(actions[j % 1024])
          j += 1
          counts[i] = j
      except BaseException as e:  # pylint: disable=broad-except
        errors.append(e)
        start.abort()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(pools)]
    for th in threads:
      th.start()
    try:
      start.wait()
    except threading.BrokenBarrierError:  # a thread failed before the start
      for th in threads:
        th.join()
      raise errors[0] if errors else RuntimeError("raw stepping failed to start")
    t0, c0 = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    steps = sum(counts) * envs_per_pool
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    for th in threads:
      th.join()
    if errors:
      raise errors[0]
  finally:
    for env in envs_:
      env.close()
  return {
      "env_steps_per_s": steps / wall,
      "steps_per_cpu_s": steps / max(cpu, 1e-9),
      "num_envs": pools * envs_per_pool,
  }


# ---------------------------------------------------------------------------- probe


def _time_calls(fn, seconds: float, min_calls: int = 3) -> float:
  """Mean seconds per call of fn() over >= min_calls calls and >= `seconds`."""
  calls, start = 0, time.perf_counter()
  while True:
    fn()
    calls += 1
    elapsed = time.perf_counter() - start
    if calls >= min_calls and elapsed >= seconds:
      return elapsed / calls


def probe(task: Task, agents: _Agents, args: Args, modes) -> dict:
  """One actor's unroll and one learner update, each timed alone (and compiled first, so
  the training runs find the update compiled)."""
  from offpolicy_ac import envs
  from offpolicy_ac.training.sources import make_env

  env = make_env(task.loop, task.num_envs, args.seed)
  try:
    agent = agents.get(task, env.spec._replace(batch_size=task.num_envs))
    state = agent.init(jax.random.PRNGKey(args.seed))
    rollout = envs.make_rollout(env, agent.act, task.unroll_length, to_device=False)
    box = {"rs": rollout.init(state.params, jax.random.PRNGKey(args.seed + 1))}

    def unroll():
      box["rs"], box["traj"], _ = rollout.unroll(state.params, box["rs"])

    unroll()  # compiles act
    unroll_s = _time_calls(unroll, args.probe_seconds)
    traj = box["traj"]

    def update(batch):
      def call():
        _, metrics = agent.update(state, jax.device_put(batch))
        jax.device_get(metrics)

      return call

    update(traj)()  # compiles
    update_s = _time_calls(update(traj), args.probe_seconds)
    if "sync_pools" in modes and args.actors > 1:  # compile the K-pool batch shape too
      wide = jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *[traj] * args.actors)
      update(wide)()
    if "async_nolearn" in modes:
      jax.block_until_ready(agents.get(task, agent.spec, nolearn=True).update(state, traj))
  finally:
    env.close()
  k = args.actors
  return {
      "unroll_s": unroll_s,
      "update_s": update_s,
      "actor_traj_per_s": 1.0 / unroll_s,
      "learner_traj_per_s": 1.0 / update_s,
      "learner_keeps_up": bool(update_s <= unroll_s / k),
  }


# ---------------------------------------------------------------------------- training runs


class _Recorder:
  """Stands in for RunLogger (train only calls `log`): keeps each metrics line with the
  wall-clock and process CPU time at which it came."""

  def __init__(self):
    self.lines: list[tuple[float, float, dict]] = []

  def log(self, record: dict) -> None:
    self.lines.append((time.perf_counter(), time.process_time(), dict(record)))

  def truncate(self, num_lines: int) -> None:  # only on resume, which the bench never does
    del self.lines[num_lines:]


def train_rate(task: Task, mode: str, agents: _Agents, args: Args) -> dict:
  """Runs `train` for one mode; env steps/s etc. over the steady part of the run."""
  from offpolicy_ac.training import train

  config = _loop_for(task, mode, args)
  nolearn = mode.endswith("nolearn")
  recorder = _Recorder()
  t0 = time.perf_counter()
  [result] = train(lambda spec: agents.get(task, spec, nolearn), config, [recorder])
  total_wall = time.perf_counter() - t0
  lines = recorder.lines
  if len(lines) < 3:
    raise RuntimeError(
        f"{task.task} {mode}: only {len(lines)} metrics line(s); raise the " "step budget"
    )
  # The window ends at the second-to-last line: the last iteration does the run's one-off
  # end work (about 0.6 s of small compiles on a CPU, the first run of a layout).
  last = len(lines) - 2
  warm = args.warmup_fraction * task.total_env_steps
  first = next((i for i, (_, _, r) in enumerate(lines) if r["env_steps"] >= warm), 0)
  warmup_included = first >= last
  if warmup_included:  # too few lines past the warm-up: use the whole run
    first = 0
  (ta, ca, ra), (tb, cb, rb) = lines[first], lines[last]
  window = [r for _, _, r in lines[first + 1 : last + 1]]
  steps, dt = rb["env_steps"] - ra["env_steps"], tb - ta
  out = {
      "env_steps_per_s": steps / dt,
      "updates_per_s": (rb["num_updates"] - ra["num_updates"]) / dt,
      "steps_per_cpu_s": steps / max(cb - ca, 1e-9),
      "window_env_steps": steps,
      "window_s": dt,
      "run_wall_s": total_wall,
      "env_steps": result.env_steps,
      "num_updates": result.num_updates,
      "warmup_included": warmup_included,
  }
  if config.uses_actor_threads:
    per_traj = task.num_envs * task.unroll_length
    dropped = sum(r.get("dropped_trajectories", 0) for r in window)
    out["dropped_fraction"] = dropped / max(steps / per_traj, 1)
    # env steps of the trajectories the learner used (dropped ones are counted above)
    out["used_env_steps_per_s"] = out["env_steps_per_s"] * (1 - out["dropped_fraction"])
    lags = [r["policy_lag"] for r in window if "policy_lag" in r]
    out["policy_lag"] = float(np.mean(lags)) if lags else None
  return out


# ---------------------------------------------------------------------------- report


def _median(xs):
  xs = [x for x in xs if x is not None]
  return float(statistics.median(xs)) if xs else None


def _fmt(x, spec: str, width: int) -> str:
  return f"{'-':>{width}}" if x is None else f"{x:>{width}{spec}}"


def _report(task: Task, runs: dict, probes: list, args: Args) -> tuple[str, dict]:
  k, n = args.actors, task.num_envs
  med = {
      name: {
          key: (
              any(r[key] for r in rs)
              if isinstance(rs[0][key], bool)
              else _median([r.get(key) for r in rs])
          )
          for key in rs[0]
      }
      for name, rs in runs.items()
  }
  sps = {name: m["env_steps_per_s"] for name, m in med.items()}
  # The env steps the learner trained on (an async run drops trajectories more than
  # max_policy_lag updates old): what /sync and its goal compare; /raw compares acting.
  learned = {name: m.get("used_env_steps_per_s", m["env_steps_per_s"]) for name, m in med.items()}
  base_raw = sps["raw_KxN"]

  def sync_of(name: str) -> str:
    """The sync run of `name`'s rollout (a jitted rollout's: sync_xla) its /sync divides by."""
    return "sync_xla" if "xla" in name else "sync"

  labels = {
      "raw_1xN": f"raw 1 pool x {n}",
      "raw_1xKN": f"raw 1 pool x {k * n}",
      "raw_KxN": f"raw {k} pools x {n}, {k} threads *",
      "sync": f"sync (1 pool x {n})",
      "sync_pools": f"sync, {k} pools x {n}",
      "async": f"async, {k} actors x {n}",
      "async_nolearn": f"async, {k} actors, no-op learner",
      "sync_xla": f"sync, jitted rollout (1 pool x {n})",
      "async_xla": f"async, jitted rollout, {k} actors x {n}",
      "async_xla_nolearn": "async, jitted rollout, no-op learner",
  }
  torso = (
      task.agent.torso if task.agent.torso != "auto" else ("nature_cnn" if task.atari else "mlp")
  )
  net = f"{torso} {tuple(task.agent.hidden_sizes)}" if torso == "mlp" else torso
  lines = [
      f"{task.task}: N={n} envs per pool, K={k}, T={task.unroll_length}, network {net}, "
      f"{task.total_env_steps:,} env steps per run (first {args.warmup_fraction:.0%} left "
      f"out), max_policy_lag={args.max_policy_lag}, medians of {args.repeats}",
      f"{'mode':<36}{'envs':>5}{'env steps/s':>13}{'learned/s':>11}{'/sync':>7}{'/raw*':>7}"
      f"{'updates/s':>11}{'steps/CPU-s':>13}{'cores':>7}{'dropped':>9}{'lag':>6}",
  ]
  ratios: dict = {}
  for name in (
      *RAW_NAMES,
      "sync",
      "sync_pools",
      "async",
      "async_nolearn",
      "sync_xla",
      "async_xla",
      "async_xla_nolearn",
  ):
    if name not in med:
      continue
    m = med[name]
    envs_ = m.get("num_envs") or (n if name in ("sync", "sync_xla") else k * n)
    raw = name in RAW_NAMES
    sync = learned.get(sync_of(name))
    r_sync = learned[name] / sync if sync and not raw else None
    r_raw = sps[name] / base_raw
    ratios[name] = {
        "vs_sync": r_sync,
        "vs_raw_KxN": r_raw,
        "vs_raw_1xKN": sps[name] / sps["raw_1xKN"],
    }
    lines.append(
        f"{labels[name]:<36}{int(envs_):>5}{sps[name]:>13,.0f}"
        f"{_fmt(None if raw else learned[name], ',.0f', 11)}{_fmt(r_sync, '.2f', 7)}"
        f"{r_raw:>7.2f}{_fmt(m.get('updates_per_s'), ',.1f', 11)}"
        f"{m['steps_per_cpu_s']:>13,.0f}{sps[name] / m['steps_per_cpu_s']:>7.2f}"
        f"{_fmt(m.get('dropped_fraction'), '.1%', 9)}"
        f"{_fmt(m.get('policy_lag'), '.2f', 6)}"
    )
  lines.append(
      "* the /raw base: K pools of N envs stepped in K threads, the async run's "
      f"layout (async / raw 1 pool x {k * n}: "
      + (f"{sps['async'] / sps['raw_1xKN']:.2f})" if "async" in sps else "n/a)")
  )
  p = {key: _median([x[key] for x in probes]) for key in ("unroll_s", "update_s")}
  keeps_up = p["update_s"] <= p["unroll_s"] / k
  lines.append(
      f"bottleneck (timed alone): an actor unrolls [T+1={task.unroll_length + 1}, {n}] in "
      f"{p['unroll_s'] * 1e3:.1f} ms ({k} actors: {k / p['unroll_s']:.1f} traj/s), the "
      f"learner updates on one in {p['update_s'] * 1e3:.1f} ms ({1 / p['update_s']:.1f} "
      f"traj/s): "
      + (
          "the learner keeps up"
          if keeps_up
          else f"LEARNER-BOUND (needs <= {p['unroll_s'] / k * 1e3:.1f} ms)"
      )
      + f"; {os.cpu_count()} CPU cores for {k} actors + their pools + the learner"
  )
  if "async" in med:
    busy = med["async"]["updates_per_s"] * p["update_s"]
    lines.append(
        f"in the async run the learner updated {med['async']['updates_per_s']:.1f} "
        f"times/s: busy about {busy:.0%} of the time (at the update time timed "
        f"alone); env steps/s of the trajectories it used (not dropped): "
        f"{med['async']['used_env_steps_per_s']:,.0f}"
    )
  lines.append("'cores': CPU-seconds per second of the whole process (all threads)")
  lines.append(
      "'learned/s': env steps/s of the trajectories the learner trained on (not "
      "dropped); /sync divides it by the sync run's of the same rollout (host loop or "
      "jitted), /raw the env steps/s the actors took"
  )
  for name in ("async", "async_xla"):
    if name in med and sync_of(name) in med:
      r = learned[name] / learned[sync_of(name)]
      lines.append(f"goal {name} >= 1.5 x {sync_of(name)} (learned env steps/s): {r:.2f} -> "
                   f"{'met' if r >= 1.5 else 'NOT met'}")  # fmt: skip
  if task.atari:
    for name in ("async", "async_nolearn", "async_xla", "async_xla_nolearn"):
      if name in sps:
        r = sps[name] / base_raw
        lines.append(
            f"goal {name} >= 0.8 x raw ({k} pools x {n}): {r:.2f} -> "
            f"{'met' if r >= 0.8 else 'NOT met'}"
            + (
                ""
                if name.endswith("nolearn") or keeps_up
                else " (the learner does not keep up here: see bottleneck)"
            )
        )
  summary = {
      "config": {
          "num_envs": n,
          "actors": k,
          "env_batch_size": args.env_batch_size,
          "unroll_length": task.unroll_length,
          "total_env_steps": task.total_env_steps,
          "network": net,
          "train": dataclasses.asdict(task.loop),
          "agent": dataclasses.asdict(task.agent),
      },
      "medians": med,
      "ratios": ratios,
      "probe": {**p, "learner_keeps_up": keeps_up, "repeats": probes},
      "repeats": runs,
  }
  return "\n".join(lines), summary


# ---------------------------------------------------------------------------- main


def check(args: Args, presets: dict) -> Optional[pathlib.Path]:
  """Refuses (ValueError) bad arguments, and a training run's config (each task's, in each
  mode) that `train` would refuse, before anything is timed; returns the --out base."""
  if args.actors < 1 or args.repeats < 1:
    raise ValueError("--actors and --repeats must be >= 1")
  if not 0 <= args.warmup_fraction < 1:
    raise ValueError("--warmup-fraction must lie in [0, 1)")
  for name in ("raw_seconds", "probe_seconds"):
    if not (math.isfinite(getattr(args, name)) and getattr(args, name) > 0):
      raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
  for name in args.tasks:
    task = _task(name, args, presets)
    for mode in args.modes:
      config = _loop_for(task, mode, args)
      if mode == args.modes[0]:
        try:  # the agent, built for the task (--pong-torso, --pong-hidden-sizes)
          make_impala(task_spec(config), task.agent)
        except ValueError as e:
          raise ValueError(f"{name}: {e}") from None
      try:
        config.validate()
      except ValueError as e:
        raise ValueError(f"{name}, {mode}: {e}") from None
      if task.total_env_steps <= 2 * config.steps_per_iteration:  # a line per iteration
        raise ValueError(
            f"{name}, {mode}: {task.total_env_steps:,} env steps are not 3 iterations of "
            f"{config.steps_per_iteration:,}, the 3 metrics lines a rate needs: raise "
            f"--{'pong' if task.atari else 'cartpole'}-steps"
        )
  if not args.out:
    return None
  base = pathlib.Path(args.out).expanduser()
  base = base.with_suffix("") if base.suffix in (".txt", ".json") else base
  for suffix in (".txt", ".json"):
    check_output_file("--out", base.with_suffix(suffix))
  return base


def main(args: Args) -> dict:
  # A process-wide setting, read when JAX's CPU client starts: set it before any JAX work
  # (run_experiment does the same on CPU).
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  import envpool

  from offpolicy_ac.presets import impala

  presets = impala.PRESETS
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any work
    base = check(args, presets)
  header = (
      f"jax {jax.__version__}, envpool {envpool.__version__}, {jax.devices()}, "
      f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}, "
      f"cpu_async_dispatch=False, load average at start "
      f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
  )
  print(header, flush=True)
  agents = _Agents()
  texts, results = [header], {}
  for name in args.tasks:
    task = _task(name, args, presets)
    runs: dict = {}
    probes: list = []
    k, n = args.actors, task.num_envs
    for rep in range(args.repeats):  # interleaved: drift hits every mode alike
      probes.append(probe(task, agents, args, args.modes))
      for raw_name, (pools, per) in zip(RAW_NAMES, ((1, n), (1, k * n), (k, n))):
        runs.setdefault(raw_name, []).append(
            raw_rate(task, pools, per, args.raw_seconds, args.seed)
        )
      for mode in args.modes:
        runs.setdefault(mode, []).append(train_rate(task, mode, agents, args))
      done = ", ".join(f"{m} {rs[-1]['env_steps_per_s']:,.0f}" for m, rs in runs.items())
      print(f"[{name} repeat {rep + 1}/{args.repeats}] env steps/s: {done}", flush=True)
    text, summary = _report(task, runs, probes, args)
    print(text, flush=True)
    texts.append(text)
    results[name] = summary
  out = {"args": dataclasses.asdict(args), "header": header, "tasks": results}
  if base is not None:
    base.parent.mkdir(parents=True, exist_ok=True)
    base.with_suffix(".txt").write_text("\n\n".join(texts) + "\n")
    base.with_suffix(".json").write_text(json.dumps(out, indent=1))
    print(f"wrote {base.with_suffix('.txt')} and {base.with_suffix('.json')}", flush=True)
  return out


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
