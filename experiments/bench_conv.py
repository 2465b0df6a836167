"""Benchmark: a pixel torso with flax's library convolution or as products over patches.

On XLA:CPU the torsos compute their convolutions as products over patches
(`networks.patch_conv`): XLA:CPU runs the library convolution's derivatives far slower
inside a loop (a learner's replayed updates in `lax.scan`, a compiled training program).
This times, in one process, the torso (`--torso`) built both ways:

* act     -- the features of `--acting-envs` frames (an actor's step),
* update  -- a gradient step on `--frames` frames (a learner batch: 32 windows x 5 steps),
* in loop -- the same step inside a `lax.scan` of `--loop-length` steps, per step.

Prints each case's median milliseconds (the median of `rounds` interleaved rounds of
`repeats` calls) and the library's time over the patch product's. The values are the same
up to the order of the sums (tests/networks/test_patch_conv.py); only the time differs.
Other backends use the library convolution both ways. This machine is noisy: compare the
ratios.

    python experiments/bench_conv.py
    python experiments/bench_conv.py --torso small_cnn --frames 640
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp

from offpolicy_ac import networks
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.networks import torsos
from offpolicy_ac.training import refusals

CASES = ("act", "update", "in loop")
TORSOS = ("nature_cnn", "small_cnn", "impala_resnet")
LAYOUTS = {"library": nn.Conv, "patch": torsos._Conv}


@dataclasses.dataclass(frozen=True)
class Args:
  torso: str = "nature_cnn"
  """The pixel torso (one of TORSOS), on 4 stacked 84 x 84 frames."""
  frames: int = 160
  """Frames per gradient step."""
  acting_envs: int = 16
  """Frames per acting call."""
  loop_length: int = 2
  """Gradient steps in the `lax.scan` of the in-loop case."""
  repeats: int = 5
  """Timed calls per case and round (after one untimed call)."""
  rounds: int = 3
  """Rounds over the layouts, interleaved; the report is the median of the rounds'."""


def _median_ms(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # compiles
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def case_calls(torso: nn.Module, args: Args) -> dict[str, tuple]:
  """Each case in `CASES` as (jitted function, its arguments, steps per call), traced with
  the convolution in place when called."""
  frames = jax.random.randint(jax.random.PRNGKey(0), (args.frames, 4, 84, 84), 0, 256)
  frames = frames.astype(jnp.uint8)
  params = torso.init(jax.random.PRNGKey(1), frames[:1])

  def step(p, frames):
    grads = jax.grad(lambda p: jnp.mean(torso.apply(p, frames) ** 2))(p)
    return jax.tree.map(lambda v, g: v - 1e-3 * g, p, grads)

  def loop(p, frames):
    return jax.lax.scan(lambda p, _: (step(p, frames), None), p, None,
                        length=args.loop_length)[0]  # fmt: skip

  return {
      "act": (jax.jit(lambda p, x: torso.apply(p, x)), (params, frames[: args.acting_envs]), 1),
      "update": (jax.jit(step), (params, frames), 1),
      "in loop": (jax.jit(loop), (params, frames), args.loop_length),
  }


def main(args: Args) -> dict[str, dict[str, float]]:
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any work
    for name in ("frames", "acting_envs", "loop_length", "repeats", "rounds"):
      if getattr(args, name) < 1:
        raise ValueError(f"{name} must be at least 1, got {getattr(args, name)}")
    if args.torso not in TORSOS:
      raise ValueError(f"--torso must be one of {', '.join(TORSOS)}, got {args.torso!r}")
    if args.acting_envs > args.frames:
      raise ValueError(f"acting_envs ({args.acting_envs}) must be at most frames "
                       f"({args.frames})")  # fmt: skip
  if jax.default_backend() != "cpu":
    print(f"on {jax.default_backend()} both layouts are the library convolution")
  torso = networks.make_torso(args.torso, (4, 84, 84))
  calls = {}
  for layout, conv in LAYOUTS.items():
    with mock.patch.object(torsos, "_Conv", conv):
      calls[layout] = case_calls(torso, args)
      for fn, fn_args, _ in calls[layout].values():  # traced and compiled with this layout
        jax.block_until_ready(fn(*fn_args))
  times = {layout: {case: [] for case in CASES} for layout in LAYOUTS}
  for _ in range(args.rounds):  # interleaved: a slow spell of the machine hits both layouts
    for layout in LAYOUTS:
      for case, (fn, fn_args, steps) in calls[layout].items():
        times[layout][case].append(_median_ms(fn, *fn_args, repeats=args.repeats) / steps)
  ms = {layout: {case: statistics.median(t) for case, t in cases.items()}
        for layout, cases in times.items()}  # fmt: skip
  print(f"{args.torso}, ms per call (act: {args.acting_envs} frames; update and in loop: "
        f"{args.frames} frames, per step)")  # fmt: skip
  for case in CASES:
    library, patch = ms["library"][case], ms["patch"][case]
    print(f"  {case:8s} library {library:9.2f} | patch {patch:9.2f} | library / patch "
          f"{library / patch:6.2f}x", flush=True)  # fmt: skip
  return ms


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
