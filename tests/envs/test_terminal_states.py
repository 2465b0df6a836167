"""A termination on the time limit's step is a termination (discount 0), in every envpool
path: envpool itself reports it as a truncation (envs/_terminal_states.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import envs
from offpolicy_ac.envs._terminal_states import split_limit_step

jax.config.update("jax_numpy_rank_promotion", "raise")


def cartpole_out_of_bounds(obs: np.ndarray) -> np.ndarray:
  return (np.abs(obs[..., 0]) > 2.4) | (np.abs(obs[..., 2]) > 12 * 2 * np.pi / 360)


def push_right(params, obs, key):
  return jnp.ones(obs.shape[:1], jnp.int32), {}


def steps_to_fall(seed: int) -> int:
  """Actions until CartPole environment 0 of `seed`, always pushed right, falls."""
  env = envs.make("CartPole-v1", 1, seed)
  env.reset()
  n = 1
  while env.step(np.ones(1, np.int32)).step_type[0] != envs.LAST:
    n += 1
  env.close()
  return n


@pytest.mark.parametrize("backend", ["step", "host", "compiled"])
@pytest.mark.parametrize("batch_size", [3, 2], ids=["whole", "batched"])
def test_a_fall_on_the_limit_step_is_a_termination(backend, batch_size):
  fall = steps_to_fall(seed=0)
  for limit, discount in ((fall, 0.0), (fall - 1, 1.0)):
    env = envs.make("CartPole-v1", 3, 0, batch_size=batch_size, max_episode_steps=limit)
    if backend == "step":
      ts = env.reset()
      steps = [ts]
      while len(steps) < 2 * limit + 3:
        ts = env.step(np.ones(batch_size, np.int32), ts.env_id)
        steps.append(ts)
      traj = jax.tree.map(lambda *x: np.stack(x), *steps)
    else:
      rollout = envs.make_rollout(env, push_right, 2 * limit + 2, backend=backend)
      _, traj, _ = rollout.unroll(None, rollout.init(None, jax.random.PRNGKey(0)))
    step_type, obs = np.asarray(traj.step_type), np.asarray(traj.observation)
    env_id, got = np.asarray(traj.env_id), np.asarray(traj.discount)
    last = step_type == envs.LAST
    # Environment 0's first episode ends on the limit's step: fallen (discount 0) when the
    # limit is the fall's step, upright (discount 1) one step before it.
    rows, cols = np.nonzero(env_id == 0)  # row-major: its steps in time order
    first_end = np.flatnonzero(last[rows, cols])[0]
    assert first_end == limit  # its steps from the reset: FIRST, then `limit` actions
    end = rows[first_end], cols[first_end]
    assert got[end] == discount
    assert cartpole_out_of_bounds(obs[end]) == (discount == 0.0)
    # Every end: discount 0 exactly when the pole is down.
    np.testing.assert_array_equal(got[last] == 0.0, cartpole_out_of_bounds(obs[last]))
    np.testing.assert_array_equal(got[~last], 1.0)
    env.close()


def _random_or(policy, spec, obs, rng):
  if policy is not None:
    return policy(obs)
  if spec.is_discrete:
    return rng.integers(0, spec.num_actions, size=obs.shape[0])
  shape = (obs.shape[0], *spec.action_shape)
  return rng.uniform(spec.action_low, spec.action_high, size=shape).astype(np.float32)


@pytest.mark.parametrize(
    "task, options, policy",
    [
        ("CartPole-v1", {}, None),
        ("Acrobot-v1", {}, lambda obs: np.where(obs[:, 4] < 0, 2, 0)),  # pumps energy
        ("MountainCar-v0", {}, lambda obs: np.where(obs[:, 1] > 0, 2, 0)),
        ("MountainCarContinuous-v0", {}, lambda obs: np.sign(obs[:, 1:2]) + (obs[:, 1:2] == 0)),
        ("Hopper-v4", {}, None),
        ("Hopper-v5", {"exclude_current_positions_from_observation": False}, None),
        ("Hopper-v4", {"healthy_state_min": -2.0, "healthy_state_max": 2.0}, None),
        ("Walker2d-v4", {"healthy_z_min": 1.0}, None),
        ("Walker2d-v5", {"exclude_current_positions_from_observation": False}, None),
        ("Ant-v5", {"healthy_z_max": 0.8}, None),
        ("Humanoid-v4", {}, None),
        ("Humanoid-v5", {"exclude_current_positions_from_observation": False}, None),
        ("InvertedPendulum-v4", {"healthy_z_max": 0.1}, None),
    ],
)
def test_terminal_tests_agree_with_envpool(task, options, policy):
  """Without a limit in reach, envpool's own terminations are exactly the steps the test
  calls terminal (on the float32 observations the agents see)."""
  env = envs.make(task, 4, 1, **options)
  test = env.terminal_test
  assert test is not None
  rng = np.random.default_rng(0)
  ts = env.reset()
  terminations = 0
  for _ in range(400):
    action = _random_or(policy, env.spec, ts.observation, rng)
    ts = env.step(np.asarray(action, env.spec.action_dtype))
    terminated = (ts.step_type == envs.LAST) & (ts.discount == 0.0)
    np.testing.assert_array_equal(test(ts.observation, np)[ts.step_type != envs.FIRST],
                                  terminated[ts.step_type != envs.FIRST])  # fmt: skip
    assert (test(jnp.asarray(ts.observation), jnp) == test(ts.observation, np)).all()
    terminations += int(terminated.sum())
  assert terminations >= 5
  env.close()


def test_tasks_without_a_known_test_keep_envpool_flags():
  assert envs.make("Pendulum-v1", 1, 0).terminal_test is None  # never terminates
  assert envs.make("HalfCheetah-v4", 1, 0).terminal_test is None
  assert envs.make("Hopper-v4", 1, 0, terminate_when_unhealthy=False).terminal_test is None
  assert envs.make("Hopper-v4", 1, 0, frame_stack=2).terminal_test is None


@pytest.mark.parametrize("xp", [np, jnp], ids=["numpy", "jax"])
def test_split_limit_step(xp):
  terminated = xp.asarray([True, False, False, False])
  truncated = xp.asarray([False, True, True, False])
  obs = xp.asarray([[3.0, 0, 0, 0], [3.0, 0, 0, 0], [0.0, 0, 0, 0], [3.0, 0, 0, 0]])
  cartpole = envs.make("CartPole-v1", 1, 0).terminal_test
  term, trunc = split_limit_step(obs, terminated, truncated, None, cartpole, xp)
  np.testing.assert_array_equal(term, [True, True, False, False])
  np.testing.assert_array_equal(trunc, [False, False, True, False])
  # Atari: the game over flag decides, whatever the observation.
  game_over = xp.asarray([1, 1, 0, 1], xp.int32)
  term, trunc = split_limit_step(obs, terminated, truncated, game_over, None, xp)
  np.testing.assert_array_equal(term, [True, True, False, False])
  np.testing.assert_array_equal(trunc, [False, False, True, False])
  term, trunc = split_limit_step(obs, terminated, truncated, None, None, xp)
  np.testing.assert_array_equal(term, terminated)
  np.testing.assert_array_equal(trunc, truncated)
