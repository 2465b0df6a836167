"""The protocol of Atari scores and the time limits, read off envpool's configuration."""

import pytest

from offpolicy_ac import envs
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import describe_protocol


def test_the_atari_preset_protocol():
  protocol = envs.atari_protocol("Pong-v5")
  assert protocol == envs.AtariProtocol(
      task_id="Pong-v5",
      sticky_action_probability=0.0,
      full_action_space=False,
      num_actions=6,
      noop_max=30,
      episodic_life=True,
      reward_clip=True,
      frame_skip=4,
      max_episode_steps=27_000,
  )
  assert protocol.max_episode_frames == 108_000 and protocol.frames(10) == 40
  text = protocol.describe()
  for part in ("raw game score of whole games", "no sticky actions", "up to 30 no-op starts",
               "minimal action set (6 actions)", "frame skip 4", "108,000 frames"):  # fmt: skip
    assert part in text, part
  # What the agent acts in: the action set agrees with the environment's spec.
  assert envs.spec("Pong-v5", atari=True).num_actions == protocol.num_actions


def test_the_protocol_follows_the_options_envpool_gets():
  protocol = envs.atari_protocol(
      "Breakout-v5",
      repeat_action_probability=0.25,
      full_action_space=True,
      noop_max=0,
      frame_skip=5,
      max_episode_steps=1_000,
      episodic_life=False,
  )
  assert protocol.sticky_action_probability == 0.25
  assert protocol.full_action_space and protocol.num_actions == 18
  assert protocol.noop_max == 0 and not protocol.episodic_life
  assert protocol.frame_skip == 5 and protocol.max_episode_frames == 5_000
  text = protocol.describe()
  assert "sticky actions p=0.25" in text and "full action set (18 actions)" in text
  assert "whole games, training rewards clipped" in text


def test_non_atari_tasks_and_bad_ids_are_refused():
  with pytest.raises(ValueError, match="^atari_protocol expects an envpool Atari id"):
    envs.atari_protocol("CartPole-v1")
  with pytest.raises(ValueError, match=r"^spec\(atari=True\) expects an envpool Atari id"):
    envs.spec("CartPole-v1", atari=True)
  with pytest.raises(ValueError, match="^make_atari expects an envpool Atari id"):
    envs.make_atari("CartPole-v1", 1, 0)
  with pytest.raises(ValueError, match="unknown task id"):
    envs.atari_protocol("Pong-v55")
  with pytest.raises(ValueError, match="unknown task id"):
    envs.time_limit("CartPole-v9")


def test_time_limits():
  assert envs.time_limit("CartPole-v1") == 500
  assert envs.time_limit("CartPole-v0") == 200
  assert envs.time_limit("Pendulum-v1") == 200
  assert envs.time_limit("CartPole-v1", max_episode_steps=77) == 77


def test_describe_protocol_of_a_run():
  config = TrainConfig.of(env_id="CartPole-v1", total_env_steps=100_000, log_every=1_000)
  assert describe_protocol(config) == (
      "CartPole-v1: sum of rewards per episode, time limit 500 env steps; greedy policy, "
      "mean return of 5 episodes, each on its own freshly reset environment every 5,000 "
      "env steps"
  )
  # An interval shorter than an iteration evaluates at each iteration's end (it said 50).
  assert describe_protocol(config.replace(eval_every=50, num_envs=4, unroll_length=16)).endswith(
      "freshly reset environment every iteration of 64 env steps (the interval set, 50 env "
      "steps, is shorter)"
  )  # fmt: skip
  short = config.replace(total_env_steps=2_048, log_every=5_000)  # no point before the end
  assert describe_protocol(short).endswith("freshly reset environment at the end of the run")
  off = config.replace(eval_every=0, max_episode_steps=200)
  assert describe_protocol(off).startswith(
      "CartPole-v1: sum of rewards per episode, time limit 200"
  )
  assert describe_protocol(off).endswith("(evaluation off)")
  # A one-off evaluation (experiments/evaluate.py) names its own number of episodes.
  assert "mean return of 12 episodes, each on its own freshly reset environment" in (
      describe_protocol(config, 12)
  )
  atari = TrainConfig.of(env_id="Pong-v5", atari=True, max_episode_steps=1_000)
  assert describe_protocol(atari).startswith(
      envs.atari_protocol("Pong-v5", max_episode_steps=1_000).describe() + "; greedy policy"
  )
