"""Every script's Atari preset starts and trains on the CPU (a reduced budget: a few updates
of the preset's own network, optimizer and losses on Pong), and prints the evaluation
protocol beside its scores."""

import dataclasses
import json

import numpy as np
import pytest

from offpolicy_ac import demos as demos_lib
from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.training import ReplayConfig
from offpolicy_ac.training import read_metrics

# A budget this CPU trains in seconds: 2 environments, a few unrolls of the preset's length,
# replay warmed up by the first of them and sized for them (the presets' buffers hold up to
# 100k frame stacks: 3 GB), one greedy evaluation of short games at the end.
REDUCED = dict(
    num_envs=2,
    total_env_steps=160,
    log_every=40,
    eval_every=160,
    eval_episodes=1,
    max_episode_steps=100,
    checkpoint_every=0,
    replay_capacity=64,
    min_replay_size=2,
    mini_batch_size=2,
)
REPLAY_FIELDS = {field.name for field in dataclasses.fields(ReplayConfig)}
"""IMPALA's preset learns on-policy: replay settings are refused."""


@pytest.fixture(scope="module")
def pong_demos(tmp_path_factory):
  """Demonstrations of Pong in the file layout SQIL reads (random actions: the layout, not
  an expert, is what starting the preset needs)."""
  rng = np.random.default_rng(0)
  with envs.make_atari("Pong-v5", 2, 0, max_episode_steps=60) as env:
    demos = demos_lib.record_episodes(
        env, lambda obs: rng.integers(0, 6, obs.shape[0]).astype(np.int32), 2
    )
  path = tmp_path_factory.mktemp("demos") / "pong.npz"
  demos_lib.save_demos(path, demos, env_id="Pong-v5")
  return path


@pytest.mark.parametrize("script", ["impala", "acer", "sql", "sqil"])
def test_atari_preset_starts_and_trains(script, tmp_path, pong_demos, capsys):
  module = getattr(presets, script)
  preset = module.PRESETS["atari"]
  assert preset.train.env.atari and preset.train.env.env_id == "Pong-v5"
  reduced = {k: v for k, v in REDUCED.items() if script != "impala" or k not in REPLAY_FIELDS}
  args = dataclasses.replace(preset, run_dir=str(tmp_path), train=preset.train.replace(**reduced))
  if script == "sqil":
    args = dataclasses.replace(args, demos=str(pong_demos))
  module.run(args)
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert summary["env_steps"] >= 160 and summary["num_updates"] >= 1
  lines = read_metrics(tmp_path)
  assert any(line.get("eval_return") is not None for line in lines)
  losses = [k for k in lines[-1] if "loss" in k]
  assert losses and all(np.isfinite(lines[-1][k]) for k in losses)
  protocol = summary["evaluation_protocol"]
  assert protocol == envs.atari_protocol("Pong-v5", max_episode_steps=100).describe() + (
      "; greedy policy, mean return of 1 episode, each on its own freshly reset environment"
      " every 160 env steps"
  )
  assert f"evaluation protocol: {protocol}" in capsys.readouterr().out
