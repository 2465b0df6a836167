"""Smoke test of experiments/bench_conv.py (a benchmark script, not a timed test)."""

import flax.linen as nn
import jax
import numpy as np
from scripts import load_script

from offpolicy_ac import networks


def test_bench_conv_times_every_case_in_both_layouts():
  bench = load_script("bench_conv")
  args = bench.Args(torso="small_cnn", frames=4, acting_envs=2, loop_length=2, repeats=1,
                    rounds=1)  # fmt: skip
  ms = bench.main(args)
  assert set(ms) == set(bench.LAYOUTS) == {"library", "patch"}
  for layout in ms.values():
    assert set(layout) == set(bench.CASES) and all(t > 0 for t in layout.values())


def test_the_layouts_compute_the_same_values():
  """What the benchmark compares differs in time only: each case gives the same features
  and parameters with flax's convolution and with the patch product."""
  from unittest import mock

  from offpolicy_ac.networks import torsos

  bench = load_script("bench_conv")
  args = bench.Args(torso="nature_cnn", frames=3, acting_envs=2, loop_length=2)
  torso = networks.make_torso(args.torso, (4, 84, 84))
  out = {}
  with jax.default_matmul_precision("highest"):
    for layout, conv in bench.LAYOUTS.items():
      with mock.patch.object(torsos, "_Conv", conv):
        calls = bench.case_calls(torso, args)
        out[layout] = {case: fn(*fn_args) for case, (fn, fn_args, _) in calls.items()}
  assert bench.LAYOUTS["library"] is nn.Conv
  for case in bench.CASES:
    for a, b in zip(jax.tree.leaves(out["patch"][case]), jax.tree.leaves(out["library"][case])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
