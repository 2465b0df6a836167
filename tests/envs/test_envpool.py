"""EnvPoolEnv on real envpool environments: ALF TimeStep semantics (docs/design.md,
"Contract 2 — environments").

CartPole's dynamics give a strong check that steps belong together: envpool integrates
x += tau * x_dot and theta += tau * theta_dot (tau = 0.02) before anything else, so for two
consecutive steps of one environment obs'[0] = obs[0] + 0.02 obs[1] and obs'[2] = obs[2] +
0.02 obs[3]. A final observation that was really a reset observation, or rows of different
environments mixed up, break it by orders of magnitude more than float32 rounding.
"""

import jax
import numpy as np

from offpolicy_ac import envs
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST
from offpolicy_ac.envs import MID

jax.config.update("jax_numpy_rank_promotion", "raise")

TAU = 0.02


def follows(prev_obs: np.ndarray, obs: np.ndarray) -> np.ndarray:
  """[B] bool: CartPole observation `obs` is the successor of `prev_obs` (same env)."""
  x_ok = np.abs(obs[..., 0] - (prev_obs[..., 0] + TAU * prev_obs[..., 1])) < 1e-5
  th_ok = np.abs(obs[..., 2] - (prev_obs[..., 2] + TAU * prev_obs[..., 3])) < 1e-5
  return x_ok & th_ok


def cartpole_out_of_bounds(obs: np.ndarray) -> np.ndarray:
  return (np.abs(obs[..., 0]) > 2.4) | (np.abs(obs[..., 2]) > 12 * 2 * np.pi / 360)


def test_cartpole_termination_truncation_and_first_steps():
  n, limit = 4, 12
  env = envs.make("CartPole-v1", n, seed=3, max_episode_steps=limit)
  ts = env.reset()
  assert ts.step_type.dtype == np.int32 and ts.env_id.dtype == np.int32
  np.testing.assert_array_equal(ts.step_type, FIRST)
  np.testing.assert_array_equal(ts.reward, 0.0)
  np.testing.assert_array_equal(ts.discount, 1.0)
  np.testing.assert_array_equal(ts.env_id, np.arange(n))
  rng = np.random.default_rng(0)
  seen = {"term": 0, "trunc": 0, "first_after_last": 0}
  elapsed = np.zeros(n, int)
  for _ in range(200):
    prev = ts
    ts = env.step(rng.integers(0, 2, size=n))
    was_last = prev.step_type == LAST
    elapsed = np.where(was_last, 0, elapsed + 1)
    # The step after LAST is FIRST: reward 0, discount 1, and a fresh observation.
    np.testing.assert_array_equal(ts.step_type[was_last], FIRST)
    np.testing.assert_array_equal(ts.reward[was_last], 0.0)
    np.testing.assert_array_equal(ts.discount[was_last], 1.0)
    assert not follows(prev.observation, ts.observation)[was_last].any()
    seen["first_after_last"] += int(was_last.sum())
    # Every other step is the true successor, reward 1 (CartPole), MID or LAST.
    stepped = ~was_last
    assert follows(prev.observation, ts.observation)[stepped].all()
    np.testing.assert_array_equal(ts.reward[stepped], 1.0)
    assert np.isin(ts.step_type[stepped], (MID, LAST)).all()
    last = ts.step_type == LAST
    terminated = last & (ts.discount == 0.0)
    truncated = last & (ts.discount == 1.0)
    # Termination: the true final observation is out of bounds, on the limit's step too.
    # Truncation: at the time limit, upright.
    assert cartpole_out_of_bounds(ts.observation[terminated]).all()
    assert (elapsed[terminated] <= limit).all()
    np.testing.assert_array_equal(elapsed[truncated], limit)
    assert not cartpole_out_of_bounds(ts.observation[truncated]).any()
    assert not cartpole_out_of_bounds(ts.observation[(ts.step_type == MID)]).any()
    np.testing.assert_array_equal(ts.discount[ts.step_type != LAST], 1.0)
    seen["term"] += int(terminated.sum())
    seen["trunc"] += int(truncated.sum())
  assert seen["term"] > 0 and seen["trunc"] > 0 and seen["first_after_last"] > 0
  stats = env.pop_episode_stats()
  assert stats.env_id.shape[0] == seen["term"] + seen["trunc"]
  assert (stats.episode_length <= limit).all() and (stats.episode_length == limit).any()
  np.testing.assert_array_equal(stats.episode_return, stats.episode_length)  # reward 1 per step
  assert env.pop_episode_stats().env_id.shape == (0,)


def test_truncation_keeps_discount_one_and_true_final_observation():
  env = envs.make("CartPole-v1", 2, seed=0, max_episode_steps=5)
  ts = env.reset()
  obs = [ts.observation]
  for t in range(1, 7):
    ts = env.step(np.zeros(2, np.int32) + t % 2)
    obs.append(ts.observation)
    if t < 5:
      np.testing.assert_array_equal(ts.step_type, MID)
    elif t == 5:
      np.testing.assert_array_equal(ts.step_type, LAST)
      np.testing.assert_array_equal(ts.discount, 1.0)  # time limit: still bootstrapped
      assert follows(obs[-2], obs[-1]).all()  # the true final observation
    else:
      np.testing.assert_array_equal(ts.step_type, FIRST)
      np.testing.assert_array_equal(ts.reward, 0.0)
  stats = env.pop_episode_stats()
  np.testing.assert_array_equal(stats.episode_length, [5, 5])
  np.testing.assert_array_equal(stats.episode_return, [5.0, 5.0])


def test_same_seed_same_data_and_fast_io_matches_public_api():
  def run(fast_io: bool, seed: int):
    env = envs.make("CartPole-v1", 3, seed=seed, max_episode_steps=20)
    if not fast_io:  # the same wrapper over envpool's public gymnasium send/recv
      env = envs.EnvPoolEnv(env.pool, env.spec, atari=False, fast_io=False)
    out = [env.reset()]
    rng = np.random.default_rng(1)
    out += [env.step(rng.integers(0, 2, size=3)) for _ in range(60)]
    return jax.tree.map(lambda *x: np.stack(x), *out), env.pop_episode_stats()

  a, stats_a = run(True, 7)
  b, stats_b = run(False, 7)
  c, _ = run(True, 8)
  for x, y in zip(jax.tree.leaves((a, stats_a)), jax.tree.leaves((b, stats_b)), strict=True):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a.observation, c.observation)


def test_batched_stepping_covers_every_env_and_keeps_envs_apart():
  n, batch = 6, 2
  env = envs.make("CartPole-v1", n, seed=0, batch_size=batch, max_episode_steps=15)
  assert env.is_batched and env.spec.is_batched
  per_env: dict[int, list] = {i: [] for i in range(n)}
  ts = env.reset()
  rng = np.random.default_rng(0)
  for _ in range(150):
    assert ts.env_id.shape == (batch,) and len(set(ts.env_id.tolist())) == batch
    for j, e in enumerate(ts.env_id):
      per_env[int(e)].append(jax.tree.map(lambda x, j=j: x[j], ts))
    env.send(rng.integers(0, 2, size=batch), ts.env_id)
    ts = env.recv()
  assert all(len(v) > 10 for v in per_env.values())  # every env_id served
  for e, steps in per_env.items():
    assert steps[0].step_type == FIRST
    for prev, cur in zip(steps[:-1], steps[1:], strict=True):
      assert cur.env_id == e
      if prev.step_type == LAST:
        assert cur.step_type == FIRST and cur.reward == 0.0
      else:
        assert cur.step_type in (MID, LAST)
        assert follows(prev.observation, cur.observation), (e, prev, cur)
  stats = env.pop_episode_stats()
  assert set(stats.env_id.tolist()) == set(range(n))
  for e in range(n):  # per-env statistics from that env's own steps only
    steps = per_env[e]
    ends = [i for i, s in enumerate(steps) if s.step_type == LAST]
    starts = [i for i, s in enumerate(steps) if s.step_type == FIRST]
    lengths = [end - start for start, end in zip(starts, ends, strict=False)]
    np.testing.assert_array_equal(stats.episode_length[stats.env_id == e], lengths)


def test_pendulum_continuous_actions_are_clipped():
  a = envs.make("Pendulum-v1", 2, seed=5)
  b = envs.make("Pendulum-v1", 2, seed=5)
  spec = a.spec
  assert not spec.is_discrete and spec.num_actions is None
  assert spec.action_shape == (1,) and spec.action_low == (-2.0,) and spec.action_high == (2.0,)
  assert spec.observation_shape == (3,) and spec.observation_dtype == "float32"
  a.reset()
  b.reset()
  for _ in range(5):
    ta = a.step(np.array([[10.0], [-7.5]], np.float32))
    tb = b.step(np.array([[2.0], [-2.0]], np.float64))
    np.testing.assert_array_equal(ta.observation, tb.observation)
    np.testing.assert_array_equal(ta.reward, tb.reward)
  for _ in range(200):  # Pendulum-v1 is truncated at 200 steps, never terminated
    ts = a.step(np.zeros((2, 1), np.float32))
    assert not ((ts.step_type == LAST) & (ts.discount == 0.0)).any()
  stats = a.pop_episode_stats()
  np.testing.assert_array_equal(stats.episode_length, [200, 200])


def test_mujoco_float64_spaces_become_float32():
  env = envs.make("Hopper-v4", 2, seed=0)
  assert env.spec.observation_dtype == "float32" and env.spec.action_shape == (3,)
  ts = env.reset()
  assert ts.observation.dtype == np.float32 and ts.observation.shape == (2, 11)
  ts = env.step(np.zeros((2, 3), np.float32))
  assert ts.observation.dtype == np.float32
  np.testing.assert_array_equal(ts.step_type, MID)


def test_atari_preset_life_loss_and_raw_game_score():
  """Episodic life: a life loss is LAST with discount 0 and the game goes on; the
  reported score is the raw score of the whole game, as envpool's info["reward"] sums."""
  import envpool

  seed, n = 1, 2
  env = envs.make_atari("Breakout-v5", n, seed)
  config = env.pool.config
  assert config["episodic_life"] and config["reward_clip"]
  assert (config["stack_num"], config["img_height"], config["noop_max"]) == (4, 84, 30)
  assert env.spec.observation_shape == (4, 84, 84) and env.spec.observation_dtype == "uint8"
  # The same game through envpool's public API, for the raw score.
  ref = envpool.make_gymnasium("Breakout-v5", num_envs=n, seed=seed, **envs.ATARI_TRAIN_KWARGS)
  ts = env.reset()
  ref_obs, _ = ref.reset()
  np.testing.assert_array_equal(ts.observation, ref_obs)
  rng = np.random.default_rng(0)
  raw_score = np.zeros(n)
  life_losses = np.zeros(n, int)
  games = [[] for _ in range(n)]
  prev = ts
  for _ in range(700):
    action = rng.integers(0, env.spec.num_actions, size=n)
    ts = env.step(action)
    obs, reward, term, trunc, info = ref.step(action)
    np.testing.assert_array_equal(ts.observation, obs)
    assert set(np.unique(ts.reward).tolist()) <= {-1.0, 0.0, 1.0}
    raw_score += np.where(prev.step_type == LAST, 0.0, info["reward"])
    terminated = (ts.step_type == LAST) & (ts.discount == 0.0)
    game_over = (ts.step_type == LAST) & (info["terminated"].astype(bool) | trunc)
    life_losses += terminated & ~game_over
    np.testing.assert_array_equal(ts.step_type[prev.step_type == LAST], FIRST)
    for e in np.flatnonzero(game_over):
      games[e].append((raw_score[e], life_losses[e]))
      raw_score[e], life_losses[e] = 0.0, 0
    prev = ts
    if all(games):
      break
  stats = env.pop_episode_stats()
  for e in range(n):
    scores = [g[0] for g in games[e]]
    assert len(scores) >= 1
    np.testing.assert_allclose(stats.episode_return[stats.env_id == e], scores)
    assert all(g[1] == 4 for g in games[e])  # 5 lives: 4 life losses, then game over
  eval_env = envs.make_atari("Breakout-v5", 1, seed, train=False)
  assert eval_env.pool.config["episodic_life"] and not eval_env.pool.config["reward_clip"]


def test_evaluation_serves_after_a_lost_life_as_training_does():
  """envpool presses FIRE at every reset, and with episodic life a lost life is one: in
  training Breakout's ball is served for the agent after each lost life. Evaluation plays
  under the same rule (a policy that never presses FIRE finishes its games), and its scores
  are the raw scores of whole games; the time limit still counts a whole game."""
  noop = np.zeros(2, np.int32)  # never FIRE
  lengths = {}
  for train in (True, False):
    with envs.make_atari("Breakout-v5", 2, 3, train=train, max_episode_steps=2_000) as env:
      env.reset()
      for step in range(2_000):
        env.step(noop)
        stats = env.pop_episode_stats()
        if len(stats.env_id):
          break
      assert step < 500, train  # game over within 5 lives, not the 2,000-step limit
      lengths[train] = stats.episode_length.tolist()
  assert lengths[True] == lengths[False]  # the same games, but for reward clipping
  # Without episodic life (the evaluation pools before), the ball is never served again.
  with envs.make_atari("Breakout-v5", 1, 3, train=False, episodic_life=False,
                       max_episode_steps=600) as env:  # fmt: skip
    env.reset()
    for _ in range(600):
      env.step(noop[:1])
    assert env.pop_episode_stats().episode_length.tolist() == [600]  # truncated


def test_received_arrays_are_never_written_again():
  # The host rollout keeps every step's arrays as envpool returned them and copies them into
  # the unroll's buffers only after the loop; that needs envpool to hand out new arrays
  # on every recv, not views of a buffer it later refills.
  for env in (
      envs.make("CartPole-v1", 6, 0, batch_size=3),
      envs.make_atari("Pong-v5", 4, 0, batch_size=2),
  ):
    rng = np.random.default_rng(0)
    env.async_reset()
    kept, copies = [], []
    for _ in range(60):
      raw = env.recv_raw()
      kept.append(raw)
      copies.append([None if x is None else x.copy() for x in raw])
      env.send(rng.integers(0, env.spec.num_actions, env.batch_size).astype(np.int32))
    for raw, copy in zip(kept, copies, strict=True):
      for x, y in zip(raw, copy, strict=True):
        assert (x is None and y is None) or np.array_equal(x, y)
