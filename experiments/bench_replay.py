"""Benchmark: a replay step (add one unroll, sample the preset's mini-batch) jitted with the buffer
donated against copied, side by side in one process, on Atari- and MinAtar-sized
buffers. Prints the median milliseconds per step and the ratio.

    python experiments/bench_replay.py --repeats 10
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import jax
import jax.numpy as jnp

from offpolicy_ac import replay as replay_lib
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals

# (name, capacity, unroll T, columns B, windows sampled, observation shape and dtype as the
# environment gives them and the buffer stores them): the scripts' presets.
CASES = (
    ("atari (acer preset)", 2_500, 20, 16, 16, (4, 84, 84), jnp.uint8),
    ("minatar (sql preset)", 12_500, 8, 64, 32, (4, 10, 10), jnp.float32),
)


@dataclasses.dataclass(frozen=True)
class Args:
  repeats: int = 10
  """Timed steps per variant (after one compiling step)."""


def _time_steps(step, state, traj, key, repeats):
  state, batch = step(state, traj, key)  # compiles
  jax.block_until_ready(batch)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    state, batch = step(state, traj, key)
    jax.block_until_ready((state, batch))
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def main(args: Args) -> list[dict]:
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any work
    if args.repeats < 1:
      raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
  rows = []
  for name, capacity, unroll, columns, windows, shape, dtype in CASES:
    replay = replay_lib.make_sequence_replay(
        capacity=capacity,
        sequence_length=unroll + 1,
        sample_length=unroll + 1,
        batch_size=windows,
    )
    traj = {"observation": jnp.ones((unroll + 1, columns) + shape, dtype)}

    def step(state, traj, key):
      state = replay.add(state, traj)  # pylint: disable=cell-var-from-loop
      return state, replay.sample(state, key)  # pylint: disable=cell-var-from-loop

    key = jax.random.PRNGKey(0)
    ms = {}
    for variant, jitted in (("copied", jax.jit(step)),
                            ("donated", jax.jit(step, donate_argnums=0))):  # fmt: skip
      ms[variant] = _time_steps(jitted, replay.init(traj), traj, key, args.repeats)
    size_gb = capacity * (unroll + 1) * math.prod(shape) * jnp.dtype(dtype).itemsize / 1e9
    rows.append(dict(case=name, buffer_gb=size_gb, **ms, ratio=ms["copied"] / ms["donated"]))
    print(f"{name:22s} buffer {size_gb:5.2f} GB | copied {ms['copied']:8.1f} ms | "
          f"donated {ms['donated']:6.1f} ms | copied/donated {rows[-1]['ratio']:6.1f}x")  # fmt: skip
  return rows


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
