"""TrainConfig.validate refuses a field of the wrong type, from Python or a config.json."""

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
        (dict(sweep="learning_rate=1e-3,3e-3"), "sweep must be a list of strs"),
        (dict(sweep=(1,)), "sweep must be a list of strs, got (1,)"),
    ],
)
def test_a_field_of_another_type_is_refused_by_name(fields, message):
  with pytest.raises(ValueError) as e:
    TrainConfig.of(**fields).validate()
  assert str(e.value).startswith(message)


def test_ints_for_numbers_and_lists_for_the_sweep_are_accepted():
  TrainConfig.of(normalize_observations=True, obs_clip=10, reward_scale=1).validate()
  TrainConfig.of(env_id="gymnax:CartPole-v1", sweep=["learning_rate=1e-3,3e-3"]).validate()
