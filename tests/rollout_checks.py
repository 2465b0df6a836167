"""Shared checks of rollouts over CartPole (host and compiled backend tests)."""

import jax
import jax.numpy as jnp
import numpy as np

from offpolicy_ac import envs
from offpolicy_ac.envs import FIRST
from offpolicy_ac.envs import LAST

TAU = 0.02


def follows(prev_obs, obs):
  """CartPole: `obs` is the successor of `prev_obs` in the same environment."""
  x_ok = np.abs(obs[..., 0] - (prev_obs[..., 0] + TAU * prev_obs[..., 1])) < 1e-5
  th_ok = np.abs(obs[..., 2] - (prev_obs[..., 2] + TAU * prev_obs[..., 3])) < 1e-5
  return x_ok & th_ok


def deterministic_act(params, obs, key):
  """Pushes towards the pole (params > 0) or away (< 0); extras: a pytree from obs."""
  del key
  action = (params * (obs[:, 2] + 0.5 * obs[:, 3]) > 0).astype(jnp.int32)
  return action, {"score": obs[:, 2] * 10.0, "pair": (obs[:, :2], action + 1)}


def random_act(params, obs, key):
  u = jax.random.uniform(key, (obs.shape[0],))
  return (u > 0.5).astype(jnp.int32), {"u": u, "logits": jnp.zeros((obs.shape[0], 2)) + params}


def np_tree(x):
  return jax.tree.map(np.asarray, x)


def stream(trajs):
  """Concatenates unrolls [T+1, ...] sharing boundaries into one [K*T+1, ...] stream."""
  parts = [jax.tree.map(lambda x: x[:-1], t) for t in trajs[:-1]] + [trajs[-1]]
  return jax.tree.map(lambda *x: np.concatenate(x), *parts)


def run_unrolls(rollout, params, key, k):
  state = rollout.init(params, key)
  trajs, stats = [], []
  for _ in range(k):
    state, traj, st = rollout.unroll(params, state)
    trajs.append(np_tree(traj))
    stats.append(st)
  return trajs, envs.EpisodeStats.concatenate(stats), state


def assert_boundaries_shared(trajs):
  for a, b in zip(trajs[:-1], trajs[1:], strict=True):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
      np.testing.assert_array_equal(x[-1], y[0])


def run_batched_unrolls(rollout, state, params, k, park_at_boundary, env=None):
  """Runs k unrolls of a rollout with batched stepping (either backend). Checks after each
  one that a parked action is the stored action of that environment's newest step (and,
  given the env of a host loop, that parked environments are not in flight), and with
  `park_at_boundary` (lead 0, and a pool with one worker thread, which returns environments
  in the order they were sent) that no column carries more than a round of batches.
  Returns (trajs, EpisodeStats, state, largest lead, number of unrolls that parked)."""
  num_envs = state.num_pending.shape[0]
  trajs, stats, ahead, parked = [], [], 0, 0
  for _ in range(k):
    state, traj, st = rollout.unroll(params, state)
    trajs.append(np_tree(traj))
    stats.append(st)
    ahead = max(ahead, int(state.num_pending.max()) - 1)
    if state.parked is not None:
      parked += 1
      ids, action = state.parked
      newest = state.num_pending[ids] - 1
      pending_action = np.asarray(state.pending.action)
      # The compiled backend keeps its pending rows in a ring buffer.
      slot = (getattr(state, "pending_offset", 0) + newest) % pending_action.shape[0]
      np.testing.assert_array_equal(action, pending_action[slot, ids])
      if env is not None:
        assert env.num_in_flight == num_envs - ids.shape[0]
    if park_at_boundary:  # parked at T+1 unless a batch had to stay in flight
      batch_size = rollout.env.spec.batch_size
      assert int(state.num_pending.max()) <= 1 + -(-num_envs // batch_size)
  return trajs, envs.EpisodeStats.concatenate(stats), state, ahead, parked


def assert_batched_columns(trajs, stats, num_pending, num_envs, T):
  """Checks unrolls of CartPole with batched stepping and `random_act`: column b is
  environment b, steps follow each other, FIRST after LAST, statistics per env_id."""
  assert_boundaries_shared(trajs)
  s = stream(trajs)
  assert s.observation.shape == (len(trajs) * T + 1, num_envs, 4)
  np.testing.assert_array_equal(s.env_id, np.broadcast_to(np.arange(num_envs), s.env_id.shape))
  # Action and behaviour outputs stay aligned through the per-env scatter.
  np.testing.assert_array_equal(s.action, (s.extras["u"] > 0.5).astype(np.int32))
  prev, cur = slice(None, -1), slice(1, None)
  after_last = s.step_type[prev] == LAST
  np.testing.assert_array_equal(s.step_type[cur][after_last], FIRST)
  np.testing.assert_array_equal(s.reward[cur][after_last], 0.0)
  np.testing.assert_array_equal(s.step_type[cur][~after_last] != FIRST, True)
  # Consecutive rows of a column are consecutive steps of one environment.
  assert follows(s.observation[prev], s.observation[cur])[~after_last].all()
  assert not follows(s.observation[prev], s.observation[cur])[after_last].any()
  assert (s.step_type == LAST).sum() >= num_envs
  # Episode statistics per env_id agree with the columns.
  for e in range(num_envs):
    col = s.step_type[:, e]
    firsts, lasts = np.flatnonzero(col == FIRST), np.flatnonzero(col == LAST)
    lengths = [end - start for start, end in zip(firsts, lasts, strict=False)]
    got = stats.episode_length[stats.env_id == e]
    np.testing.assert_array_equal(got[: len(lengths)], lengths)
    assert len(got) in (len(lengths), len(lengths) + 1)  # + one finished in the overflow
  assert num_pending.min() >= 1
