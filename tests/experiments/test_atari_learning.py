"""Every script's Atari preset learns on this CPU: Breakout-v5 runs that score clearly above
a random policy in 14 to 38 minutes each on 2 cores shared with another run (marked `slow`;
CI runs every preset's reduced budget in test_atari_presets.py). SQIL learns from games
recorded with ACER's run (so its test trains ACER first when run alone).

Each run is its script's Atari preset on Breakout-v5 with the CPU-sized torso
(`small_cnn`: 4x4 max pooling, two small convolutions, dense 128) and no greedy
evaluation (a greedy Breakout policy that never serves plays on to the 27,000-step time
limit).
The score is the raw game score of whole games the training actors finish (episodic life
and reward clipping are on for learning only), over the run's last 100k env steps, against
the same statistic of a uniformly random policy measured here under the same protocol.
"""

import dataclasses

import numpy as np
import pytest
from scripts import load_script

from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.training import read_metrics

TASK = "Breakout-v5"
LAST_STEPS = 100_000
"""Env steps at the end of a run whose finished games are scored."""
IMPROVEMENT = {"impala": 1.5, "acer": 1.5, "sql": 1.5, "sqil": 1.25}
"""The multiple of the random policy's mean game score each script's run must reach. SQIL
imitates 30 games of ACER's behaviour policy (3.5 to 4.2 points a game), and two runs of
its test scored 1.6 and 1.36 times random (docs/benchmarks.md)."""
ENV_STEPS = 800_000
"""Each run's budget (3.2M frames)."""


def _random_policy_scores(task_id: str, num_games: int, seed: int = 0) -> np.ndarray:
  """Raw scores of `num_games` whole games of a uniformly random policy: [num_games]."""
  rng = np.random.default_rng(seed)
  scores: list[np.ndarray] = []
  finished = 0
  with envs.make_atari(task_id, 16, seed) as env:
    num_actions = env.spec.num_actions
    env.reset()
    while finished < num_games:
      env.step(rng.integers(0, num_actions, env.num_envs).astype(np.int32))
      scores.append(np.asarray(env.pop_episode_stats().episode_return))
      finished += len(scores[-1])
  return np.concatenate(scores)[:num_games]


@pytest.fixture(scope="module")
def random_score():
  return float(np.mean(_random_policy_scores(TASK, 200)))


def _final_score(run_dir) -> tuple[float, int]:
  """Mean raw game score of the games finished in the run's last `LAST_STEPS` env steps,
  and how many there were."""
  lines = [r for r in read_metrics(run_dir) if r.get("episodes")]
  last_step = lines[-1]["env_steps"]
  recent = [r for r in lines if r["env_steps"] > last_step - LAST_STEPS]
  games = sum(r["episodes"] for r in recent)
  return sum(r["episode_return"] * r["episodes"] for r in recent) / games, games


def _breakout_args(script: str, run_dir, agent_overrides: dict):
  """The script's atari preset on Breakout-v5 for ENV_STEPS, CPU torso, evaluation off."""
  module = getattr(presets, script)
  preset = module.PRESETS["atari"]
  agent = dataclasses.replace(preset.agent, torso="small_cnn", **agent_overrides)
  train = preset.train.replace(
      env_id=TASK,
      total_env_steps=ENV_STEPS,
      eval_every=0,
      checkpoint_every=0,
      log_every=10_000,
  )
  return module, dataclasses.replace(preset, run_dir=str(run_dir), agent=agent, train=train)


def test_random_policy_scores_are_whole_games():
  scores = _random_policy_scores(TASK, 40)
  assert scores.shape == (40,)
  # Five lives: a random policy scores about a point per game; the episodes that end at a
  # life loss (training's) would score about a fifth of that.
  assert 0.5 < scores.mean() < 3.0


# The presets' agent settings changed for the CPU runs (beside the torso): ACER replays once
# per fresh unroll instead of four times (its learner, not the environment, bounds its speed
# on this CPU).
CPU_AGENT_OVERRIDES = {
    "impala": {},
    "acer": {"replay_ratio": 1},
    "sql": {},
    "sqil": {},
}
DEMONSTRATOR = "acer"
"""The run whose behaviour policy records SQIL's demonstrations."""
DEMO_GAMES = 30
"""Whole games SQIL learns from."""


class _BreakoutRuns:
  """Each script's Breakout run directory, trained when first asked for. SQIL's
  demonstrations are `DEMO_GAMES` games of the `DEMONSTRATOR`'s run, recorded with
  `experiments/record_demos.py --policy behaviour` (its greedy policy never serves)."""

  def __init__(self, root):
    self.root, self.dirs = root, {}

  def __getitem__(self, script):
    if script not in self.dirs:
      run_dir = self.root / script
      module, args = _breakout_args(script, run_dir, CPU_AGENT_OVERRIDES[script])
      if script == "sqil":
        args = dataclasses.replace(args, demos=str(self.demonstrations()))
      module.run(args)
      self.dirs[script] = run_dir
    return self.dirs[script]

  def demonstrations(self):
    path = self.root / "demos.npz"
    if not path.exists():
      record = load_script("record_demos")
      record.main(record.Args(run_dir=str(self[DEMONSTRATOR]), out=str(path),
                              episodes=DEMO_GAMES, seed=7, policy="behaviour"))  # fmt: skip
    return path


@pytest.fixture(scope="module")
def breakout_runs(tmp_path_factory):
  return _BreakoutRuns(tmp_path_factory.mktemp("breakout"))


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(CPU_AGENT_OVERRIDES))
def test_atari_preset_learns_breakout_on_cpu(script, breakout_runs, random_score):
  score, games = _final_score(breakout_runs[script])
  assert games >= 100
  assert score >= IMPROVEMENT[script] * random_score, (score, random_score)
