"""Mistaken input from Python (a notebook's `dataclasses.replace`, a call with the wrong
kind of value) is refused before any work, naming what is wrong, as the command line's is."""

import dataclasses

import numpy as np
import pytest

from offpolicy_ac import agents
from offpolicy_ac import demos as demos_lib
from offpolicy_ac import envs
from offpolicy_ac import presets
from offpolicy_ac.agents import ImpalaConfig
from offpolicy_ac.agents import make_impala
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import load_run
from offpolicy_ac.training import make_train
from offpolicy_ac.training import run_experiment


@pytest.mark.parametrize(
    "script, field, value, message",
    [
        ("impala", "anneal_learning_rate", "False", "anneal_learning_rate must be True or False"),
        ("impala", "resume", "no", "resume must be True or False, got 'no'"),
        (
            "impala",
            "import_modules",
            "json",
            "import_modules must be a tuple or list of strs, got 'json'",
        ),
        ("sql", "learning_rate_cooldown", "0.2", "learning_rate_cooldown must be a number"),
        ("sql", "agent", ImpalaConfig(), "agent must be a SqlConfig, got ImpalaConfig("),
        ("sqil", "demo_batch_size", "4", "--demo-batch-size must be an int >= 1, got '4'"),
        ("acer", "agent", ImpalaConfig(), "agent must be an AcerConfig, got ImpalaConfig("),
    ],
)
def test_script_args_of_another_type_are_refused_by_name(tmp_path, script, field, value,
                                                         message):  # fmt: skip
  module = getattr(presets, script)
  extra = {"demos": str(tmp_path / "demos.npz")} if script == "sqil" else {}
  with pytest.raises(ValueError) as e:
    args = dataclasses.replace(module.Args(**extra), run_dir=str(tmp_path / "run"),
                               **{field: value})  # fmt: skip
    module.run(args)
  assert message in str(e.value)
  assert not (tmp_path / "run").exists()


def test_a_train_config_that_is_not_one_is_refused(tmp_path):
  args = dataclasses.replace(presets.impala.Args(), run_dir=str(tmp_path / "run"))
  with pytest.raises(TypeError, match="train must be a TrainConfig, got {'num_envs': 4}"):
    presets.impala.run(dataclasses.replace(args, train={"num_envs": 4}))
  with pytest.raises(ValueError, match="config must be a TrainConfig, got {}"):
    make_train(make_impala, ImpalaConfig(), {})


def test_load_run_refuses_a_best_that_is_not_a_bool(tmp_path):
  with pytest.raises(TypeError, match="best must be True or False, got 'no'"):
    load_run(tmp_path, best="no")


def test_a_sqil_batch_fn_of_no_windows_is_refused_as_it_is_built():
  demos = demos_lib.cut_episodes(_demos(), 5)
  for name, sizes, low in (("batch_size", dict(batch_size=0, length=4), 1),
                           ("length", dict(batch_size=4, length=2.5), 2),
                           ("length", dict(batch_size=4, length=1), 2)):  # fmt: skip
    with pytest.raises(ValueError, match=f"make_sqil_batch_fn: {name} must be an int >= {low}"):
      agents.make_sqil_batch_fn(demos, **sizes)
  # NumPy ints are ints (cut_episodes takes them too).
  agents.make_sqil_batch_fn(demos, batch_size=np.int64(4), length=np.int32(4))
  with pytest.raises(TypeError, match=r"takes demonstrations cut into sequences, a Trajectory "
                                      r"\[L, S, ...\] \(demos.cut_episodes"):  # fmt: skip
    agents.make_sqil_batch_fn(_demos(), batch_size=4, length=4)


def test_demonstrations_of_another_task_are_refused_before_anything_compiles(tmp_path):
  """make_sqil_batch_fn knows no task: demonstrations whose actions lie outside the task's
  gave NaN parameters at the first update, and a NonFiniteError that blamed the learning
  rate. Both drivers now check them against the agent's task first."""
  from offpolicy_ac import training

  bad = _demos()
  bad["action"] = np.where(np.arange(len(bad["action"])) == 3, 5, 0).astype(np.int32)
  batch_fn = agents.make_sqil_batch_fn(demos_lib.cut_episodes(bad, 5), batch_size=4, length=4)
  message = (r"make_sqil_batch_fn's demonstrations \(for (gymnax:)?CartPole-v1\): actions must "
             r"lie in \[0, 2\)")  # fmt: skip
  config = TrainConfig.of(env_id="gymnax:CartPole-v1", total_env_steps=4096)
  with pytest.raises(ValueError, match=message):
    make_train(agents.make_sqil, agents.SqlConfig(), config, batch_fn=batch_fn)
  config = TrainConfig.of(env_id="CartPole-v1", total_env_steps=2048, mini_batch_size=8)
  logger = training.RunLogger(str(tmp_path / "run"), total_env_steps=2048)
  with pytest.raises(ValueError, match=message):
    training.train(agents.make_sqil, config, [logger], batch_fn=batch_fn)
  # The action at a LAST step (and at padding's) starts no transition: it is not checked.
  last = _demos()
  last["action"] = np.where(last["step_type"] == 2, 9, 0).astype(np.int32)
  fits = agents.make_sqil_batch_fn(demos_lib.cut_episodes(last, 5, "null_padding"),
                                   batch_size=4, length=4)  # fmt: skip
  fits.check(envs.spec("CartPole-v1"))


def test_a_batch_fn_for_an_agent_without_replay_is_refused():
  demos = demos_lib.cut_episodes(_demos(), 5)
  batch_fn = agents.make_sqil_batch_fn(demos, batch_size=4, length=4)
  config = TrainConfig.of(env_id="gymnax:CartPole-v1", total_env_steps=4096)
  with pytest.raises(ValueError, match="batch_fn changes replayed batches, and impala learns "
                                       "on-policy"):  # fmt: skip
    make_train(make_impala, ImpalaConfig(), config, batch_fn=batch_fn)


def _demos():
  lengths = [6, 7]
  step_type = np.concatenate([[0] + [1] * (n - 2) + [2] for n in lengths]).astype(np.int32)
  n = int(sum(lengths))
  discount = np.where(step_type == 2, 0.0, 1.0).astype(np.float32)
  return {"observation": np.zeros((n, 4), np.float32), "action": np.zeros(n, np.int32),
          "reward": np.ones(n, np.float32), "discount": discount, "step_type": step_type,
          "episode_lengths": np.array(lengths, np.int64)}  # fmt: skip


def test_an_agent_count_beyond_32_bits_is_refused_by_name():
  config = ImpalaConfig(learning_rate_decay_updates=2**31)
  with pytest.raises(ValueError, match=r"learning_rate_decay_updates must be below 2\*\*31"):
    make_impala(envs.spec("CartPole-v1"), config)


def test_more_actors_than_the_memory_maps_allow_are_refused_before_they_start(tmp_path,
                                                                              monkeypatch):  # fmt: skip
  """At about 1,000 actors every thread's allocations failed and the process crashed."""
  from offpolicy_ac.training import experiment

  limit = tmp_path / "max_map_count"
  limit.write_text("65530\n")
  monkeypatch.setattr(experiment, "MAX_MAP_COUNT", limit)
  train = TrainConfig.of(num_envs=16, actors="async", num_actors=1000, total_env_steps=4096)
  args = dataclasses.replace(presets.impala.Args(), train=train, run_dir=str(tmp_path / "run"))
  with pytest.raises(ValueError) as e:
    presets.impala.run(args)
  assert str(e.value) == (
      "1,000 actors (num_actors), each with a pool of 16 environments, need about 74,000 "
      "memory maps, more than this machine allows a process (65,530, vm.max_map_count): "
      "fewer actors, or raise the limit"
  )
  assert not (tmp_path / "run").exists()
  limit.write_text("2144\n")  # exactly what 2 actors need: the run is not refused
  train = train.replace(num_actors=2, total_env_steps=512)
  presets.impala.run(dataclasses.replace(args, train=train))
  assert (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize(
    "factory, config",
    [(make_impala, ImpalaConfig(learning_rate=np.array([1e-3, 3e-3]))),
     (agents.make_acer, agents.AcerConfig(gamma=np.array([0.99]))),
     (agents.make_sql, agents.SqlConfig(alpha=np.array([[0.1]])))],
)  # fmt: skip
def test_an_array_of_several_values_for_one_setting_is_refused_by_name(factory, config):
  """It failed with NumPy's "truth value of an array ... is ambiguous"."""
  spec = envs.spec("CartPole-v1", num_envs=2)
  with pytest.raises(ValueError, match=r"must be one number, got an array of shape \(.*a sweep"):
    factory(spec, config)
  for scalar in (np.float32(0.5), np.array(0.5)):  # one number, as NumPy holds it: taken
    factory(spec, dataclasses.replace(config, **{_field(config): scalar}))


def _field(config):
  return next(f.name for f in dataclasses.fields(config) if np.ndim(getattr(config, f.name)))


@pytest.mark.parametrize(
    "factory", [make_impala, agents.make_acer, agents.make_sql, agents.make_sqil,
                agents.make_acer_discrete, agents.make_sql_continuous],
)  # fmt: skip
@pytest.mark.parametrize("spec", ["CartPole-v1", {"num_actions": 2}])
def test_an_agent_factory_refuses_a_spec_that_is_not_one(factory, spec):
  """A task id or a dict failed on its first missing attribute (AttributeError)."""
  with pytest.raises(TypeError, match=r"takes an envs.EnvSpec \(envs.spec\(env_id, num_envs"):
    factory(spec)


def test_run_experiment_refuses_an_agent_factory_that_returns_no_agent(tmp_path):
  args = dataclasses.replace(presets.impala.Args(), run_dir=str(tmp_path / "run"))
  with pytest.raises(TypeError, match="agent_factory.spec. must return an Agent .*got ImpalaCon"):
    run_experiment("impala", args, lambda spec: ImpalaConfig())
  assert not (tmp_path / "run").exists()


def test_loggers_that_would_lose_or_mix_lines_are_refused_before_the_run(tmp_path):
  """One logger for two seeds interleaved their lines in one metrics.jsonl; a second
  RunLogger on the run's own folder (add_logger) wrote every line twice; a logger without
  log() failed at the first metrics line, after an interval of training."""
  from offpolicy_ac import training

  config = TrainConfig.of(env_id="CartPole-v1", total_env_steps=1024, num_seeds=2)
  logger = training.RunLogger(str(tmp_path / "a"), total_env_steps=1024)
  other = training.RunLogger(str(tmp_path / "a"), total_env_steps=1024)
  for loggers, message in (
      ([logger, logger], "logger 1 is the same logger object as logger 0: their lines"),
      ([logger, training.MultiLogger(other)], r"logger 1's logger 0 and logger 0 both write "),
      ([logger, None], r"logger 1 is None, which has no log: a Logger has log"),
  ):
    with pytest.raises(ValueError, match=message):
      training.train(make_impala, config, loggers)
  args = dataclasses.replace(presets.impala.Args(), run_dir=str(tmp_path / "run"))
  args = dataclasses.replace(args, train=args.train.replace(total_env_steps=512))
  twice = lambda run_dir, seed: training.RunLogger(run_dir, total_env_steps=512)  # noqa: E731
  with pytest.raises(ValueError, match=r"add_logger returned a RunLogger of .*run, which the run "
                                       r"logs to already: every line would be written twice"):  # fmt: skip
    presets.impala.run(args, add_logger=twice)
  assert not (tmp_path / "run" / "metrics.jsonl").exists()
  assert not (tmp_path / "run" / "config.json").exists()


def test_python_calls_with_the_wrong_kind_of_value_are_refused_by_name(tmp_path):
  """Each failed with an AttributeError or a TypeError from inside JAX, pathlib or
  dataclasses."""
  from offpolicy_ac import training

  config = TrainConfig.of(env_id="CartPole-v1", total_env_steps=1024)
  logger = training.RunLogger(str(tmp_path / "a"), total_env_steps=1024)
  with pytest.raises(ValueError, match=r"config must be a TrainConfig, got \{'total_env_steps'"):
    training.train(make_impala, {"total_env_steps": 1024}, [logger])
  with pytest.raises(TypeError, match=r"agent_factory\(spec\) must return an Agent .*NoneType"):
    training.train(lambda spec: None, config, [logger])
  compiled = TrainConfig.of(env_id="gymnax:CartPole-v1", total_env_steps=4096)
  with pytest.raises(
      TypeError, match=r"make_agent must return an Agent \(for example agents.make_impala\)"
  ):
    make_train(lambda spec, config: None, ImpalaConfig(), compiled)
  with pytest.raises(ValueError, match=r"obs_clip must be a number, got np.float32\(5.0\) "
                                       r"\(numpy.float32, not float: pass float\(...\)\)"):  # fmt: skip
    TrainConfig.of(env_id="CartPole-v1", obs_clip=np.float32(5)).validate()
  with pytest.raises(TypeError, match=r"load_run: run_dir must be a path .*got 5"):
    load_run(5)
  with pytest.raises(TypeError, match=r"a preset's run takes its Args .*got dict"):
    presets.impala.run({"run_dir": str(tmp_path / "run")})


def test_sqil_refuses_windows_longer_than_its_unrolls_before_it_reads_the_demonstrations(
    tmp_path,
):
  """The replay's windows (mini_batch_length + 1 steps) are the length the demonstrations
  are cut to: a length the replay refuses is refused before the file is read (a huge one
  was cut first, and the cut alone could exhaust the memory)."""
  args = presets.sqil.Args(demos=str(tmp_path / "missing.npz"))
  train = args.train.replace(mini_batch_length=args.train.env.unroll_length + 1)
  args = dataclasses.replace(args, train=train, run_dir=str(tmp_path / "run"))
  with pytest.raises(ValueError, match=r"\(mini_batch_length \+ 1\) is longer than the stored"):
    presets.sqil.run(args)
  assert not (tmp_path / "run").exists()
