"""The learner's data path: replay stores raw data; every batch the agent learns from (fresh,
replayed, SQIL's demonstrations, each vmapped seed) passes the data transformer exactly
once; the checkpoint record format is checked."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import agents
from offpolicy_ac import envs
from offpolicy_ac import training
from offpolicy_ac.training import ReplayConfig
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import records
from offpolicy_ac.training.learner import Learner
from offpolicy_ac.training.learner import check_learns
from offpolicy_ac.training.parallel import DataParallel

T, B, SCALE = 4, 6, 2.0
SPEC = envs.spec("CartPole-v1", num_envs=B)
CONFIG = TrainConfig.of(
    num_envs=B, unroll_length=T, replay_capacity=32, min_replay_size=1, mini_batch_size=5,
    mini_batch_length=3, reward_scale=SCALE, normalize_observations=True,
)  # fmt: skip


def _recording(agent):
  """The agent with an update that reports what it was given (and checks its type)."""

  def update(state, batch):
    assert isinstance(batch, envs.TransformedTrajectory), type(batch)
    metrics = {
        "reward_sum": batch.reward.sum(),
        "obs_abs_sum": jnp.abs(batch.observation).sum(),
        "columns": jnp.float32(batch.reward.shape[1]),
    }
    return state._replace(num_updates=state.num_updates + 1), metrics

  return agent._replace(update=update)


def _traj(seed):
  """A raw unroll [T+1, B]: every reward 1, every observation the same vector. Its entries
  are multiples of 1/4 (magnitudes 0.25 to 1.75), so their float32 sums, means and
  variances are exact in any order and a constant observation normalises to exactly 0."""
  rng = np.random.default_rng(seed)
  action = rng.integers(0, 2, (T + 1, B)).astype(np.int32)
  obs = rng.integers(1, 8, size=4) * rng.choice([-1, 1], size=4) / 4
  return envs.Trajectory(
      step_type=np.ones((T + 1, B), np.int32), reward=np.ones((T + 1, B), np.float32),
      discount=np.ones((T + 1, B), np.float32),
      observation=np.broadcast_to(obs.astype(np.float32), (T + 1, B, 4)).copy(),
      env_id=np.broadcast_to(np.arange(B, dtype=np.int32), (T + 1, B)).copy(), action=action,
      extras={},
  )  # fmt: skip


def _learner(agent, num_seeds=1, batch_fn=None):
  config = CONFIG if agent.off_policy else dataclasses.replace(CONFIG, replay=ReplayConfig())
  return Learner(_recording(agent), config, DataParallel.create(1), num_seeds=num_seeds,
                 batch_fn=batch_fn)  # fmt: skip


def test_replay_stores_raw_data_and_replayed_batches_are_transformed_once():
  learner = _learner(agents.make_sql(SPEC))
  state = learner.init([0])
  traj = _traj(0)
  state, fresh, key = learner.ingest(state, learner.batch([traj]))
  assert fresh is None  # SQL learns from replay only
  np.testing.assert_array_equal(state.replay.data.reward[0, :B], np.swapaxes(traj.reward, 0, 1))
  np.testing.assert_array_equal(state.transform.obs_stats.count, [T * B])  # rows [0, T)
  state, metrics = learner.sample_and_update(state, key)
  window = CONFIG.replay.mini_batch_length + 1
  # Rewards scaled once (raw 1 -> SCALE); constant observations normalise to ~0.
  assert float(metrics["reward_sum"][0]) == SCALE * window * CONFIG.replay.mini_batch_size
  assert float(metrics["obs_abs_sum"][0]) < 0.1  # raw: about 1 per entry


def test_fresh_unrolls_are_transformed_once_with_the_statistics_updated_from_them():
  learner = _learner(agents.make_impala(SPEC))
  state = learner.init([0])
  traj = _traj(1)
  acted_with = learner.acting(state)[0].transform  # no statistics yet
  state, metrics, _ = learner.ingest(state, learner.batch([traj]))
  assert float(metrics["reward_sum"][0]) == SCALE * (T + 1) * B
  # Normalised with the statistics that include this unroll: its constant observations
  # become 0, where the actors (raw: about 1 per entry) saw them unnormalised.
  assert float(metrics["obs_abs_sum"][0]) < 0.1
  as_acted = learner.transformer.apply(acted_with, jax.tree.map(jnp.asarray, traj))
  assert float(jnp.abs(as_acted.observation).sum()) >= (T + 1) * B
  np.testing.assert_array_equal(state.transform.obs_stats.count, [T * B])


def test_sqil_demonstrations_pass_the_transformer_with_the_agent_data():
  demo = _traj(2)._replace(observation=_traj(2).observation + 3.0)
  sequences = jax.tree.map(lambda x: x[:, :3], demo)  # 3 demonstration sequences [T+1]
  window = CONFIG.replay.mini_batch_length + 1
  batch_fn = agents.make_sqil_batch_fn(sequences, batch_size=5, length=window)
  learner = _learner(agents.make_sqil(SPEC), batch_fn=batch_fn)
  state, _, key = learner.ingest(learner.init([0]), learner.batch([_traj(2)]))
  _, metrics = learner.sample_and_update(state, key)
  assert float(metrics["columns"][0]) == 10  # half agent windows, half demonstrations
  # SQIL's rewards (agent 0, demonstrations 1), then scaled once.
  assert float(metrics["reward_sum"][0]) == SCALE * window * 5
  # Demonstration observations are normalised with the agent data's statistics: not 0.
  assert float(metrics["obs_abs_sum"][0]) > 0.0
  with pytest.raises(ValueError, match="sqil learns from demonstrations"):
    _learner(agents.make_sqil(SPEC))  # no batch_fn: SQL on the environment's rewards


@pytest.mark.parametrize("num_seeds", [1, 2])
def test_sqil_demonstrations_are_an_input_of_the_compiled_update_not_a_constant(num_seeds):
  # A function closing over the demonstrations would have XLA compile them in as a
  # constant: the program would grow with them (1.5 GB of Atari frames: minutes of
  # compiling, then out of memory). As an argument, its size does not depend on them.
  window = CONFIG.replay.mini_batch_length + 1

  def program_size(num_sequences):
    demo = _traj(5)._replace(observation=np.random.default_rng(0).normal(size=(T + 1, B, 4)))
    sequences = jax.tree.map(lambda x: np.repeat(x, num_sequences // B, axis=1), demo)
    batch_fn = agents.make_sqil_batch_fn(sequences, batch_size=5, length=window)
    learner = _learner(agents.make_sqil(SPEC), num_seeds=num_seeds, batch_fn=batch_fn)
    state = learner.init(list(range(num_seeds)))
    keys = jnp.stack([jax.random.PRNGKey(k) for k in range(num_seeds)])
    lowered = learner._sample.lower(state, keys, learner.hyperparams, learner._batch_fn)
    return len(lowered.as_text())

  # 5,400 more sequences as a constant: some 900k characters of hex (4 floats a step).
  assert abs(program_size(6_000) - program_size(600)) < 100


def test_each_vmapped_seed_transforms_its_own_data_as_a_single_learner_does():
  singles = []
  for seed, traj in ((3, _traj(3)), (4, _traj(4))):
    learner = _learner(agents.make_sql(SPEC))
    state, _, key = learner.ingest(learner.init([seed]), learner.batch([traj]))
    singles.append(learner.sample_and_update(state, key))
  learner = _learner(agents.make_sql(SPEC), num_seeds=2)
  state, _, key = learner.ingest(learner.init([3, 4]), learner.batch([_traj(3), _traj(4)]))
  state, metrics = learner.sample_and_update(state, key)
  for k, (single_state, single_metrics) in enumerate(singles):
    for a, b in zip(jax.tree.leaves(single_state.transform), jax.tree.leaves(state.transform)):
      np.testing.assert_allclose(a[0], b[k], rtol=1e-6)
    for name in metrics:
      np.testing.assert_allclose(single_metrics[name][0], metrics[name][k], rtol=1e-6)
  acting = learner.acting(state)
  assert len(acting) == 2 and acting[1].transform.obs_stats.count == T * B


def test_checkpoint_records_of_another_format_kind_or_lane_count_are_refused():
  schedule = records.Schedule.start(100, 0, 50)
  accs = records.Accumulators()
  accs.add_episodes(2, 30.0, 40.0)
  record = records.to_record("envpool", schedule, [accs])
  restored, restored_accs = records.from_record(record, "envpool", 1, "here")
  assert restored == schedule and restored_accs == [accs]
  with pytest.raises(ValueError, match="record format 1; .* reads format 3"):
    records.from_record({"counters": {}}, "envpool", 1, "here")
  with pytest.raises(ValueError, match="format 2 runs resume with offpolicy_ac 0.2"):
    records.from_record({**record, "format": 2}, "envpool", 1, "here")
  with pytest.raises(ValueError, match="of an envpool run, not of a compiled"):
    records.from_record(record, "compiled", 1, "here")
  with pytest.raises(ValueError, match="holds 1 learners, the run 2"):
    records.from_record(record, "envpool", 2, "here")


def test_the_best_evaluation_is_the_highest_mean_and_of_equal_means_the_latest():
  accs = records.Accumulators()
  scores = [(100, 20.0), (200, 500.0), (300, 480.0), (400, 500.0), (500, 499.0)]
  news = [accs.evaluated(mean, steps, target=475.0) for steps, mean in scores]
  assert news == [True, True, False, True, False]
  assert (accs.best_eval, accs.best_env_steps) == (500.0, 400)
  assert (accs.last_eval, accs.reached_at) == (499.0, 200)
  nan = records.Accumulators()  # a NaN evaluation (a diverged policy) is never the best
  assert [nan.evaluated(m, s, None) for s, m in enumerate([np.nan, 100.0, np.nan, 50.0])] == [
      False, True, False, False]  # fmt: skip
  assert (nan.best_eval, nan.best_env_steps) == (100.0, 1)


def test_training_train_refuses_a_jax_environment():
  from offpolicy_ac.training import train  # pylint: disable=import-outside-toplevel

  with pytest.raises(ValueError, match="is a JAX environment.*training.make_train"):
    train(lambda spec: None, TrainConfig.of(env_id="gymnax:CartPole-v1"), [None])


@pytest.mark.parametrize("num_seeds", [1, 2])
def test_ingest_and_replayed_updates_reuse_the_state_buffers_instead_of_copying(num_seeds):
  """The learner donates its state (an Atari replay buffer is gigabytes): the state passed
  to `ingest` and `sample_and_update` is consumed, not copied; `warm_up` only compiles,
  leaving the caller's state usable."""
  learner = _learner(agents.make_sql(SPEC), num_seeds=num_seeds)
  state = learner.init(list(range(num_seeds)))
  batch = learner.batch([_traj(k) for k in range(num_seeds)])
  learner.warm_up(state, batch, learner.acting(state)[0]).join()
  assert not state.replay.data.observation.is_deleted()
  ingested, _, key = learner.ingest(state, batch)
  assert state.replay.data.observation.is_deleted()
  assert state.agent.num_updates.is_deleted()
  updated, _ = learner.sample_and_update(ingested, key)
  assert ingested.replay.data.observation.is_deleted()
  np.testing.assert_array_equal(learner.num_updates(updated), [1] * num_seeds)


@pytest.mark.parametrize("make, num_seeds, batch_fn", [
    (agents.make_sql, 1, None), (agents.make_sql, 2, None), (agents.make_impala, 1, None),
    (agents.make_sql, 1, lambda batch, key: batch),
])  # fmt: skip
def test_the_first_iteration_and_evaluation_run_what_the_warm_up_compiled(make, num_seeds,
                                                                          batch_fn):  # fmt: skip
  """The warm-up compiles from the shapes of the state, an unroll and the acting
  parameters, and runs nothing (it holds no copy of the state): the first update on an
  unroll, the replayed updates and the greedy policy on an evaluation pool's observations
  compile nothing more."""
  updates = []
  agent = make(SPEC)

  def update(state, batch):
    jax.debug.callback(lambda: updates.append(1))
    return agent.update(state, batch)

  config = CONFIG if agent.off_policy else dataclasses.replace(CONFIG, replay=ReplayConfig())
  learner = Learner(agent._replace(update=update), config, DataParallel.create(1),
                    num_seeds=num_seeds, batch_fn=batch_fn)  # fmt: skip
  state = learner.init(list(range(num_seeds)))
  acting = learner.acting(state)
  batch = learner.batch([jax.device_get(learner.example(acting[0], B))] * num_seeds)
  compiles = []

  def listener(name, _, **__):
    if name == "/jax/core/compile/backend_compile_duration":
      compiles.append(name)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    learner.warm_up(state, batch, acting[0]).join()
    learner.check_warm_up()
    warmed = len(compiles)
    assert warmed >= 2 + learner.agent.off_policy  # ingest, (sample,) greedy
    assert not updates
    ingested, _, key = learner.ingest(state, batch)
    if learner.agent.off_policy:
      jax.block_until_ready(learner.sample_and_update(ingested, key))
    jax.effects_barrier()
    assert updates
    obs = np.zeros((CONFIG.eval.eval_episodes, *SPEC.observation_shape), np.float32)
    jax.block_until_ready(learner.greedy(acting[0], obs))
    assert len(compiles) == warmed
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def test_the_replay_holds_what_an_iteration_of_every_pool_adds():
  from offpolicy_ac.training.learner import make_replay  # pylint: disable=import-outside-toplevel

  config = TrainConfig.of(num_envs=16, replay_capacity=32, min_replay_size=16)
  make_replay(config)
  with pytest.raises(ValueError, match=r"holds fewer sequences than one iteration adds \(64"):
    make_replay(config.replace(actors="pools", num_actors=4))


@pytest.mark.parametrize(
    "fault, message",
    [
        ("greedy_column", r"impala's greedy_act on observations \[3, 4\]: CartPole-v1: action "
                          r"shape \(3, 1\), expected \(3,\)"),
        ("greedy_float", "impala's greedy_act .* discrete actions must have an integer dtype"),
        ("act_alone", r"impala's act must return a pair \(action \[B, \.\.\.\], extras"),
        ("init_dict", r"impala's init must return a state with attributes params and "
                      r"num_updates \(an int32 scalar\), as agents.AgentState has; got dict"),
        ("init_counter", r"impala's init .* got AgentState whose num_updates is int32\[1\]"),
        ("init_params", r"impala's init must return a state with attributes .* got tuple$"),
    ],
)  # fmt: skip
def test_policies_that_do_not_fit_the_task_are_refused_before_anything_runs(fault, message):
  agent = agents.make_impala(envs.spec("CartPole-v1", num_envs=3))
  act, greedy_act = agent.act, agent.greedy_act
  init = agent.init
  if fault == "act_alone":
    agent = agent._replace(act=lambda params, obs, key: act(params, obs, key)[0])
  elif fault == "init_dict":
    agent = agent._replace(init=lambda key: init(key)._asdict())
  elif fault == "init_params":
    agent = agent._replace(init=lambda key: (init(key).params,))
  elif fault == "init_counter":
    agent = agent._replace(init=lambda key: init(key)._replace(num_updates=jnp.zeros(1, int)))
  else:
    cast = (lambda a: a[:, None]) if fault == "greedy_column" else (lambda a: a.astype(float))
    agent = agent._replace(greedy_act=lambda params, obs: cast(greedy_act(params, obs)))
  config = TrainConfig.of(num_envs=3, unroll_length=4, total_env_steps=120, eval_every=0)
  with pytest.raises(ValueError, match=message):
    check_learns(agent, config)
  with pytest.raises(ValueError, match=message):  # before its first evaluation, long after
    training.train(lambda spec: agent, config, [_Lines()])
  check_learns(agents.make_impala(envs.spec("CartPole-v1", num_envs=3)), config)


@pytest.mark.parametrize("function", ["init", "act", "greedy_act", "greedy_act_mask"])
def test_functions_jax_cannot_trace_are_refused_naming_them(function):
  # NumPy on a traced array: a bare TracerArrayConversionError from inside the learner
  # before, naming neither the agent nor its function.
  agent = agents.make_impala(envs.spec("CartPole-v1", num_envs=3))
  act, greedy_act, init = agent.act, agent.greedy_act, agent.init
  untraceable = {
      "init": lambda key: init(jnp.asarray(np.asarray(key))),
      "act": lambda params, obs, key: act(params, jnp.asarray(np.asarray(obs)), key),
      "greedy_act": lambda params, obs: greedy_act(params, jnp.asarray(np.asarray(obs))),
      # A boolean mask's shape depends on the values (a JAXIndexError, not a JAXTypeError).
      "greedy_act_mask": lambda params, obs: greedy_act(params, obs)[obs[:, 0] > 0],
  }
  agent = agent._replace(**{function.removesuffix("_mask"): untraceable[function]})
  signature = {"init": r"init\(key\)", "act": r"act\(params, obs, key\)",
               "greedy_act": r"greedy_act\(params, obs\)",
               "greedy_act_mask": r"greedy_act\(params, obs\)"}[function]  # fmt: skip
  error = "NonConcreteBooleanIndexError" if function.endswith("_mask") else (
      "TracerArrayConversionError")  # fmt: skip
  config = TrainConfig.of(num_envs=3, unroll_length=4, total_env_steps=120, eval_every=0)
  with pytest.raises(TypeError, match=rf"^impala's {signature} must be traceable by jax.jit: "
                                      rf".*{error}"):  # fmt: skip
    training.train(lambda spec: agent, config, [_Lines()])


class _Lines:

  def log(self, record):
    raise AssertionError(f"trained: {record}")
