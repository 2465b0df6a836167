"""Rollout throughput against raw envpool stepping (same process, same number of envs).

    python experiments/bench_envs.py              # CartPole and Pong, sync and batched
    python experiments/bench_envs.py --tasks CartPole-v1 --cartpole-envs 64 --repeats 7

For each task and mode ("sync": batch_size = num_envs; "batched": batched stepping,
batch_size = num_envs // 2) it times, alternately, `repeats` runs of
  raw:     envpool gymnasium `step` (sync) or `recv`/`send` (batched) with pre-drawn random
           actions, no other work;
  rollout: `make_rollout(env, act, T).unroll` (the host backend) with a trivial jitted
           policy (uniform categorical or Gaussian sample plus its logits / mean as extras)
           on a fresh environment of the same size;
  xla:     `make_rollout(env, act, T, backend="compiled").unroll` with the same policy
           (both modes; tasks whose actions are int32 or float32),
and prints the median steps/s of each, their ratios to raw, and steps per CPU-second of
the process (all threads): on a shared, loaded machine wall-clock ratios swing with the
scheduler, CPU-time ratios show what each loop costs. Steps are environment steps: one per
environment per `recv`. Results are summarised in docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import envs
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals


@dataclasses.dataclass(frozen=True)
class Args:
  tasks: tuple[str, ...] = ("CartPole-v1", "Pong-v5")
  """envpool task ids to benchmark."""
  modes: tuple[Literal["sync", "batched"], ...] = ("sync", "batched")
  """"sync" (batch_size = num_envs) and/or "batched" (batched stepping, batch_size =
    num_envs // 2)."""
  cartpole_envs: int = 32
  """Number of environments for non-Atari tasks."""
  atari_envs: int = 8
  """Number of environments for Atari tasks."""
  num_threads: int = 0
  """envpool worker threads (0: envpool's default)."""
  unroll_length: int = 32
  """T of each unroll."""
  cartpole_seconds: float = 1.0
  """Approximate duration of one timed repeat, non-Atari."""
  atari_seconds: float = 2.0
  """Approximate duration of one timed repeat, Atari."""
  repeats: int = 5
  """Timed repeats per method (medians are reported)."""
  seed: int = 0
  """Seed of environments and policy."""
  xla: bool = True
  """Also time the compiled backend of `make_rollout` (tasks with int32/float32 actions)."""
  cpu_async_dispatch: bool = False
  """JAX's `jax_cpu_enable_async_dispatch`. Off runs each tiny policy call inline on the
    calling thread instead of handing it to a worker thread, which is several times faster
    for per-step actor calls on a small CPU; on is JAX's default."""


def _make(task: str, num_envs: int, batch_size: int, args: Args) -> envs.EnvPoolEnv:
  kwargs = dict(batch_size=batch_size, num_threads=args.num_threads)
  if envs.is_atari(task):
    return envs.make_atari(task, num_envs, args.seed, train=True, **kwargs)
  return envs.make(task, num_envs, args.seed, **kwargs)


def _trivial_act(spec: envs.EnvSpec):
  if spec.is_discrete:

    def act(params, obs, key):
      logits = jnp.zeros((obs.shape[0], spec.num_actions), jnp.float32)
      action = jax.random.categorical(key, logits).astype(jnp.int32)
      return action, {"logits": logits}

  else:
    low = jnp.asarray(spec.action_low, jnp.float32).reshape(spec.action_shape)
    high = jnp.asarray(spec.action_high, jnp.float32).reshape(spec.action_shape)

    def act(params, obs, key):
      mean = jnp.zeros((obs.shape[0], *spec.action_shape), jnp.float32)
      action = mean + (high - low) / 4 * jax.random.normal(key, mean.shape)
      return action, {"mean": mean}

  return act


def _timed(run_chunk, steps_per_chunk: int):
  """A timer: `timer(seconds)` runs chunks until `seconds` passed and returns
  (steps per wall-clock second, steps per CPU second of this process, all threads)."""

  def timer(seconds: float) -> tuple[float, float]:
    chunks, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while True:
      run_chunk()
      chunks += 1
      elapsed = time.perf_counter() - start
      if elapsed >= seconds:
        cpu = time.process_time() - cpu_start
        return chunks * steps_per_chunk / elapsed, chunks * steps_per_chunk / cpu

  return timer


def raw_timer(task: str, num_envs: int, batch_size: int, args: Args):
  """Raw envpool: the gymnasium API with pre-drawn random actions, nothing else."""
  env = _make(task, num_envs, batch_size, args)
  pool = env.pool
  actions = envs.random_actions(env.spec, (1024, batch_size), np.random.default_rng(args.seed))
  counter = [0]
  if batch_size == num_envs:
    pool.reset()

    def chunk():
      for _ in range(100):
        pool.step(actions[counter[0] % 1024])
        counter[0] += 1

  else:
    pool.async_reset()

    def chunk():
      for _ in range(100):
        info = pool.recv()[-1]
        pool.send(actions[counter[0] % 1024], info["env_id"])
        counter[0] += 1

  chunk()  # warm up
  return _timed(chunk, 100 * batch_size)


def rollout_timer(task: str, num_envs: int, batch_size: int, args: Args, xla: bool = False):
  """`make_rollout` (the compiled backend with `xla`) with a trivial jitted policy: steps/s
  of unroll. None if the compiled backend cannot step the task (float64 actions)."""
  env = _make(task, num_envs, batch_size, args)
  params = jnp.zeros(())
  key = jax.random.PRNGKey(args.seed)
  backend = "compiled" if xla else "host"
  try:
    rollout = envs.make_rollout(env, _trivial_act(env.spec), args.unroll_length, backend=backend)
  except ValueError:
    if not xla:
      raise
    env.close()
    return None
  state = [rollout.init(params, key)]

  def chunk():
    state[0], traj, _ = rollout.unroll(params, state[0])
    jax.block_until_ready(traj)

  for _ in range(3):  # compile and warm up
    chunk()
  return _timed(chunk, args.unroll_length * num_envs)


def check(args: Args) -> None:
  """Refuses (ValueError) bad arguments and unknown tasks before anything is timed."""
  if not args.tasks or not args.modes:
    raise ValueError("--tasks and --modes need at least one value each")
  for name, low in (("cartpole_envs", 1), ("atari_envs", 1), ("unroll_length", 1),
                    ("repeats", 1), ("num_threads", 0), ("seed", 0)):  # fmt: skip
    if getattr(args, name) < low:
      raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
  for name in ("cartpole_seconds", "atari_seconds"):
    if not (math.isfinite(getattr(args, name)) and getattr(args, name) > 0):
      raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
  if "batched" in args.modes:
    used = {"atari_envs" if envs.is_atari(task) else "cartpole_envs" for task in args.tasks}
    for name in sorted(used):
      if getattr(args, name) < 2:
        raise ValueError(f"--{name.replace('_', '-')} {getattr(args, name)}: batched stepping "
                         "steps half of the environments at a time, so it needs 2 or more "
                         "(with 1 it is the sync mode); or --modes sync")  # fmt: skip
  for task in args.tasks:
    envs.spec(task)  # an unknown task id, naming the closest ones


def main(args: Args) -> None:
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any work
    check(args)
  # A process-wide setting, read when JAX's CPU client starts: set it before any JAX work.
  jax.config.update("jax_cpu_enable_async_dispatch", args.cpu_async_dispatch)
  print(
      f"jax {jax.__version__}, devices {jax.devices()}, T={args.unroll_length}, "
      f"cpu_async_dispatch={args.cpu_async_dispatch}"
  )
  print(
      f"{'task':<14}{'mode':<7}{'envs':>5}{'batch':>6}{'raw steps/s':>14}{'rollout':>12}"
      f"{'ratio':>7}{'xla rollout':>13}{'ratio':>7}   per CPU-second: raw, rollout, xla"
  )
  for task in args.tasks:
    atari = envs.is_atari(task)
    num_envs = args.atari_envs if atari else args.cartpole_envs
    seconds = args.atari_seconds if atari else args.cartpole_seconds
    for mode in args.modes:
      batch = num_envs if mode == "sync" else num_envs // 2
      timers = {
          "raw": raw_timer(task, num_envs, batch, args),
          "rollout": rollout_timer(task, num_envs, batch, args),
      }
      xla_timer = rollout_timer(task, num_envs, batch, args, xla=True) if args.xla else None
      use_xla = xla_timer is not None
      if use_xla:
        timers["xla"] = xla_timer
      results: dict[str, list[tuple[float, float]]] = {name: [] for name in timers}
      for _ in range(args.repeats):  # interleaved so drift hits all alike
        for name, timer in timers.items():
          results[name].append(timer(seconds))
      wall = {k: statistics.median(x[0] for x in v) for k, v in results.items()}
      cpu = {k: statistics.median(x[1] for x in v) for k, v in results.items()}
      r, o = wall["raw"], wall["rollout"]
      line = f"{task:<14}{mode:<7}{num_envs:>5}{batch:>6}{r:>14,.0f}{o:>12,.0f}{o / r:>7.2f}"
      line += f"{wall['xla']:>13,.0f}{wall['xla'] / r:>7.2f}" if use_xla else " " * 20
      line += "   " + ", ".join(f"{v:,.0f}" for v in cpu.values())
      print(line, flush=True)


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
