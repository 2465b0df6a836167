"""EnvPoolEnv.render: RGB frames of the environments' states (render_mode="rgb_array")."""

import numpy as np
import pytest

from offpolicy_ac import envs
from offpolicy_ac.training import RenderedEpisode
from offpolicy_ac.training import render_episode
from offpolicy_ac.training.evaluation import EpisodeLimitError


@pytest.mark.parametrize(
    "task, action, shape",
    [
        ("CartPole-v1", np.array([1, 1], np.int32), (400, 600, 3)),
        ("Pendulum-v1", np.array([[2.0], [2.0]], np.float32), (500, 500, 3)),
    ],
)
def test_frames_show_the_state(task, action, shape):
  with envs.make(task, 2, 3, render_mode="rgb_array") as env:
    env.reset()
    first = env.render()
    assert first.shape == (1,) + shape and first.dtype == np.uint8
    both = env.render([0, 1])
    np.testing.assert_array_equal(both[0], first[0])
    assert not np.array_equal(both[0], both[1])  # seeds 3 and 4: different starts
    for _ in range(5):
      env.step(action)
    later = env.render()
    assert np.abs(later.astype(int) - first.astype(int)).sum() > 1000
    np.testing.assert_array_equal(later, env.render())  # no step, no change
  with envs.make(task, 1, 3, render_mode="rgb_array") as env:
    env.reset()
    np.testing.assert_array_equal(env.render(), first)  # same seed, same start


def test_atari_frames_are_the_full_colour_screen():
  with envs.make_atari("Pong-v5", 1, 0, train=False, render_mode="rgb_array") as env:
    ts = env.reset()
    frame = env.render()
  assert ts.observation.shape == (1, 4, 84, 84)
  assert frame.shape == (1, 210, 160, 3) and frame.dtype == np.uint8


def test_render_needs_a_render_mode_and_valid_env_ids():
  with envs.make("CartPole-v1", 2, 0) as env:
    env.reset()
    with pytest.raises(ValueError, match="render_mode='rgb_array'"):
      env.render()
  with envs.make("CartPole-v1", 2, 0, render_mode="rgb_array") as env:
    env.reset()
    with pytest.raises(ValueError, match="env_ids"):
      env.render([2])
    with pytest.raises(ValueError, match=r"env_ids must be ints in \[0, 2\), got \[1.5\]"):
      env.render([1.5])  # was truncated to environment 1
  # The default is envpool's render_env_id (it rendered environment 0 whatever was given).
  with envs.make("CartPole-v1", 2, 0, render_mode="rgb_array", render_env_id=1) as env:
    env.reset()
    np.testing.assert_array_equal(env.render(), env.render([1]))
    assert not np.array_equal(env.render([0]), env.render([1]))


def test_render_episode_renders_every_step_until_last():
  # Always pushing right ends CartPole within a few dozen steps.
  push_right = lambda params, obs: np.ones((obs.shape[0],), np.int32)
  with envs.make("CartPole-v1", 1, 5, render_mode="rgb_array") as env:
    frames, ret = render_episode(env, push_right, None)
  assert 5 < ret < 100
  assert frames.shape == (ret + 1, 400, 600, 3)
  with envs.make("CartPole-v1", 1, 5, max_episode_steps=4, render_mode="rgb_array") as env:
    frames, ret = render_episode(env, push_right, None)  # truncated
  assert ret == 4 and len(frames) == 5
  with envs.make("CartPole-v1", 2, 5, render_mode="rgb_array") as env:
    with pytest.raises(ValueError, match="one environment"):
      render_episode(env, push_right, None)


def test_a_rendered_episode_yields_render_episodes_frames_one_at_a_time():
  push_right = lambda params, obs: np.ones((obs.shape[0],), np.int32)
  with envs.make("CartPole-v1", 1, 5, render_mode="rgb_array") as env:
    frames, ret = render_episode(env, push_right, None)
  with envs.make("CartPole-v1", 1, 5, render_mode="rgb_array") as env:
    episode = RenderedEpisode(env, push_right, None)
    streamed = iter(episode)
    first = next(streamed)
    assert episode.num_frames == 1 and episode.episode_return is None
    rest = list(streamed)
  np.testing.assert_array_equal(np.stack([first, *rest]), frames)
  assert episode.episode_return == ret and episode.num_frames == len(frames)
  with envs.make("CartPole-v1", 1, 5, render_mode="rgb_array") as env:
    with pytest.raises(EpisodeLimitError, match="did not finish in 3 steps"):
      list(RenderedEpisode(env, push_right, None, max_steps=3))


def test_an_atari_rendered_episode_is_the_whole_game_evaluate_scores():
  """A life loss ends an episode for the agent, also in evaluation: the rendered episode
  goes on to the game's end, as `evaluate` scores it (it stopped at the first lost life)."""
  from offpolicy_ac.training import evaluate

  noop = lambda params, obs: np.zeros((obs.shape[0],), np.int32)  # the ball is served for it
  with envs.make_atari("Breakout-v5", 1, 4, train=False, render_mode="rgb_array") as env:
    episode = RenderedEpisode(env, noop, None)
    num_frames = sum(1 for _ in episode)
  with envs.make_atari("Breakout-v5", 1, 4, train=False) as env:
    (score,) = evaluate(env, noop, None, 1)
    env.pop_episode_stats()
    env.reset()
    lives_lost, steps = 0, 0
    while True:
      ts = env.step(np.zeros(1, np.int32))
      steps += 1
      stats = env.pop_episode_stats()
      if len(stats.env_id):
        break
      lives_lost += int(ts.step_type[0] == envs.LAST)
  assert lives_lost == 4  # five lives: four episodes end before the game's
  assert episode.episode_return == score and num_frames == steps + 1
  # a reset step after each lost life: a frame more than the game's length (docs/evaluation.md)
  assert num_frames == stats.episode_length[0] + 1 + lives_lost
