"""Rollouts on real envpool environments: indexing, boundaries, async per-env columns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import envs
from offpolicy_ac.envs import FIRST, LAST, MID
from offpolicy_ac.envs import _rollout as rollout_module

jax.config.update("jax_numpy_rank_promotion", "raise")

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
    state = rollout.init(key)
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


def test_sync_rollout_equals_manual_stepping():
    n, T, k, params = 3, 6, 5, -1.0  # falls within about 10 steps: terminations
    rollout = envs.make_rollout(
        envs.make("CartPole-v1", n, 4, max_episode_steps=12), deterministic_act, T
    )
    trajs, stats, _ = run_unrolls(rollout, jnp.float32(params), jax.random.PRNGKey(0), k)
    for traj in trajs:
        assert traj.observation.shape == (T + 1, n, 4) and traj.step_type.shape == (T + 1, n)
        assert traj.extras["pair"][0].shape == (T + 1, n, 2)
    assert_boundaries_shared(trajs)
    got = stream(trajs)

    env = envs.make("CartPole-v1", n, 4, max_episode_steps=12)
    ts = env.reset()
    steps = []
    act = jax.jit(deterministic_act)
    for t in range(k * T + 1):
        action, extras = np_tree(act(jnp.float32(params), ts.observation, None))
        steps.append(envs.Trajectory(*ts, action=action, extras=extras))
        if t < k * T:
            ts = env.step(action)
    want = jax.tree.map(lambda *x: np.stack(x), *steps)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-6)
    assert (got.step_type == LAST).any() and (got.discount == 0).any()
    want_stats = env.pop_episode_stats()
    for x, y in zip(stats, want_stats, strict=True):
        np.testing.assert_array_equal(x, y)


def test_same_seed_same_data_sync():
    def go(seed):
        env = envs.make("CartPole-v1", 4, 1, max_episode_steps=9)
        trajs, stats, _ = run_unrolls(
            envs.make_rollout(env, random_act, 6), jnp.float32(0), jax.random.PRNGKey(seed), 3
        )
        return trajs, stats

    (a, sa), (b, sb), (c, _) = go(0), go(0), go(1)
    for x, y in zip(jax.tree.leaves((a, sa)), jax.tree.leaves((b, sb)), strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(stream(a).action, stream(c).action)


def run_async_unrolls(rollout, state, params, k, park_at_boundary, env=None):
    """Runs k unrolls of an async rollout (host loop or jitted). Checks after each one that
    a parked action is the stored action of that environment's newest step (and, given the
    env of a host loop, that parked environments are not in flight), and with
    `park_at_boundary` (lead 0) that no column carries more than a round of batches.
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
            # The jitted rollout keeps its pending rows in a ring buffer.
            slot = (getattr(state, "pending_offset", 0) + newest) % pending_action.shape[0]
            np.testing.assert_array_equal(action, pending_action[slot, ids])
            if env is not None:
                assert env.num_in_flight == num_envs - ids.shape[0]
        if park_at_boundary:  # parked at T+1 unless a batch had to stay in flight
            batch_size = rollout.env.spec.batch_size
            assert int(state.num_pending.max()) <= 1 + -(-num_envs // batch_size)
    return trajs, envs.EpisodeStats.concatenate(stats), state, ahead, parked


def assert_async_columns(trajs, stats, num_pending, num_envs, T):
    """Checks unrolls of an async rollout of CartPole with `random_act`: column b is
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


@pytest.mark.parametrize(
    "num_envs, batch_size, T, lead",
    [(6, 2, 7, 1), (5, 3, 7, 1), (5, 3, 1, 1), (6, 2, 7, 0), (5, 3, 7, 0)],
    ids=["6x2", "5x3", "5x3-T1", "6x2-park", "5x3-park"],
)
def test_async_rollout_columns_are_environments(num_envs, batch_size, T, lead, monkeypatch):
    # With 5 envs in batches of 3 some environments get ahead (the steps carried over to the
    # next unroll), then start the next unroll's buffers; T = 1 is the shortest unroll.
    # lead 0 parks every environment that has its T+1 rows, whenever a batch stays in flight.
    monkeypatch.setattr(rollout_module, "_MAX_LEAD_ROWS_PER_STEP", lead)
    k = 6 if T > 1 else 30
    env = envs.make("CartPole-v1", num_envs, 2, batch_size=batch_size, max_episode_steps=10)
    rollout = envs.make_rollout(env, random_act, T)
    state = rollout.init(jax.random.PRNGKey(3))
    trajs, stats, state, ahead, parked = run_async_unrolls(
        rollout, state, jnp.float32(0), k, lead == 0, env
    )
    if num_envs % batch_size and lead:
        assert ahead >= 1  # the carry-over path ran
    if lead == 0:
        assert parked >= k // 2  # the parking path ran
    assert state.pending.observation.shape[1] == num_envs
    assert_async_columns(trajs, stats, state.num_pending, num_envs, T)


def test_async_deterministic_policy_is_reproducible():
    def go():
        env = envs.make("CartPole-v1", 4, 9, batch_size=2, max_episode_steps=8)
        trajs, _, _ = run_unrolls(
            envs.make_rollout(env, deterministic_act, 5), jnp.float32(1), jax.random.PRNGKey(0), 4
        )
        return stream(trajs)

    a, b = go(), go()
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def test_loss_inputs_by_hand_and_on_a_rollout():
    step_type = np.array([[FIRST], [MID], [LAST], [FIRST], [MID]], np.int32)
    traj = envs.Trajectory(
        step_type=step_type,
        reward=np.array([[0.0], [1.0], [2.0], [0.0], [3.0]], np.float32),
        discount=np.array([[1.0], [1.0], [0.0], [1.0], [1.0]], np.float32),
        observation=np.zeros((5, 1, 2)), env_id=np.zeros((5, 1), np.int32),
        action=np.zeros((5, 1), np.int32), extras={},
    )  # fmt: skip
    for fn in (envs.loss_inputs, jax.jit(envs.loss_inputs, static_argnums=1)):
        out = fn(traj, 0.9)
        np.testing.assert_allclose(out.r_t[:, 0], [1.0, 2.0, 0.0, 3.0])
        np.testing.assert_allclose(out.discount_t[:, 0], [0.9, 0.0, 0.9, 0.9], rtol=1e-6)
        np.testing.assert_array_equal(out.mask[:, 0], [True, True, False, True])
    with pytest.raises(ValueError, match="gamma"):
        envs.loss_inputs(traj, 1.5)
    with pytest.raises(ValueError, match="T\\+1 >= 2"):
        envs.loss_inputs(jax.tree.map(lambda x: x[:1], traj))

    env = envs.make("CartPole-v1", 3, 0, max_episode_steps=6)
    state = (rollout := envs.make_rollout(env, random_act, 8)).init(jax.random.PRNGKey(0))
    state, traj, _ = rollout.unroll(jnp.float32(0), state)
    inputs = envs.loss_inputs(traj)
    assert inputs.mask.shape == inputs.r_t.shape == inputs.discount_t.shape == (8, 3)
    masked = ~np.asarray(inputs.mask)
    assert masked.any()
    np.testing.assert_array_equal(np.asarray(traj.step_type)[1:][masked], FIRST)
    np.testing.assert_array_equal(np.asarray(inputs.r_t)[masked], 0.0)


def test_continuous_rollout_stores_the_policy_action_and_env_gets_it_clipped():
    def act(params, obs, key):
        return jnp.full((obs.shape[0], 1), 5.0), {"mean": jnp.zeros((obs.shape[0], 1))}

    rollout = envs.make_rollout(envs.make("Pendulum-v1", 2, 3), act, 4, to_device=False)
    state = rollout.init(jax.random.PRNGKey(0))
    state, traj, _ = rollout.unroll(None, state)
    assert isinstance(traj.observation, np.ndarray)
    np.testing.assert_array_equal(traj.action, 5.0)
    twin = envs.make("Pendulum-v1", 2, 3)
    ts = twin.reset()
    for t in range(1, 5):
        ts = twin.step(np.full((2, 1), 2.0, np.float32))
        np.testing.assert_array_equal(traj.observation[t], ts.observation)


def test_atari_rollout_shapes_and_dtypes():
    env = envs.make_atari("Pong-v5", 2, 0)

    def act(params, obs, key):
        logits = jnp.zeros((obs.shape[0], env.spec.num_actions))
        return jax.random.categorical(key, logits).astype(jnp.int32), {"logits": logits}

    rollout = envs.make_rollout(env, act, 3)
    state = rollout.init(jax.random.PRNGKey(0))
    state, traj, stats = rollout.unroll(None, state)
    assert traj.observation.shape == (4, 2, 4, 84, 84) and traj.observation.dtype == jnp.uint8
    assert traj.extras["logits"].shape == (4, 2, 6)
    np.testing.assert_array_equal(np.asarray(traj.step_type)[0], FIRST)
    assert stats.env_id.shape == (0,)


def test_bad_rollout_use_raises():
    env = envs.make("CartPole-v1", 2, 0)
    with pytest.raises(ValueError, match="unroll_length must be >= 1"):
        envs.make_rollout(env, random_act, 0)
    with pytest.raises(ValueError, match="EnvPoolEnv"):
        envs.make_rollout("CartPole-v1", random_act, 3)
    with pytest.raises(ValueError, match="callable"):
        envs.make_rollout(env, None, 3)
    rollout = envs.make_rollout(env, random_act, 3)
    state = rollout.init(jax.random.PRNGKey(0))
    new_state, _, _ = rollout.unroll(jnp.float32(0), state)
    with pytest.raises(ValueError, match="stale RolloutState"):
        rollout.unroll(jnp.float32(0), state)
    rollout.unroll(jnp.float32(0), new_state)  # the live one still works

    def float_actions(params, obs, key):
        return jnp.zeros((obs.shape[0],)), {}

    bad = envs.make_rollout(envs.make("CartPole-v1", 2, 0), float_actions, 3)
    with pytest.raises(ValueError, match="integer dtype"):
        bad.unroll(None, bad.init(jax.random.PRNGKey(0)))

    def out_of_range(params, obs, key):
        return jnp.full((obs.shape[0],), 7, jnp.int32), {}

    bad = envs.make_rollout(envs.make("CartPole-v1", 2, 0), out_of_range, 3)
    with pytest.raises(ValueError, match=r"must be in \[0, 2\)"):
        bad.unroll(None, bad.init(jax.random.PRNGKey(0)))

    def bad_extras(params, obs, key):
        return jnp.zeros((obs.shape[0],), jnp.int32), {"x": jnp.zeros((3,))}

    bad = envs.make_rollout(envs.make("CartPole-v1", 2, 0), bad_extras, 3)
    with pytest.raises(ValueError, match="leading batch axis of 2"):
        bad.unroll(None, bad.init(jax.random.PRNGKey(0)))


def test_furthest_ahead_holds_the_leaders_within_the_budget():
    count = np.array([3, 9, 5, 12, 9])
    batch = np.array([1, 2, 3, 4])
    # Envs 1, 3, 4 have >= 9 rows; furthest first (env 3), ties in batch order (1 before 4).
    np.testing.assert_array_equal(rollout_module.furthest_ahead(batch, count, 9, 5), [2, 0, 3])
    np.testing.assert_array_equal(rollout_module.furthest_ahead(batch, count, 9, 2), [2, 0])
    assert rollout_module.furthest_ahead(batch, count, 9, 0).size == 0
    assert rollout_module.furthest_ahead(batch, count, 13, 4).size == 0


def test_parked_actions_send_the_rest_and_keep_the_held():
    parked, sent = rollout_module.ParkedActions(), []
    assert parked.state() is None and parked.count == 0
    send = lambda action, env_id: sent.append((action.tolist(), env_id.tolist()))  # noqa: E731
    parked.hold(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40]), np.array([2, 0]), send)
    parked.hold(np.array([0, 5]), np.array([50, 60]), np.array([0, 1]), send)  # all held
    assert sent == [([20, 40], [2, 4])]  # nothing sent when the whole batch is held
    env_id, action = parked.state()
    np.testing.assert_array_equal(env_id, [3, 1, 0, 5])
    np.testing.assert_array_equal(action, [30, 10, 50, 60])
    assert parked.count == 4
