"""The compiled backend of `make_rollout` (envpool's XLA interface in one compiled loop)
against the host backend, and the interface both share.

The longer runs of envpool's XLA custom calls run in a subprocess, so that a crash of the
custom call (reported for some jax/envpool builds) fails the test with its signal instead
of killing the test worker.
"""

import os
import pathlib
import pickle
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rollout_checks import assert_batched_columns
from rollout_checks import deterministic_act

from offpolicy_ac import envs

jax.config.update("jax_numpy_rank_promotion", "raise")


def run_script(script, marker, *args, env=None):
  """Runs `script` in a fresh Python process (a crash shows as its signal) and checks
  that it exited 0 and printed `marker`."""
  proc = subprocess.run(
      [sys.executable, "-c", script, *args],
      capture_output=True,
      text=True,
      timeout=300,
      env=env,
  )
  assert proc.returncode == 0 and marker in proc.stdout, (
      f"returncode {proc.returncode} (negative: killed by that signal)\n"
      f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
  )


SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_numpy_rank_promotion", "raise")
    from offpolicy_ac import envs

    def same(a, b):
        la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
        assert len(la) == len(lb)
        for x, y in zip(la, lb):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)

    def det_act(params, obs, key):
        action = (params * (obs[:, 2] + 0.5 * obs[:, 3]) > 0).astype(jnp.int32)
        return action, {"s": obs[:, 2] * 10.0, "pair": (obs[:, :2], action + 1)}

    def compiled(env, act, T):
        return envs.make_rollout(env, act, T, backend="compiled")

    # 1. CartPole: identical to the host loop, unroll by unroll (terminations, truncations).
    T = 6
    xr = compiled(envs.make("CartPole-v1", 3, 4, max_episode_steps=12), det_act, T)
    hr = envs.make_rollout(envs.make("CartPole-v1", 3, 4, max_episode_steps=12), det_act, T)
    p = jnp.float32(-1.0)
    xs, hs = xr.init(p, jax.random.PRNGKey(0)), hr.init(p, jax.random.PRNGKey(0))
    saw_last = False
    prev = None
    for _ in range(5):
        xs, xt, xst = xr.unroll(p, xs)
        hs, ht, hst = hr.unroll(p, hs)
        same((xt, xst), (ht, hst))
        saw_last |= bool((np.asarray(xt.step_type) == envs.LAST).any())
        if prev is not None:
            same(jax.tree.map(lambda x: x[-1], prev), jax.tree.map(lambda x: x[0], xt))
        prev = xt
    assert saw_last and isinstance(xt, envs.Trajectory)

    # 2. Pendulum (float32 continuous): clipped for the env, stored as produced.
    def cont(params, obs, key):
        return jnp.full((obs.shape[0], 1), 5.0), {"mean": jnp.zeros((obs.shape[0], 1))}
    xr = compiled(envs.make("Pendulum-v1", 2, 3), cont, 4)
    hr = envs.make_rollout(envs.make("Pendulum-v1", 2, 3), cont, 4)
    xs, hs = xr.init(None, jax.random.PRNGKey(0)), hr.init(None, jax.random.PRNGKey(0))
    same(xr.unroll(None, xs)[1:], hr.unroll(None, hs)[1:])

    # 2b. Episode returns are the float64 sums of the rewards (fractional, 200 steps an
    # episode), each backend's, with and without batched stepping.
    def uniform(params, obs, key):
        return jax.random.uniform(key, (obs.shape[0], 1), jnp.float32, -2.0, 2.0), {}
    for backend in ("compiled", "host"):
        for batch_size in (3, 2):
            env = envs.make("Pendulum-v1", 3, 5, batch_size=batch_size)
            rollout = envs.make_rollout(env, uniform, 40, backend=backend)
            state, sums, returns = rollout.init(None, jax.random.PRNGKey(2)), np.zeros(3), []
            expected = [[] for _ in range(3)]
            for _ in range(6):
                state, traj, stats = rollout.unroll(None, state)
                step_type, reward = np.asarray(traj.step_type), np.asarray(traj.reward)
                for t in range(1, 41):  # row 0 is the previous unroll's row T
                    for e in range(3):  # column e is environment e
                        sums[e] = 0.0 if step_type[t, e] == envs.FIRST else sums[e]
                        sums[e] += np.float64(reward[t, e])
                        if step_type[t, e] == envs.LAST:
                            expected[e].append(sums[e])
                returns += list(zip(stats.env_id, stats.episode_return))
            got = [[r for e_id, r in returns if e_id == e] for e in range(3)]
            assert [len(g) for g in got] == [len(x) for x in expected] == [1, 1, 1], got
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)

    # 3. Atari preset with a random policy: shapes; same seed twice gives the same data.
    def rand(params, obs, key):
        logits = jnp.zeros((obs.shape[0], 6))
        return jax.random.categorical(key, logits).astype(jnp.int32), {"logits": logits}
    outs = []
    for _ in range(2):
        xr = compiled(envs.make_atari("Pong-v5", 2, 0), rand, 3)
        xs = xr.init(None, jax.random.PRNGKey(1))
        xs, xt, _ = xr.unroll(None, xs)
        assert xt.observation.shape == (4, 2, 4, 84, 84) and xt.observation.dtype == jnp.uint8
        outs.append(xt)
    same(outs[0], outs[1])

    # 4. An out-of-range discrete action is reported (after the compiled unroll).
    def bad(params, obs, key):
        return jnp.full((obs.shape[0],), 7, jnp.int32), {}
    xr = compiled(envs.make("CartPole-v1", 2, 0), bad, 3)
    try:
        xr.init(None, jax.random.PRNGKey(0))
    except ValueError as e:
        assert "out-of-range" in str(e), e
    else:
        raise AssertionError("no error for out-of-range actions")
    print("XLA-OK")
    """)


def test_compiled_rollout_matches_host_rollout_in_subprocess():
  run_script(SCRIPT, "XLA-OK")


BATCHED_SCRIPT = textwrap.dedent("""
    import pickle, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_numpy_rank_promotion", "raise")
    sys.path.insert(0, sys.argv[2])
    from rollout_checks import random_act, run_batched_unrolls
    from offpolicy_ac import envs
    from offpolicy_ac.envs import _rollout_base
    from offpolicy_ac.envs import _xla_rollout as xla_module

    out = {}
    cases = [(6, 2, 7, 1, 1), (5, 3, 7, 1, 1), (5, 3, 1, 1, 1), (5, 3, 7, 0, 1), (6, 2, 7, 1, 0),
             (5, 3, 7, 1, 0)]  # fmt: skip
    for num_envs, batch_size, T, slack, lead in cases:
        # slack 0: the column buffers start with T+1 rows, so they must grow.
        # lead 0: environments with their T+1 rows are parked while a batch stays in flight.
        xla_module._BATCHED_EXTRA_ROWS_PER_STEP = slack
        _rollout_base.MAX_LEAD_ROWS_PER_STEP = lead
        # lead 0: one worker thread, so that envpool returns environments in the order they
        # were sent, which the bound on the lead in run_batched_unrolls assumes.
        threads = {"num_threads": 1} if lead == 0 else {}
        env = envs.make("CartPole-v1", num_envs, 2, batch_size=batch_size,
                        max_episode_steps=10, **threads)
        rollout = envs.make_rollout(env, random_act, T, backend="compiled")
        state = rollout.init(jnp.float32(0), jax.random.PRNGKey(3))
        assert isinstance(state, envs.XlaBatchedRolloutState)
        rows0 = state.pending.step_type.shape[0]
        trajs, stats, state, ahead, parked = run_batched_unrolls(
            rollout, state, jnp.float32(0), 6 if T > 1 else 30, lead == 0
        )
        assert isinstance(state.pending.step_type, jax.Array)
        state, traj, _ = rollout.unroll(jnp.float32(0), state)
        assert isinstance(traj, envs.Trajectory) and isinstance(traj.step_type, np.ndarray)
        if slack == 0:
            assert rows0 == T + 1 < state.pending.step_type.shape[0], "the growth path ran"
        if lead == 0:
            assert parked >= 3, "the parking path ran"
        out[(num_envs, batch_size, T, slack, lead)] = (trajs, stats, state.num_pending, ahead)
    xla_module._BATCHED_EXTRA_ROWS_PER_STEP = 1
    _rollout_base.MAX_LEAD_ROWS_PER_STEP = 1

    # Atari preset, batched stepping: shapes and dtypes.
    def rand(params, obs, key):
        logits = jnp.zeros((obs.shape[0], 6))
        return jax.random.categorical(key, logits).astype(jnp.int32), {"logits": logits}
    env = envs.make_atari("Pong-v5", 4, 0, batch_size=2)
    rollout = envs.make_rollout(env, rand, 3, backend="compiled")
    state = rollout.init(None, jax.random.PRNGKey(1))
    state, traj, _ = rollout.unroll(None, state)
    assert traj.observation.shape == (4, 4, 4, 84, 84) and traj.observation.dtype == jnp.uint8
    assert traj.extras["logits"].shape == (4, 4, 6)
    assert (np.asarray(traj.step_type)[0] == envs.FIRST).all()

    # An out-of-range action is reported after the unroll.
    def bad(params, obs, key):
        return jnp.full((obs.shape[0],), 7, jnp.int32), {}
    env = envs.make("CartPole-v1", 4, 0, batch_size=2)
    rollout = envs.make_rollout(env, bad, 3, backend="compiled")
    try:
        rollout.unroll(None, rollout.init(None, jax.random.PRNGKey(0)))
    except ValueError as e:
        assert "out-of-range" in str(e), e
    else:
        raise AssertionError("no error for out-of-range actions")
    with open(sys.argv[1], "wb") as f:
        pickle.dump(out, f)
    print("XLA-BATCHED-OK")
    """)


def test_compiled_batched_rollout_columns_are_environments_in_subprocess(tmp_path):
  # The checks of the host loop's batched-stepping test (test_rollout.py), on the compiled
  # backend.
  result = tmp_path / "unrolls.pkl"
  run_script(BATCHED_SCRIPT, "XLA-BATCHED-OK", str(result), str(pathlib.Path(__file__).parents[1]))
  with open(result, "rb") as f:
    out = pickle.load(f)
  for (num_envs, batch_size, T, _, lead), (trajs, stats, num_pending, ahead) in out.items():
    if num_envs % batch_size and lead:
      assert ahead >= 1  # the carry-over path ran
    assert_batched_columns(trajs, stats, num_pending, num_envs, T)


def test_compiled_rollout_rejects_unsupported_setups_before_stepping():
  def act(params, obs, key):
    return jnp.zeros((obs.shape[0],), jnp.int32), {}

  with pytest.raises(ValueError, match="unroll_length"):
    envs.make_rollout(envs.make("CartPole-v1", 2, 0), act, 0, backend="compiled")
  with pytest.raises(ValueError, match="backend must be 'host' or 'compiled'"):
    envs.make_rollout(envs.make("CartPole-v1", 2, 0), act, 3, backend="xla")

  def float_action(params, obs, key):
    return jnp.zeros((obs.shape[0],)), {}

  env = envs.make("CartPole-v1", 2, 0)
  rollout = envs.make_rollout(env, float_action, 3, backend="compiled")
  with pytest.raises(ValueError, match="integer dtype"):  # at trace time: before any step
    rollout.init(None, jax.random.PRNGKey(0))


def test_float64_action_tasks_are_refused_by_the_compiled_backend_only():
  def act(params, obs, key):
    return jnp.zeros((obs.shape[0], 3)), {}

  env = envs.make("Hopper-v4", 2, 0)
  with pytest.raises(ValueError, match="float64 actions.*jax_enable_x64"):
    envs.make_rollout(env, act, 3, backend="compiled")
  envs.make_rollout(env, act, 3, backend="host")  # the host loop takes them
  env.close()


def test_tasks_returning_64_bit_arrays_are_refused_by_the_compiled_backend_only():
  # MetaWorld takes float32 actions but returns float64 observations and infos: envpool
  # wrote them into JAX's 32-bit buffers, and the process aborted with corrupted memory.
  def act(params, obs, key):
    return jnp.zeros((obs.shape[0], 4)), {}

  match = r"Reach-v3 returns 64-bit arrays \(obs \(float64\), .* and \d+ more\).*x64"
  with pytest.raises(ValueError, match=match):
    envs.check_compiled_task("MetaWorld/Reach-v3")  # before a run is built, no pool
  env = envs.make("MetaWorld/Reach-v3", 2, 0)
  with pytest.raises(ValueError, match=match):
    envs.make_rollout(env, act, 3, backend="compiled")
  envs.make_rollout(env, act, 3, backend="host")  # the host loop converts them
  env.close()
  assert envs.check_compiled_task("CartPole-v1") == np.int32
  with pytest.raises(ValueError, match="float64 actions"):  # the actions are named first
    envs.check_compiled_task("Hopper-v4")


@pytest.mark.parametrize("batch_size", [4, 2], ids=["whole", "batched"])
@pytest.mark.parametrize("to_device", [False, True])
def test_both_backends_share_one_interface(batch_size, to_device):
  params = jnp.float32(1.0)

  def make(backend):
    env = envs.make("CartPole-v1", 4, 3, batch_size=batch_size, max_episode_steps=7)
    return envs.make_rollout(env, deterministic_act, 5, backend=backend, to_device=to_device)

  compiled, host = make("compiled"), make("host")
  assert (compiled.backend, host.backend) == ("compiled", "host")
  assert compiled.unroll_length == host.unroll_length == 5
  cs = compiled.init(params, jax.random.PRNGKey(0))
  hs = host.init(params, jax.random.PRNGKey(0))
  for _ in range(3):
    cs, ctraj, cstats = compiled.unroll(params, cs)
    hs, htraj, hstats = host.unroll(params, hs)
    assert isinstance(ctraj, envs.Trajectory) and isinstance(htraj, envs.Trajectory)
    assert ctraj.observation.shape == htraj.observation.shape == (6, 4, 4)
    for leaf in jax.tree.leaves((ctraj, htraj)):
      if to_device:
        assert isinstance(leaf, jax.Array) and leaf.devices() == {envs.default_device()}
      else:
        assert isinstance(leaf, np.ndarray)
    if batch_size == 4:  # whole batches: the same steps as the host loop
      for x, y in zip(jax.tree.leaves((ctraj, cstats)), jax.tree.leaves((htraj, hstats))):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
  for rollout, state in ((compiled, cs), (host, hs)):
    # init again receives the actions in flight (parked ones too) and resets: every
    # environment starts over, and the state from before it is stale.
    fresh = rollout.init(params, jax.random.PRNGKey(1))
    with pytest.raises(ValueError, match="stale .*RolloutState"):
      rollout.unroll(params, state)
    for i in range(2):
      fresh, traj, _ = rollout.unroll(params, fresh)
      if i == 0:
        np.testing.assert_array_equal(np.asarray(traj.step_type)[0], envs.FIRST)
    rollout.env.close()


@pytest.mark.parametrize("backend", ["host", "compiled"])
def test_init_again_after_parking_restarts_every_environment(backend, monkeypatch):
  from offpolicy_ac.envs import _rollout_base

  monkeypatch.setattr(_rollout_base, "MAX_LEAD_ROWS_PER_STEP", 0)  # park at once
  env = envs.make("CartPole-v1", 5, 0, batch_size=2)
  rollout = envs.make_rollout(env, deterministic_act, 5, backend=backend)
  state = rollout.init(jnp.float32(1.0), jax.random.PRNGKey(0))
  for _ in range(3):
    state, _, _ = rollout.unroll(jnp.float32(1.0), state)
  assert state.parked is not None  # some environments are held back, not in flight
  assert env.num_in_flight == env.num_envs - state.parked[0].shape[0]
  fresh = rollout.init(jnp.float32(1.0), jax.random.PRNGKey(1))
  with pytest.raises(ValueError, match="stale .*RolloutState"):
    rollout.unroll(jnp.float32(1.0), state)
  _, traj, _ = rollout.unroll(jnp.float32(1.0), fresh)
  np.testing.assert_array_equal(np.asarray(traj.step_type)[0], envs.FIRST)
  env.close()


def test_default_device_follows_the_jax_setting():
  assert envs.default_device() == jax.local_devices()[0]
  with jax.default_device(jax.local_devices(backend="cpu")[0]):
    assert envs.default_device() == jax.local_devices(backend="cpu")[0]


PLACEMENT_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from offpolicy_ac import envs

    # The learner's device is not the first CPU device (as a GPU would not be): the
    # compiled loop still runs on the first CPU device, with the parameters copied there,
    # and `to_device` moves the trajectories to the default device.
    first_cpu = jax.local_devices(backend="cpu")[0]
    other = [d for d in jax.devices() if d != first_cpu][0]  # the GPU, or the second CPU
    jax.config.update("jax_default_device", other)
    assert other != first_cpu

    def act(params, obs, key):
        action = (params["w"] * obs[:, 2] > 0).astype(jnp.int32)
        return action, {"v": params["w"] * obs[:, 0]}

    params = jax.device_put({"w": jnp.float32(1.0)}, other)
    assert envs.default_device() == other
    for batch_size in (4, 2):  # whole batches, batched stepping
        env = envs.make("CartPole-v1", 4, 0, batch_size=batch_size, max_episode_steps=9)
        host = envs.make_rollout(envs.make("CartPole-v1", 4, 0, batch_size=batch_size,
                                           max_episode_steps=9), act, 5)
        rollout = envs.make_rollout(env, act, 5, backend="compiled", to_device=True)
        state = rollout.init(params, jax.device_put(jax.random.PRNGKey(0), other))
        hstate = host.init(params, jax.random.PRNGKey(0))
        for _ in range(3):
            state, traj, _ = rollout.unroll(params, state)
            hstate, htraj, _ = host.unroll(params, hstate)
            for leaf in jax.tree.leaves(state):
                if isinstance(leaf, jax.Array):
                    assert leaf.devices() == {first_cpu}, leaf.devices()
            for leaf in jax.tree.leaves(traj):
                assert leaf.devices() == {other}, leaf.devices()
            if batch_size == 4:  # whole batches: identical to the host loop
                for x, y in zip(jax.tree.leaves(traj), jax.tree.leaves(htraj)):
                    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)
    print("XLA-PLACEMENT-OK")
    """)


def test_compiled_rollout_runs_on_the_cpu_when_the_default_device_is_another():
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  run_script(PLACEMENT_SCRIPT, "XLA-PLACEMENT-OK", env=env)
