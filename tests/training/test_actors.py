"""Actor-learner workflows: actor threads, policy lag, back-pressure, failures, signals,
and synchronous pools with slow-worker tolerance.

Unit tests drive `Actors` and the sources (`training/sources.py`) with fake rollouts that
record the parameters they unrolled with; loop tests run the experiment scripts
(in-process, each in a thread with a timeout so a hang fails instead of blocking;
the signal test in a subprocess, as a user would).
"""

import dataclasses
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time
import types

import jax
import numpy as np
import pytest

from offpolicy_ac import demos as demos_lib
from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.cli import parse_args
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import make_training_rollout
from offpolicy_ac.training import read_metrics
from offpolicy_ac.training.actors import ActorError
from offpolicy_ac.training.actors import Actors
from offpolicy_ac.training.actors import ParamStore
from offpolicy_ac.training.sources import POOLS
from offpolicy_ac.training.sources import make_source
from offpolicy_ac.training.sources import pool_seed

ROOT = pathlib.Path(__file__).parents[2]
EXPERIMENTS = ROOT / "experiments"
NUM_ENVS, T = 2, 2  # fake rollouts: trajectories [T+1, NUM_ENVS]


# -- fakes -------------------------------------------------------------------


class FakeEnv:

  def __init__(self):
    self.closed = 0

  def close(self):
    self.closed += 1


class FakeRollout:
  """`unroll` records its parameters ({"v": version}); the trajectory holds the
  actor id and the version it was unrolled with, one value per [T+1, NUM_ENVS] cell."""

  def __init__(self, actor_id=0, sleep_s=0.0, fail_at=None, gate=None):
    self.actor_id, self.sleep_s, self.fail_at, self.gate = actor_id, sleep_s, fail_at, gate
    self.env = FakeEnv()
    self.used = []
    self.in_unroll = threading.Event()

  def init(self, params, key):
    del params, key
    return 0

  def unroll(self, params, state):
    self.in_unroll.set()
    n = state + 1
    if self.fail_at == n:
      raise ValueError(f"boom at unroll {n}")
    if self.gate is not None:
      assert self.gate.wait(10.0), "gate never opened"
    time.sleep(self.sleep_s)
    self.used.append(params["v"])
    self.in_unroll.clear()
    traj = {
        "actor": np.full((T + 1, NUM_ENVS), self.actor_id),
        "version": np.full((T + 1, NUM_ENVS), params["v"]),
        "statistics": np.full((T + 1, NUM_ENVS), params.get("statistics", 0)),
    }
    stats = types.SimpleNamespace(episode_return=np.zeros(0), episode_length=np.zeros(0))
    return n, traj, stats


def _keys(k):
  return list(jax.random.split(jax.random.PRNGKey(0), k))


def _wait_for(cond, timeout=10.0):
  deadline = time.monotonic() + timeout
  while not cond():
    if time.monotonic() > deadline:
      raise AssertionError("condition not reached in time")
    time.sleep(0.005)


def _get(actors, timeout=10.0):
  """The next item (fails if none comes within `timeout`)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    item = actors.get(timeout=0.05)
    if item is not None:
      return item
  raise AssertionError("no trajectory in time")


def _never():
  return False


def _source(config, rollouts):
  """An actor-thread source whose pools are the given fake rollouts (in actor order)."""
  pending = list(rollouts)

  def rollout_factory(act, config_, seed, to_device):
    assert config_ is config and to_device is False
    return pending.pop(0)

  return make_source(
      None, config, seed=0, segment=0, process=0, acting={"v": 0}, version=0,
      rollout_factory=rollout_factory, to_device=False,
  )  # fmt: skip


def _actor_threads():
  return [t for t in threading.enumerate() if t.name.startswith("actor-") and t.is_alive()]


# -- Actors: parameters, versions, back-pressure, failures ------------------


def test_actors_reject_bad_arguments():
  with pytest.raises(ValueError, match="queue_size"):
    Actors([FakeRollout()], _keys(1), {"v": 0}, queue_size=0)
  with pytest.raises(ValueError, match="one key per rollout"):
    Actors([FakeRollout(), FakeRollout()], _keys(1), {"v": 0})
  with pytest.raises(ValueError, match="one key per rollout"):
    Actors([], [], {"v": 0})


def test_each_trajectory_is_tagged_with_the_version_of_its_parameters():
  rollouts = [FakeRollout(0), FakeRollout(1)]
  actors = Actors(rollouts, _keys(2), {"v": 0}, queue_size=2)
  try:
    for version in range(1, 6):
      actors.publish({"v": version}, version)
      while True:  # stale items first, then the new version reaches the actors
        item = _get(actors)
        assert (item.traj["version"] == item.version).all()
        assert (item.traj["actor"] == item.actor_id).all()
        assert item.version <= version
        if item.version == version:
          break
  finally:
    actors.close()
  assert {r.env.closed for r in rollouts} == {1}


def test_publish_never_blocks_and_the_next_unroll_uses_the_new_version():
  gate = threading.Event()
  rollout = FakeRollout(gate=gate)
  actors = Actors([rollout], _keys(1), {"v": 0}, queue_size=1)
  try:
    assert rollout.in_unroll.wait(5.0)  # the actor is mid-unroll (blocked on the gate)
    start = time.monotonic()
    actors.publish({"v": 1}, 1)
    assert time.monotonic() - start < 3.0  # not the 10 s the gate could hold
    gate.set()
    first, second = _get(actors), _get(actors)
    assert (first.version, second.version) == (0, 1)
    assert rollout.used[:2] == [0, 1]
  finally:
    gate.set()
    actors.close()


def test_param_store_wait_newer_returns_none_once_stopped():
  store, stop = ParamStore({"v": 3}, 3), threading.Event()
  assert store.wait_newer(2, stop) == ({"v": 3}, 3)
  stop.set()
  start = time.monotonic()
  assert store.wait_newer(3, stop) is None
  assert time.monotonic() - start < 3.0


def test_full_queue_bounds_the_unrolls_and_close_returns_promptly():
  rollouts = [FakeRollout(0), FakeRollout(1)]
  actors = Actors(rollouts, _keys(2), {"v": 0}, queue_size=3)
  bound = 3 + 2  # the queue, plus one item held by each blocked actor
  try:
    _wait_for(lambda: sum(actors.unrolls) >= bound)
    time.sleep(0.5)  # fast actors with no consumer: nothing more may be unrolled
    assert sum(actors.unrolls) == bound
  finally:
    start = time.monotonic()
    actors.close()
    took = time.monotonic() - start
  assert took < 10.0  # well under the 60 s join bound: nobody waited it out
  assert not _actor_threads()
  assert [r.env.closed for r in rollouts] == [1, 1]


@pytest.mark.parametrize("gated", [False, True])
def test_an_actor_crash_raises_actor_error_naming_it(gated):
  rollouts = [FakeRollout(0), FakeRollout(1, fail_at=3)]
  actors = Actors(rollouts, _keys(2), {"v": 0}, queue_size=2, gated=gated)
  start, version = time.monotonic(), 0
  try:
    with pytest.raises(ActorError) as info:
      while time.monotonic() - start < 10.0:
        if actors.get(timeout=0.05) is not None and gated:
          version += 1
          actors.publish({"v": version}, version)
    assert time.monotonic() - start < 10.0
    assert "actor 1" in str(info.value)
    assert "boom at unroll 3" in str(info.value)
  finally:
    actors.close()
  assert not _actor_threads()
  assert rollouts[1].env.closed == 1


def test_gated_actors_unroll_once_per_version():
  rollouts = [FakeRollout(0), FakeRollout(1)]
  actors = Actors(rollouts, _keys(2), {"v": 0}, queue_size=4, gated=True)
  try:
    items = sorted((_get(actors), _get(actors)), key=lambda it: it.actor_id)
    assert [(it.actor_id, it.version) for it in items] == [(0, 0), (1, 0)]
    assert actors.get(timeout=0.3) is None  # waiting for a newer version
    assert actors.unrolls == [1, 1]
    actors.publish({"v": 1}, 1)
    items = [_get(actors), _get(actors)]
    assert sorted((it.actor_id, it.version) for it in items) == [(0, 1), (1, 1)]
    assert [r.used for r in rollouts] == [[0, 1], [0, 1]]
  finally:
    actors.close()


# -- _ActorSource: policy lag, slow pools -----------------------------------


def _async_config(**kwargs):
  return TrainConfig.of(
      num_envs=NUM_ENVS, unroll_length=T, actors="async", num_actors=2, actor_queue_size=2,
      **kwargs,
  )  # fmt: skip


@pytest.mark.parametrize(
    "max_policy_lag, dropped, lag", [(None, 0, 5.0), (5, 0, 5.0), (4, 4, 0.0), (0, 4, 0.0)]
)
def test_async_source_drops_trajectories_older_than_max_policy_lag(max_policy_lag, dropped, lag):
  source = _source(_async_config(max_policy_lag=max_policy_lag), [FakeRollout(0), FakeRollout(1)])
  try:
    got = source.collect({"v": 0}, 0, _never)
    assert (got.traj["version"] == 0).all() and got.discarded == 0
    assert got.policy_lag == 0.0 and got.env_steps == T * NUM_ENVS
    # Queue (2) full of version-0 trajectories plus one held by each blocked actor.
    _wait_for(lambda: sum(source.actors.unrolls) >= 5)
    got = source.collect({"v": 5}, 5, _never)  # 5 updates later
    # The two queued stale trajectories are always dropped; whether the two held by
    # the blocked actors come before an actor's first fresh one is up to the threads.
    assert (2 <= got.discarded <= dropped) if dropped else got.discarded == 0
    assert got.policy_lag == lag
    assert (got.traj["version"] == 5 - lag).all()
    assert got.env_steps == (got.discarded + 1) * T * NUM_ENVS  # dropped ones count
    assert len(got.stats) == got.discarded + 1
  finally:
    source.close()


def test_async_source_stops_dropping_at_its_budget():
  """Every trajectory stale: once the dropped ones' steps reach the budget (the steps left
  to the next log point), collect hands over none, not a stop (it went on dropping, and
  the iteration ran past the point)."""
  source = _source(_async_config(max_policy_lag=0), [FakeRollout(0), FakeRollout(1)])
  try:
    source.collect({"v": 0}, 0, _never)
    _wait_for(lambda: sum(source.actors.unrolls) >= 5)
    got = source.collect({"v": 5}, 5, _never, budget=2 * T * NUM_ENVS)
    assert got.short and got.traj is None and got.policy_lag is None
    assert got.discarded == 2 and got.env_steps == 2 * T * NUM_ENVS
  finally:
    source.close()


def test_async_runs_that_drop_trajectories_keep_their_budget_and_log_points(tmp_path):
  """Lag 0 with 4 actors drops most trajectories: each line still lands at its point and
  the run ends at its budget (it trained 4,864 steps of 4,096, logging at 2,560 and
  4,864), an iteration whose trajectories were all dropped logging them with no update
  and no policy lag."""
  module = _script("impala")
  args = module.Args()
  train = args.train.replace(actors="async", num_actors=4, max_policy_lag=0,
                             total_env_steps=4096, log_every=1024, eval_every=0)  # fmt: skip
  result = module.run(dataclasses.replace(args, run_dir=str(tmp_path), train=train))
  assert result.env_steps == 4096
  lines = read_metrics(tmp_path)
  assert [l["env_steps"] for l in lines] == [1024, 2048, 3072, 4096]
  assert sum(l["dropped_trajectories"] for l in lines) > 0
  for line in lines:
    assert (line.get("loss") is None) == ("policy_lag" not in line)


def test_async_source_sends_new_observation_statistics_without_an_update():
  """An off-policy agent makes no update while its replay fills, but its observation
  statistics grow with every unroll: the actors act on the learner's newest (as the
  inline and pools sources do), not on the initial ones until the first update."""
  source = _source(_async_config(), [FakeRollout(0), FakeRollout(1)])
  try:
    got = source.collect({"v": 0}, 0, _never)
    for _ in range(20):  # the queued and held trajectories of the initial statistics first
      got = source.collect({"v": 0, "statistics": 1}, 0, _never)
      if (got.traj["statistics"] == 1).all():
        break
    assert (got.traj["statistics"] == 1).all() and got.policy_lag == 0.0
  finally:
    source.close()


def test_async_source_returns_none_when_asked_to_stop():
  gate = threading.Event()  # actors never finish an unroll
  source = _source(_async_config(), [FakeRollout(0, gate=gate), FakeRollout(1, gate=gate)])
  try:
    start = time.monotonic()
    got = source.collect({"v": 0}, 0, lambda: time.monotonic() - start > 0.2)
    assert got.traj is None and time.monotonic() - start < 2.0
  finally:
    gate.set()
    source.close()


def _sync_config(pools, min_pools=0, grace_period_s=0.5):
  return TrainConfig.of(
      num_envs=NUM_ENVS,
      unroll_length=T,
      actors="pools",
      num_actors=pools,
      min_pools=min_pools,
      grace_period_s=grace_period_s,
  )


def test_sync_source_concatenates_every_pool_in_actor_order():
  source = _source(_sync_config(3), [FakeRollout(i) for i in range(3)])
  deadline = time.monotonic() + 10.0
  stop = lambda: time.monotonic() > deadline  # a hang fails instead of blocking
  try:
    for version in (0, 1, 7, 7, 7):  # 7 three times: iterations without an update
      got = source.collect({"v": version}, version, stop)
      assert got.traj is not None, f"collect hung at version {version}"
      assert got.traj["actor"].shape == (T + 1, 3 * NUM_ENVS)
      assert got.traj["actor"][0].tolist() == [0, 0, 1, 1, 2, 2]
      assert (got.traj["version"] == version).all()
      assert got.discarded == 0 and got.env_steps == 3 * T * NUM_ENVS
      assert len(got.stats) == 3
  finally:
    source.close()


def test_pool_seeds_never_share_an_environment_between_runs_evaluations_or_actors():
  """envpool seeds environment i with `pool seed + i`: pools of neighbouring seeds shared
  environments (seed 0's environment 1 was seed 1's environment 0, its evaluation pool
  seed + 7's training environments), so `--seed 0..4` were not five independent runs."""
  width = 256  # environments per pool: far more than any run here uses
  pools = [pool_seed(seed, pool, segment=segment, process=process, actor=actor)
           for seed in range(8) for pool in POOLS for segment in range(4)
           for process in range(2) for actor in range(3)]  # fmt: skip
  assert all(0 <= s and s + width < 2**31 for s in pools)
  ranges = sorted(pools)
  assert all(b - a > width for a, b in zip(ranges, ranges[1:]))  # no two overlap
  assert pool_seed(3, "training", segment=1) == pool_seed(3, "training", segment=1)
  with pytest.raises(ValueError, match="pool 'train'"):
    pool_seed(0, "train")
  with pytest.raises(ValueError, match="ints >= 0"):
    pool_seed(0, "training", segment=-1)


@pytest.mark.parametrize("threads", [False, True])
def test_a_sources_pools_are_seeded_by_pool_seed(threads):
  seeds = []

  def rollout_factory(act, config_, seed, to_device):
    seeds.append(seed)
    return FakeRollout(len(seeds) - 1)

  config = _sync_config(2) if threads else TrainConfig.of(num_envs=NUM_ENVS, unroll_length=T)
  source = make_source(None, config, seed=5, segment=3, process=1, acting={"v": 0}, version=0,
                       rollout_factory=rollout_factory, to_device=False)  # fmt: skip
  source.close()
  actors = range(2) if threads else [0]
  assert seeds == [pool_seed(5, "training", segment=3, process=1, actor=a) for a in actors]


def test_sync_source_does_not_wait_for_a_slow_pool_beyond_the_grace_period():
  grace = 0.3
  rollouts = [FakeRollout(0), FakeRollout(1), FakeRollout(2, sleep_s=4.0)]
  source = _source(_sync_config(3, min_pools=2, grace_period_s=grace), rollouts)
  late = steps = fresh = 0
  try:
    for version in range(20):  # ~20 x grace: the slow pool (4 s) reports once or more
      start = time.monotonic()
      got = source.collect({"v": version}, version, _never)
      took = time.monotonic() - start
      assert took < grace + 2.5, f"iteration {version} waited {took:.2f} s"
      # The slow pool is never on time: only pools 0 and 1, with this version.
      assert got.traj["actor"][0].tolist() == [0, 0, 1, 1]
      assert (got.traj["version"] == version).all()
      late += got.discarded
      steps += got.env_steps
      fresh += 2
  finally:
    source.close()
  assert late >= 1  # the slow pool's trajectories arrived late and were counted
  assert steps == (fresh + late) * T * NUM_ENVS


# -- loop level ---------------------------------------------------------------


def _script(name):
  return getattr(presets, name)


def _args(module, run_dir, demos=None, **loop_overrides):
  args = module.Args() if demos is None else module.Args(demos=str(demos))
  return dataclasses.replace(args, run_dir=str(run_dir), train=args.train.replace(**loop_overrides))


def _bounded(fn, timeout=240.0):
  """fn() in a thread: its result, or its exception re-raised; fails on a hang."""
  out = {}

  def target():
    try:
      out["result"] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      out["error"] = e

  thread = threading.Thread(target=target, daemon=True)
  thread.start()
  thread.join(timeout)
  assert not thread.is_alive(), f"the run did not finish within {timeout} s (hang)"
  if "error" in out:
    raise out["error"]
  return out["result"]


@pytest.fixture(scope="module")
def heuristic_demos(tmp_path_factory):
  env = envs.make("CartPole-v1", 10, 7)
  policy = lambda obs: (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int32)
  demos = demos_lib.record_episodes(env, policy, 10)
  env.close()
  path = tmp_path_factory.mktemp("demos") / "cartpole.npz"
  demos_lib.save_demos(path, demos, env_id="CartPole-v1")
  return path


class CountingFactory:
  """A rollout factory that counts the unrolls of every rollout it makes."""

  def __init__(self):
    self.counts = []

  def __call__(self, *args):
    rollout = make_training_rollout(*args)
    self.counts.append(0)
    i = len(self.counts) - 1

    def unroll(params, state):
      out = rollout.unroll(params, state)
      self.counts[i] += 1
      return out

    return rollout._replace(unroll=unroll)


@pytest.mark.parametrize(
    "script, budget, overrides",
    [
        ("impala", 3_000, dict(max_policy_lag=0, num_actors=3)),
        ("acer", 2_000, {}),
        ("sql", 1_500, {}),
        ("sqil", 1_500, {}),
    ],
)
def test_async_actors_run_every_agent(tmp_path, heuristic_demos, script, budget, overrides):
  module = _script(script)
  overrides = {"actors": "async", "num_actors": 2, **overrides}
  args = _args(
      module,
      tmp_path / "run",
      demos=heuristic_demos if script == "sqil" else None,
      total_env_steps=budget,
      log_every=budget // 4,
      checkpoint_every=0,
      **overrides,
  )
  counter = CountingFactory()
  result = _bounded(lambda: module.run(args, rollout_factory=counter))
  count_unrolls = counter.counts
  per_unroll = args.train.steps_per_unroll
  lines = read_metrics(tmp_path / "run")
  assert lines and all("dropped_trajectories" in l for l in lines)
  assert all(l["env_steps"] % per_unroll == 0 for l in lines)
  assert result.env_steps == lines[-1]["env_steps"] >= budget
  assert result.env_steps % per_unroll == 0
  # Every counted env step was taken by an actor; the actors ran at most a full
  # queue plus one unroll each beyond what the learner took (used or dropped).
  k = overrides["num_actors"]
  assert len(count_unrolls) == k
  unrolled = sum(count_unrolls) * per_unroll
  assert result.env_steps <= unrolled <= result.env_steps + (k + k) * per_unroll
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["env_steps"] == result.env_steps
  if overrides.get("max_policy_lag") == 0:
    assert sum(l["dropped_trajectories"] for l in lines) > 0
    # Lag 0 of the trajectories used; none in a line whose trajectories were all dropped.
    assert all(l.get("policy_lag", 0) == 0 for l in lines)
    assert any("policy_lag" in l for l in lines)
  assert not _actor_threads()


@pytest.mark.parametrize("script, pools, min_pools", [("impala", 2, 0), ("sql", 2, 1)])
def test_sync_actor_pools_run(tmp_path, script, pools, min_pools):
  module = _script(script)
  budget = 2_048 if script == "impala" else 1_500
  args = _args(
      module,
      tmp_path / "run",
      total_env_steps=budget,
      log_every=budget // 4,
      checkpoint_every=0,
      actors="pools",
      num_actors=pools,
      min_pools=min_pools,
      **({"grace_period_s": 0.05} if min_pools else {}),
  )
  counter = CountingFactory()
  result = _bounded(lambda: module.run(args, rollout_factory=counter))
  count_unrolls = counter.counts
  per_unroll = args.train.steps_per_unroll
  lines = read_metrics(tmp_path / "run")
  assert lines and all("dropped_trajectories" in l for l in lines)
  assert result.env_steps >= budget and result.env_steps % per_unroll == 0
  assert len(count_unrolls) == pools
  if min_pools == 0:  # every iteration waits for every pool: one update per iteration
    assert sum(l["dropped_trajectories"] for l in lines) == 0
    assert result.num_updates * pools * per_unroll == result.env_steps
  else:  # SQL makes no update before min_replay_size: gated pools must go on anyway
    assert result.num_updates > 0
  assert not _actor_threads()


def test_an_actor_crash_stops_the_loop_with_its_error(tmp_path):
  made = []

  def rollout_factory(*args):
    rollout = make_training_rollout(*args)
    made.append(rollout)
    if len(made) != 2:
      return rollout
    calls = [0]

    def unroll(params, state):
      calls[0] += 1
      if calls[0] == 3:
        raise RuntimeError("injected actor failure")
      return rollout.unroll(params, state)

    return rollout._replace(unroll=unroll)

  module = _script("impala")
  args = _args(
      module,
      tmp_path / "run",
      total_env_steps=1_000_000,
      log_every=1_000,
      checkpoint_every=0,
      actors="async",
      num_actors=2,
  )
  start = time.monotonic()
  with pytest.raises(ActorError) as info:
    _bounded(lambda: module.run(args, rollout_factory=rollout_factory), timeout=180.0)
  assert "actor 1" in str(info.value) and "injected actor failure" in str(info.value)
  assert time.monotonic() - start < 180.0
  assert not _actor_threads()


def test_sigterm_stops_async_actors_saves_a_checkpoint_and_resumes(tmp_path):
  run_dir = tmp_path / "run"
  flags = [
      "--actors",
      "async",
      "--num-actors",
      "2",
      "--checkpoint-every",
      "2560",
      "--log-every",
      "512",
  ]
  cmd = [sys.executable, str(EXPERIMENTS / "impala.py"), "--run-dir", str(run_dir), *flags]
  err_path = tmp_path / "stderr.txt"
  with open(err_path, "w") as err:
    proc = subprocess.Popen(
        cmd + ["--total-env-steps", "51200"], stdout=subprocess.DEVNULL, stderr=err
    )
    try:
      metrics = run_dir / "metrics.jsonl"
      _wait_for(
          lambda: metrics.exists()
          and metrics.read_text().count("\n") >= 1
          or proc.poll() is not None,
          timeout=240.0,
      )
      assert proc.poll() is None, err_path.read_text()[-3000:]
      proc.send_signal(signal.SIGTERM)
      proc.wait(timeout=120)
    finally:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  assert proc.returncode == 0, err_path.read_text()[-3000:]
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["interrupted"] and summary["stopped_by"] == "SIGTERM"
  steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps and steps[-1] == summary["env_steps"]
  budget = 51200  # a resumed run may keep its budget or get a larger one, not a smaller
  proc = subprocess.run(
      cmd + ["--total-env-steps", str(budget), "--resume"],
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary = json.loads((run_dir / "summary.json").read_text())
  assert not summary["interrupted"] and "stopped_by" not in summary
  assert summary["env_steps"] >= budget and summary["env_steps"] % 256 == 0
  assert read_metrics(run_dir)[-1]["env_steps"] == summary["env_steps"]


# -- configuration --------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-policy-lag", "1"], "max_policy_lag applies to --actors async"),
        (
            ["--min-pools", "3", "--actors", "pools", "--num-actors", "2"],
            r"min_pools \(3\) exceeds num_actors \(2\)",
        ),
        (  # every pool, as min_pools 0: then no grace period either
            ["--min-pools", "2", "--actors", "pools", "--num-actors", "2"],
            "min_pools 2 waits for every one of the num_actors 2 pools, as min_pools 0 does",
        ),
        (["--actors", "async", "--num-actors", "-1"], "num_actors must be a positive int"),
        (["--num-actors", "2"], "num_actors=2 needs actor threads"),
        (
            ["--actors", "async", "--num-actors", "2", "--max-policy-lag", "-1"],
            "max_policy_lag must be an int >= 0",
        ),
        (["--actor-queue-size", "-1"], "actor_queue_size must be an int >= 0"),
        (  # pools unroll once per round: a queue of any size holds at most one per pool
            ["--actors", "pools", "--num-actors", "2", "--actor-queue-size", "8"],
            "actor_queue_size applies to --actors async",
        ),
        (["--min-pools", "-1"], "min_pools must be an int >= 0"),
        (["--actors", "pools", "--num-actors", "0"], "num_actors must be a positive int"),
        (
            ["--actors", "pools", "--num-actors", "2", "--grace-period-s", "-0.5"],
            "grace_period_s must be >= 0",
        ),
        (
            ["--actors", "pools", "--num-actors", "2", "--grace-period-s", "nan"],
            "grace_period_s must be finite",
        ),
    ],
)
def test_bad_actor_configuration_fails_fast(tmp_path, flags, message):
  module = _script("impala")
  start = time.monotonic()
  with pytest.raises(ValueError, match=message):
    module.run(parse_args(module.Args, argv=["--run-dir", str(tmp_path / "run"), *flags]))
  assert time.monotonic() - start < 30.0
  assert not (tmp_path / "run").exists()


def test_a_resume_refused_for_its_actors_warns_nothing_of_the_refused_settings(tmp_path):
  """The warning about checkpoints that cut episodes is of the inline loop's settings: a
  resume of an async run given --actors inline is refused (the run's actors may not change)
  before it, so the refusal is all it prints."""
  import warnings

  args = presets.impala.Args()
  train = args.train.replace(actors="async", num_actors=1, total_env_steps=1024,
                             log_every=256, checkpoint_every=256)  # fmt: skip
  args = dataclasses.replace(args, train=train, run_dir=str(tmp_path / "run"))
  presets.impala.run(args)
  inline = dataclasses.replace(args, train=train.replace(actors="inline", total_env_steps=2048),
                               resume=True)  # fmt: skip
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with pytest.raises(ValueError, match="the config differs from the run.s in actors"):
      presets.impala.run(inline)
  assert not [w for w in caught if "cuts every training episode" in str(w.message)]
  with pytest.warns(RuntimeWarning, match="cuts every training episode"):  # a new run warns
    presets.impala.run(dataclasses.replace(inline, resume=False, run_dir=str(tmp_path / "new")))
