"""TrainConfig.validate refuses a field of the wrong type, from Python or a config.json."""

import dataclasses
import json

import pytest

from offpolicy_ac.training import TrainConfig


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(vmap_seeds=1), "vmap_seeds must be True or False, got 1"),
        (dict(wandb_project=5, track=True), "wandb_project must be a str, got 5"),
        (dict(obs_clip="10"), "obs_clip must be a number, got '10'"),
        (dict(reward_scale=True), "reward_scale must be a number, got True"),
        (dict(grace_period_s=None), "grace_period_s must be a number, got None"),
        (dict(env_id=3), "env_id must be a task id (a non-empty str), got 3"),
        (dict(sweep="learning_rate=1e-3,3e-3"), "sweep must be a tuple or list of strs"),
        (dict(sweep=(1,)), "sweep must be a tuple or list of strs, got (1,)"),
        (dict(eval_every=512, target_return="100"), "target_return must be a number, got '100'"),
        (dict(reward_clip=(-1.0, 0.0, 1.0)), "reward_clip must be a pair of numbers"),
        (dict(reward_clip="-1,1"), "reward_clip must be a pair of numbers (low, high), got"),
        (dict(reward_clip=("-1", "1")), "reward_clip must be a pair of numbers"),
        (dict(replay_capacity=2**31), "replay_capacity must be below 2**31"),
        (dict(num_envs=10**12), "num_envs must be below 2**31 (a 32-bit count"),
        (dict(eval_episodes=2**20 + 1), "eval_episodes must be at most 1,048,576"),
        (dict(num_seeds=10**12), "num_seeds must be at most 65,536"),  # (not a list of 1e12)
    ],
)
def test_a_field_of_another_type_is_refused_by_name(fields, message):
  with pytest.raises(ValueError) as e:
    TrainConfig.of(**fields).validate()
  assert str(e.value).startswith(message)


def test_ints_for_numbers_and_lists_for_the_sweep_are_accepted():
  TrainConfig.of(normalize_observations=True, obs_clip=10, reward_scale=1).validate()
  TrainConfig.of(env_id="gymnax:CartPole-v1", sweep=["learning_rate=1e-3,3e-3"]).validate()


def test_lists_given_from_python_become_tuples_so_the_config_stays_hashable():
  config = TrainConfig.of(env_id="gymnax:CartPole-v1", reward_clip=[-1, 1],
                          sweep=["learning_rate=1e-3,3e-3"])  # fmt: skip
  config.validate()
  assert config.transform.reward_clip == (-1, 1)
  assert config.budget.sweep == ("learning_rate=1e-3,3e-3",)
  assert hash(config) == hash(config.replace(reward_clip=(-1, 1)))
  assert config == TrainConfig.from_dict(json.loads(json.dumps(dataclasses.asdict(config))))


def test_a_group_of_another_kind_and_an_unknown_group_are_refused():
  with pytest.raises(
      ValueError, match="TrainConfig's env must be an EnvConfig, got {'num_envs': 8}"
  ):
    TrainConfig.of(env={"num_envs": 8})
  with pytest.raises(ValueError, match=r"unknown TrainConfig groups: \['envs'\]"):
    TrainConfig.from_dict({"envs": {"num_envs": 3}})
