"""The compiled rollout (envpool's XLA interface) trains exactly the host loop's run for the
agents that replay their data, with observation normalisation and clipped continuous
actions: the same replay rows, statistics, losses, episodes and final parameters.

`test_runs.py` checks this for IMPALA (on-policy, no normalisation) through a stop and a
resume; here the data goes through the replay, the running statistics and a checkpoint's
cut of the unroll, where a backend could differ without IMPALA's run showing it.
"""

import dataclasses
import json

import pytest

from offpolicy_ac import presets
from offpolicy_ac.training import read_metrics

WALL_CLOCK = ("wall_time_s", "env_steps_per_s")


def _run(script, preset, run_dir, rollout, **train):
  module = getattr(presets, script)
  args = module.PRESETS[preset]
  args = dataclasses.replace(
      args, run_dir=str(run_dir), train=args.train.replace(rollout=rollout, **train)
  )
  module.run(args)
  config = json.loads((run_dir / "config.json").read_text())
  assert config["config"]["train"]["env"]["rollout"] == rollout
  lines = [{k: v for k, v in l.items() if k not in WALL_CLOCK} for l in read_metrics(run_dir)]
  return lines, (run_dir / "final_params.msgpack").read_bytes()


@pytest.mark.parametrize(
    "script, preset, train",
    [
        # Discrete soft Q-learning on CartPole, its observations normalised; short episodes so
        # that terminations, truncations and auto-resets all fall inside the unrolls.
        ("sql", "cartpole", dict(normalize_observations=True, max_episode_steps=40)),
        # Continuous ACER on Pendulum: Gaussian actions clipped to the box by both backends.
        ("acer", "pendulum", dict(max_episode_steps=60)),
    ],
)
def test_the_compiled_rollout_trains_the_host_runs_replay_data_exactly(
    tmp_path, script, preset, train
):
  budget = dict(num_envs=4, unroll_length=8, total_env_steps=1536, log_every=384,
                checkpoint_every=768, eval_every=768, eval_episodes=2, min_replay_size=8,
                mini_batch_size=8, mini_batch_length=4, **train)  # fmt: skip
  host_lines, host_params = _run(script, preset, tmp_path / "host", "host", **budget)
  compiled_lines, compiled_params = _run(script, preset, tmp_path / "compiled", "compiled",
                                         **budget)  # fmt: skip
  assert [l["env_steps"] for l in host_lines] == [384, 768, 1152, 1536]
  assert sum(l["episodes"] for l in host_lines) >= 10  # episodes end inside the unrolls
  assert any("loss" in l for l in host_lines)  # the replay filled and updates ran
  assert compiled_lines == host_lines
  assert compiled_params == host_params
