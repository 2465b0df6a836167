"""A custom agent through `run_experiment`: registered under a name of its own
(`agents.register_agent`), it trains on envpool and compiled, and its run directory loads
it back (`load_run`); under a built-in name, it is refused before anything is written
(the run directory would rebuild the built-in agent)."""

import dataclasses
import functools
import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import agents
from offpolicy_ac import networks
from offpolicy_ac import presets
from offpolicy_ac.agents import registry
from offpolicy_ac.networks import torsos
from offpolicy_ac.training import load_run
from offpolicy_ac.training import read_metrics
from offpolicy_ac.training import run_experiment

NAME = "marked-impala"


def make_marked_impala(spec, config):
  """IMPALA whose update also logs `marked`: the same parameters, other functions."""
  agent = agents.make_impala(spec, config)

  def update(state, batch):
    state, metrics = agent.update(state, batch)
    return state, {**metrics, "marked": jnp.float32(1.0)}

  return agent._replace(name=NAME, update=update)


@pytest.fixture
def registered():
  agents.register_agent(NAME, make_marked_impala, agents.ImpalaConfig)
  agents.register_agent(NAME, make_marked_impala, agents.ImpalaConfig)  # again: a no-op
  yield
  registry.AGENTS.pop(NAME)


def _args(run_dir, env_id):
  args = presets.impala.Args()
  train = args.train.replace(env_id=env_id, total_env_steps=512, eval_every=0, log_every=256)
  return dataclasses.replace(args, train=train, run_dir=str(run_dir))


def _factory(args):
  return functools.partial(make_marked_impala, config=args.agent)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_a_registered_custom_agent_trains_and_its_run_loads_it(registered, tmp_path, env_id):
  args = _args(tmp_path / "run", env_id)
  result = run_experiment(NAME, args, _factory(args), progress=False)
  assert result.env_steps == 512
  lines = [line for line in read_metrics(tmp_path / "run") if line.get("num_updates")]
  assert lines and all(line["marked"] == 1.0 for line in lines)  # its own update trained
  run = load_run(tmp_path / "run")
  assert run.agent.name == NAME
  registry.check_registered(NAME, run.agent)  # rebuilt by its own factory


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_a_custom_agent_under_a_built_in_name_is_refused_before_anything_is_written(
    tmp_path, env_id
):
  args = _args(tmp_path / "run", env_id)
  with pytest.raises(ValueError, match=r"'impala''s factory \(make_impala\) builds other "
                     r"update functions than the agent's.*agents.register_agent"):  # fmt: skip
    run_experiment("impala", args, _factory(args), progress=False)
  with pytest.raises(ValueError, match=r"unknown algorithm 'mine'.*agents.register_agent"):
    run_experiment("mine", args, _factory(args), progress=False)
  sql = functools.partial(agents.make_sql, config=agents.SqlConfig())
  with pytest.raises(ValueError, match="the agent's config is SqlConfig; 'impala' takes "):
    run_experiment("impala", args, lambda spec: sql(spec), progress=False)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_a_factory_of_another_config_than_args_agent_is_refused_before_anything_runs(
    tmp_path, env_id
):
  """config.json recorded args.agent while the factory's config trained (silently: another
  step size; or a run load_run could not read: other layer sizes)."""
  args = _args(tmp_path / "run", env_id)
  slower = dataclasses.replace(args.agent, learning_rate=1e-4)
  with pytest.raises(ValueError, match=r"config differs from args.agent in learning_rate "
                     r"\(args.agent: 0.003, the agent's: 0.0001\): config.json records "
                     r"args.agent"):  # fmt: skip
    run_experiment("impala", args, functools.partial(agents.make_impala, config=slower))
  assert not (tmp_path / "run").exists()
  # What a script derives from the budget (--anneal-learning-rate) may differ.
  annealed = dataclasses.replace(args.agent, learning_rate_decay_updates=2)
  run_experiment("impala", args, functools.partial(agents.make_impala, config=annealed),
                 progress=False)  # fmt: skip
  assert load_run(tmp_path / "run").config.budget.total_env_steps == 512


def test_a_run_of_an_unregistered_agent_names_the_registration(registered, tmp_path):
  args = _args(tmp_path / "run", "CartPole-v1")
  run_experiment(NAME, args, _factory(args), progress=False)
  registry.AGENTS.pop(NAME)  # another process, which has not registered it
  try:
    with pytest.raises(ValueError, match="register it in this process first"):
      load_run(tmp_path / "run")
  finally:
    agents.register_agent(NAME, make_marked_impala, agents.ImpalaConfig)


def test_register_agent_refuses_a_taken_name_and_bad_arguments():
  with pytest.raises(ValueError, match="'impala' is registered with another factory"):
    agents.register_agent("impala", make_marked_impala, agents.ImpalaConfig)
  agents.register_agent("impala", agents.make_impala, agents.ImpalaConfig)  # its own: a no-op
  for name, make, config_cls, message in [
      ("", make_marked_impala, agents.ImpalaConfig, "non-empty str"),
      ("x", None, agents.ImpalaConfig, "make_agent must be callable"),
      ("x", make_marked_impala, dict, "config_cls must be a dataclass"),
  ]:
    with pytest.raises(ValueError, match=message):
      agents.register_agent(name, make, config_cls)
  assert "x" not in registry.AGENTS


class _NoLogger:

  def log(self, record):
    pass

  def truncate(self, num_lines):
    pass

  def close(self):
    pass


def _broken(spec, config, how):
  """IMPALA whose update breaks its contract as `how` says."""
  agent = agents.make_impala(spec, config)

  def update(state, batch):
    state, metrics = agent.update(state, batch)
    if how == "three":
      return state, metrics, 1
    if how == "list":
      return state, list(metrics.values())
    if how == "metrics only":
      return metrics
    if how == "vector metric":
      return state, {**metrics, "per_step": batch.reward}
    if how == "int name":
      return state, {**metrics, 1: jnp.float32(0.0)}
    if how == "reserved name":
      return state, {**metrics, "num_updates": jnp.float32(1.0)}
    if how == "None metric":
      return state, {**metrics, "n": None}
    if how == "dtype":
      return state._replace(num_updates=state.num_updates.astype(jnp.float32)), metrics
    if how == "shape":
      return state._replace(key=jnp.stack([state.key, state.key])), metrics
    return state._replace(target_params={"extra": jnp.zeros(())}), metrics  # "state"

  return agent._replace(update=update)


@pytest.mark.parametrize(
    "how, message",
    [
        ("three", "; got a tuple of AgentState, dict, int"),
        ("list", ", the metrics a dict of scalars; got a list"),
        ("metrics only", "; got a dict"),
        ("vector metric", r", the metrics a dict of scalars; got per_step of shape \(9, 4\)"),
        ("state", r", the state of the structure it is given \(a AgentState\); got a AgentSt"),
        ("int name", r", the metrics' names str; got \[1\]"),
        ("reserved name", r"the metrics \['num_updates'\] would overwrite the metrics line's"),
        ("None metric", r", the metrics a dict of numeric scalars; got n \(NoneType\)"),
        ("dtype", r"shapes and dtypes it is given; got num_updates int32\[\] -> float32\[\]"),
        ("shape", r"shapes and dtypes it is given; got key uint32\[2\] -> uint32\[2, 2\]"),
    ],
)
def test_an_update_that_breaks_its_contract_is_named_where_it_is_traced(how, message):
  from offpolicy_ac.training import TrainConfig
  from offpolicy_ac.training import make_train
  from offpolicy_ac.training import train

  prefix = r"impala's update\(state, batch\) must return \(state, metrics\)"
  config = TrainConfig.of(env_id="gymnax:CartPole-v1", num_envs=4, unroll_length=8,
                          total_env_steps=64, eval_every=0)  # fmt: skip
  compiled = make_train(lambda spec, c: _broken(spec, c, how), agents.ImpalaConfig(), config)
  with pytest.raises(ValueError, match=prefix + ".*" + message):
    compiled.train(jax.random.PRNGKey(0), compiled.hyperparams)
  config = config.replace(env_id="CartPole-v1", checkpoint_every=0)
  with pytest.raises(ValueError, match=prefix + ".*" + message):
    factory = lambda spec: _broken(spec, agents.ImpalaConfig(), how)  # noqa: E731
    train(factory, config, [_NoLogger()])


def test_settings_of_the_wrong_type_are_refused_by_name():
  from offpolicy_ac.training import TrainConfig
  from offpolicy_ac.training import make_train

  for fields, message in [
      (dict(env_id=5), r"env_id must be a task id \(a non-empty str\), got 5"),
      (dict(normalize_observations="no"), "normalize_observations must be True or False"),
      (dict(vmap_seeds=1), "vmap_seeds must be True or False, got 1"),
      (dict(max_episode_steps=2.0), "max_episode_steps must be a positive int, got 2.0"),
      (dict(max_episode_steps=True), "max_episode_steps must be a positive int, got True"),
      (dict(num_envs=np.int64(8)), r"num_envs must be .*\(numpy.int64, not int: pass int"),
  ]:
    with pytest.raises(ValueError, match=message):
      TrainConfig.of(**fields).validate()
  with pytest.raises(ValueError, match="shared_torso must be True or False, got 'no'"):
    make_train(agents.make_impala, agents.ImpalaConfig(shared_torso="no"),
               TrainConfig.of(env_id="gymnax:CartPole-v1"))  # fmt: skip
  with pytest.raises(ValueError, match="agent_config must be the agent's config dataclass"):
    make_train(agents.make_impala, None, TrainConfig.of(env_id="gymnax:CartPole-v1"))


def _acting_out_of_range(spec, config):
  """IMPALA whose policy adds the task's number of actions to each action it samples, as a
  network with more logits than the task has actions would produce."""
  agent = agents.make_impala(spec, config)

  def act(params, obs, key):
    action, extras = agent.act(params, obs, key)
    return action + spec.num_actions, extras

  return agent._replace(act=act)


def test_a_compiled_run_whose_policy_acts_out_of_range_stops_naming_it():
  from offpolicy_ac.training import TrainConfig
  from offpolicy_ac.training import drive
  from offpolicy_ac.training import make_train
  from offpolicy_ac.training.compiled_program import CompiledProgram

  config = TrainConfig.of(env_id="gymnax:CartPole-v1", num_envs=4, unroll_length=8,
                          total_env_steps=64, eval_every=0)  # fmt: skip
  stock = make_train(agents.make_impala, agents.ImpalaConfig(), config)
  _, metrics = stock.train(jax.random.PRNGKey(0), stock.hyperparams)
  assert metrics["actions_valid"].all()
  compiled = make_train(_acting_out_of_range, agents.ImpalaConfig(), config)
  _, metrics = compiled.train(jax.random.PRNGKey(0), compiled.hyperparams)
  assert not metrics["actions_valid"].any()
  message = (r"impala's policy produced an action that is not in \[0, 2\) on gymnax:CartPole-v1"
             r" before env step 32 .*does its network have the task's number of actions")  # fmt: skip
  with pytest.raises(ValueError, match=message):
    drive(CompiledProgram(compiled, [0], [{}]), config, [_NoLogger()])


class _ListLogger:

  def __init__(self, run_dir, seed):
    self.where, self.lines, self.truncated, self.closed = (run_dir, seed), [], [], False
    self.summaries = []  # summary.json as each line is logged

  def log(self, record):
    self.lines.append(record)
    summary = pathlib.Path(self.where[0]) / "summary.json"
    self.summaries.append(json.loads(summary.read_text()) if summary.exists() else None)

  def truncate(self, num_lines):
    self.truncated.append(num_lines)

  def close(self):
    self.closed = True


def test_run_experiment_gives_an_added_logger_every_metrics_line(tmp_path):
  args = _args(tmp_path / "run", "CartPole-v1")
  made = []
  add = lambda run_dir, seed: made.append(_ListLogger(run_dir, seed)) or made[-1]  # noqa: E731
  factory = functools.partial(agents.make_impala, config=args.agent)
  for not_a_logger in [lambda run_dir, seed: None, "mlflow"]:
    with pytest.raises(ValueError, match="add_logger"):
      run_experiment("impala", args, factory, progress=False, add_logger=not_a_logger)
    assert not (tmp_path / "run" / "config.json").exists()
  run_experiment("impala", args, factory, progress=False, add_logger=add)
  (logger,) = made
  assert logger.where == (tmp_path / "run", args.train.budget.seed) and logger.closed
  assert logger.lines == read_metrics(tmp_path / "run") and len(logger.lines) == 2
  resumed = dataclasses.replace(args, train=args.train.replace(total_env_steps=768), resume=True)
  run_experiment("impala", resumed, factory, progress=False, add_logger=add)
  assert made[1].truncated == [2] and made[1].lines == read_metrics(tmp_path / "run")[2:]
  # While the resumed segment trains, its summary says that it is of the segment before.
  assert made[0].summaries == [None, None]
  assert all(s["env_steps"] == 512 and "resumed_since" in s for s in made[1].summaries)
  assert "resumed_since" not in json.loads((tmp_path / "run" / "summary.json").read_text())


def test_a_resume_refused_for_another_task_names_the_task_first(tmp_path):
  """The differences were shown in field order, the agent's first: four of them, and "..."
  where the task was (its change is the cause of the others, and the one to fix)."""
  args = _args(tmp_path / "run", "CartPole-v1")
  run_experiment("impala", args, functools.partial(agents.make_impala, config=args.agent),
                 progress=False)  # fmt: skip
  agent = dataclasses.replace(args.agent, gamma=0.9, lambda_=0.5, learning_rate=0.1,
                              entropy_weight=0.5)  # fmt: skip
  changed = dataclasses.replace(args, agent=agent, train=args.train.replace(env_id="Acrobot-v1"),
                                resume=True)  # fmt: skip
  with pytest.raises(ValueError) as refusal:
    run_experiment("impala", changed, functools.partial(agents.make_impala, config=agent),
                   progress=False)  # fmt: skip
  message = str(refusal.value)
  assert message.startswith('--resume: the config differs from the run\'s in env_id (the run\'s '
                            '"CartPole-v1", given "Acrobot-v1"); '), message  # fmt: skip
  assert "; and 1 more; only the step budget" in message, message


def test_a_ctrl_c_as_a_resume_is_built_leaves_the_run_as_it_was(tmp_path, monkeypatch):
  """A SIGINT before the driver's own handler is in place interrupts at once (the building
  handler's KeyboardInterrupt): config.json kept the resume's budget and `resumed` entry,
  and summary.json its `resumed_since`, so load_run took the finished run for a stopped
  one (evaluate.py scored its checkpoint)."""
  from offpolicy_ac.training import experiment

  args = _args(tmp_path / "run", "CartPole-v1")
  factory = functools.partial(agents.make_impala, config=args.agent)
  run_experiment("impala", args, factory, progress=False)
  files = {name: (tmp_path / "run" / name).read_bytes() for name in ("config.json", "summary.json")}

  def ctrl_c(config):
    raise KeyboardInterrupt

  monkeypatch.setattr(experiment, "describe_protocol", ctrl_c)  # just after the config's write
  resumed = dataclasses.replace(args, train=args.train.replace(total_env_steps=768), resume=True)
  with pytest.raises(KeyboardInterrupt):
    run_experiment("impala", resumed, factory, progress=False)
  assert {name: (tmp_path / "run" / name).read_bytes() for name in files} == files
  assert load_run(tmp_path / "run").source == "final"
  # Once it trains, a stop at once (a second signal) keeps the resume's budget and marks.
  monkeypatch.undo()

  def second_signal(*args, **kwargs):
    raise KeyboardInterrupt("SIGINT")

  monkeypatch.setattr(experiment, "drive", second_signal)
  with pytest.raises(KeyboardInterrupt):
    run_experiment("impala", resumed, factory, progress=False)
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  assert config["config"]["train"]["budget"]["total_env_steps"] == 768
  assert "resumed_since" in json.loads((tmp_path / "run" / "summary.json").read_text())


def test_a_redefined_factory_registers_again_under_its_name():
  """A notebook cell that defines and registers the agent, run again, defines other objects
  of the same names: they replace the registered ones; a built-in name stays refused."""
  cell = (
      "@dataclasses.dataclass(frozen=True)\n"
      "class CellConfig(agents.ImpalaConfig):\n"
      "  pass\n"
      "def make_cell(spec, config):\n"
      "  return agents.make_impala(spec, config)\n"
      "agents.register_agent('cell-impala', make_cell, CellConfig)\n"
  )
  scope = {"agents": agents, "dataclasses": dataclasses, "__name__": "notebook"}
  try:
    exec(cell, scope)  # pylint: disable=exec-used
    exec(cell, scope)  # pylint: disable=exec-used
    assert registry.AGENTS["cell-impala"] == (scope["make_cell"], scope["CellConfig"])
  finally:
    registry.AGENTS.pop("cell-impala", None)
  try:  # lambdas (and functions defined in functions) all share a name: not a redefinition
    agents.register_agent("lambda-agent", lambda spec, config: None, agents.ImpalaConfig)
    with pytest.raises(ValueError, match="'lambda-agent' is registered with another factory"):
      agents.register_agent("lambda-agent", lambda spec, config: 1, agents.ImpalaConfig)
  finally:
    registry.AGENTS.pop("lambda-agent", None)
  with pytest.raises(ValueError, match=r"'impala' is registered with another factory .*built in"):
    agents.register_agent("impala", lambda spec, config: None, agents.ImpalaConfig)


def _boosted(spec, config, boost=0.0):
  agent = agents.make_impala(spec, config)

  def update(state, batch):
    state, metrics = agent.update(state, batch)
    return state, {**metrics, "boost": jnp.float32(boost)}

  return agent._replace(name="boosted", update=update)


def _sized(spec, config, width=64):
  """IMPALA whose torso's width is a factory argument, not a config field."""
  sized = dataclasses.replace(config, hidden_sizes=(width, width))
  return agents.make_impala(spec, sized)._replace(config=config)


@dataclasses.dataclass(frozen=True)
class _WiderConfig(agents.ImpalaConfig):
  bonus: float = 0.5


def test_an_agent_its_run_directory_would_rebuild_otherwise_is_refused(tmp_path):
  """A setting given to the factory besides the config (a compiled run, a sweep, load_run
  and --resume rebuild the agent without it), or a config with fields the registered
  config class lacks (config.json could not be loaded back)."""
  agents.register_agent("boosted", _boosted, agents.ImpalaConfig)
  try:
    args = _args(tmp_path / "run", "CartPole-v1")
    with pytest.raises(ValueError, match=r"closes over other values .*\(1.0 in the agent's update, "
                       r"0.0 rebuilt\).*make it a field of the config class"):  # fmt: skip
      run_experiment("boosted", args, functools.partial(_boosted, config=args.agent, boost=1.0))
    agents.register_agent("sized", _sized, agents.ImpalaConfig)
    with pytest.raises(ValueError, match=r"the agent's state.params\[.*\] is float32\[256, 2\], "
                       r"and float32\[64, 2\] in the one 'sized''s factory builds.*make it a field"):  # fmt: skip
      run_experiment("sized", args, functools.partial(_sized, config=args.agent, width=256))
    wider = functools.partial(agents.make_impala, config=_WiderConfig())
    with pytest.raises(ValueError, match=r"config \(_WiderConfig\) cannot be rebuilt as "
                       r"ImpalaConfig from config.json \(unknown ImpalaConfig fields in "
                       r"config: \['bonus'\]\)"):  # fmt: skip
      run_experiment("impala", args, wider)
    assert not (tmp_path / "run").exists()
  finally:
    registry.AGENTS.pop("boosted")
    registry.AGENTS.pop("sized", None)


def _tempered(spec, config, temperature=1.0):
  """IMPALA acting on observations divided by a temperature given to the factory, in a
  helper that `act` closes over after the agent (whose walk frees temporaries)."""
  agent = agents.make_impala(spec, config)

  def scale(x):
    return x / temperature

  def act(params, obs, key):
    return agent.act(params, scale(obs), key)

  return agent._replace(act=act)


def test_a_setting_in_a_helper_after_the_agent_is_refused():
  from offpolicy_ac.training import TrainConfig
  from offpolicy_ac.training.sources import task_spec

  agents.register_agent("tempered", _tempered, agents.ImpalaConfig)
  try:
    spec = task_spec(TrainConfig.of(env_id="CartPole-v1"))
    registry.check_registered("tempered", _tempered(spec, agents.ImpalaConfig()))
    with pytest.raises(ValueError, match=r"\(5.0 in the agent's act, 1.0 rebuilt\)"):
      registry.check_registered("tempered", _tempered(spec, agents.ImpalaConfig(), 5.0))
  finally:
    registry.AGENTS.pop("tempered")


def _other_update(spec, config):
  """IMPALA with an update of other code, jitted as the agents' are (`jit_update`)."""
  from offpolicy_ac.agents import base

  agent = agents.make_impala(spec, config)

  @base.jit_update(spec, "IMPALA")
  def update(state, traj):
    return state, {"loss": 0.0}

  return agent._replace(update=update)


def test_an_update_of_other_code_is_refused_through_jit_update():
  """`jit_update`'s host check wraps the jitted update: the code check looks through it
  (every update had the wrapper's code)."""
  from offpolicy_ac.training import TrainConfig
  from offpolicy_ac.training.sources import task_spec

  spec = task_spec(TrainConfig.of(env_id="CartPole-v1"))
  with pytest.raises(ValueError, match=r"builds other update functions than the agent's"):
    registry.check_registered("impala", _other_update(spec, agents.ImpalaConfig()))
  registry.check_registered("impala", agents.make_impala(spec, agents.ImpalaConfig()))


@dataclasses.dataclass(frozen=True)
class _Net:
  width: int = 32


@dataclasses.dataclass(frozen=True)
class _NestedConfig:
  net: _Net = _Net()


def _nested(spec, config):
  sized = agents.ImpalaConfig(hidden_sizes=(config.net.width,) * 2)
  return agents.make_impala(spec, sized)._replace(config=config)


def test_a_config_that_config_json_does_not_give_back_is_refused():
  """A nested dataclass field comes back from config.json as a dict, which the factory
  cannot build from; a JAX scalar comes back as a float, the same setting."""
  from offpolicy_ac.training import TrainConfig
  from offpolicy_ac.training.sources import task_spec

  spec = task_spec(TrainConfig.of(env_id="CartPole-v1"))
  agents.register_agent("nested", _nested, _NestedConfig)
  try:
    with pytest.raises(ValueError, match=r"comes back from config.json as _NestedConfig\(net="
                       r"\{'width': 32\}\).*AttributeError"):  # fmt: skip
      registry.check_registered("nested", _nested(spec, _NestedConfig()))
  finally:
    registry.AGENTS.pop("nested")
  config = agents.ImpalaConfig(learning_rate=jnp.float32(1e-3), hidden_sizes=[64, 64])
  registry.check_registered("impala", agents.make_impala(spec, config))


def test_the_compiled_programs_bookkeeping_names_are_reserved_metrics():
  from offpolicy_ac.training import compiled_program
  from offpolicy_ac.training import learner

  assert set(compiled_program.BOOKKEEPING) <= learner.RESERVED_METRICS


class _Tiny(nn.Module):
  """A torso of one's own: one 8-unit layer over the flattened observation."""

  @nn.compact
  def __call__(self, x):
    return nn.tanh(nn.Dense(8)(x.reshape(x.shape[0], -1)))


@pytest.fixture
def tiny_torso():
  networks.register_torso("tiny", lambda observation_shape, hidden_sizes: _Tiny())
  yield
  torsos._REGISTERED.pop("tiny")  # pylint: disable=protected-access


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_a_registered_torso_trains_and_its_run_loads_it(tiny_torso, tmp_path, env_id):
  args = _args(tmp_path / "run", env_id)
  args = dataclasses.replace(args, agent=dataclasses.replace(args.agent, torso="tiny"))
  run_experiment("impala", args, functools.partial(agents.make_impala, config=args.agent),
                 progress=False)  # fmt: skip
  run = load_run(tmp_path / "run")
  kernels = [x.shape for x in jax.tree.leaves(run.params) if x.ndim == 2]
  assert (4, 8) in kernels and (64, 64) not in kernels  # the torso's, not the default MLP
  torsos._REGISTERED.pop("tiny")  # pylint: disable=protected-access  (another process)
  try:
    with pytest.raises(ValueError, match=r"unknown torso 'tiny'.*networks.register_torso"):
      load_run(tmp_path / "run")
  finally:
    networks.register_torso("tiny", lambda observation_shape, hidden_sizes: _Tiny())


def test_a_torso_name_is_refused_to_another_make_and_taken_by_a_redefined_one():
  """As register_agent: the same make again does nothing, a notebook cell run again
  replaces it, and another make under a taken name is refused (it would change the network
  that runs saved under the name load with)."""
  cell = (
      "def make_cell_torso(observation_shape, hidden_sizes):\n"
      "  return nn.Dense(4)\n"
      "networks.register_torso('cell-torso', make_cell_torso)\n"
  )
  scope = {"networks": networks, "nn": nn, "__name__": "notebook"}
  try:
    exec(cell, scope)  # pylint: disable=exec-used
    networks.register_torso("cell-torso", scope["make_cell_torso"])
    exec(cell, scope)  # pylint: disable=exec-used
    assert torsos._REGISTERED["cell-torso"] is scope["make_cell_torso"]  # pylint: disable=protected-access
    with pytest.raises(ValueError, match="torso 'cell-torso' is registered with another make "
                       r"\(make_cell_torso\): choose another name"):  # fmt: skip
      networks.register_torso("cell-torso", lambda shape, sizes: _Tiny())
  finally:
    torsos._REGISTERED.pop("cell-torso", None)  # pylint: disable=protected-access
  # A lambda, as docs/getting_started.md registers: the cell run again has the same code.
  # Lambdas of one factory share their code too; a default argument (a loop variable's
  # value) makes them other makes.
  for name, make, other in [
      ("cell-lambda", "lambda shape, sizes: nn.Dense(4)", "nn.Dense(5)"),
      ("cell-default", "lambda shape, sizes, width=4: nn.Dense(width)", "width=5"),
  ]:  # fmt: skip
    cell = f"networks.register_torso({name!r}, {make})\n"
    try:
      exec(cell, scope)  # pylint: disable=exec-used
      exec(cell, scope)  # pylint: disable=exec-used
      with pytest.raises(ValueError, match=f"'{name}' is registered with another make"):
        exec(cell.replace(other.replace("5", "4"), other), scope)  # pylint: disable=exec-used
      assert networks.make_torso(name, (3,)).features == 4
    finally:
      torsos._REGISTERED.pop(name, None)  # pylint: disable=protected-access
  # A partial, the cell run again: the same function and arguments; other arguments are
  # another make.
  cell = ("def make_wide(observation_shape, hidden_sizes, width):\n"
          "  return nn.Dense(width)\n"
          "networks.register_torso('cell-partial', functools.partial(make_wide, width=8))\n")  # fmt: skip
  scope["functools"] = functools
  try:
    exec(cell, scope)  # pylint: disable=exec-used
    exec(cell, scope)  # pylint: disable=exec-used
    assert torsos._REGISTERED["cell-partial"].func is scope["make_wide"]  # pylint: disable=protected-access
    with pytest.raises(ValueError, match="'cell-partial' is registered with another make"):
      exec(cell.replace("width=8", "width=16"), scope)  # pylint: disable=exec-used
  finally:
    torsos._REGISTERED.pop("cell-partial", None)  # pylint: disable=protected-access


def test_register_torso_refuses_what_would_not_make_a_torso():
  for name, make, message in [
      ("mlp", lambda shape, sizes: _Tiny(), "other than 'auto'"),
      ("", lambda shape, sizes: _Tiny(), "non-empty str"),
      ("x", None, "make must be callable"),
      ("x", _Tiny, "got the Module '_Tiny' itself"),  # the class, not a function making one
      ("x", _Tiny(), "got the Module"),
  ]:
    with pytest.raises(ValueError, match=message):
      networks.register_torso(name, make)
  try:
    networks.register_torso("not-a-module", lambda shape, sizes: nn.relu)
    with pytest.raises(ValueError, match="must return a flax.linen Module"):
      networks.make_torso("not-a-module", (4,))
    networks.register_torso("two-args", lambda shape: _Tiny())
    with pytest.raises(ValueError, match="torso 'two-args': make\\(observation_shape, "
                                         "hidden_sizes\\) raised TypeError"):  # fmt: skip
      networks.make_torso("two-args", (4,))
    networks.register_torso("unflattened", lambda shape, sizes: nn.Dense(8))
    with pytest.raises(ValueError, match=r"to features \[B, F\]; for B = 2 it gave \(2, 3, 8\)"):
      networks.make_torso("unflattened", (3, 4))
  finally:
    torsos._REGISTERED.pop("not-a-module", None)  # pylint: disable=protected-access
    torsos._REGISTERED.pop("unflattened", None)  # pylint: disable=protected-access
    torsos._REGISTERED.pop("two-args", None)  # pylint: disable=protected-access


def test_run_experiment_refuses_what_is_not_a_scripts_args(tmp_path):
  """A dict of the fields was an AttributeError from inside the run ('dict' object has no
  attribute 'run_dir')."""
  factory = functools.partial(agents.make_impala, config=agents.ImpalaConfig())
  for args in ({"run_dir": str(tmp_path / "run")}, presets.impala.Args):
    with pytest.raises(TypeError, match=r"run_experiment takes a script's Args \(for example "
                                        r"presets.impala.Args\(run_dir=...\)\), got"):  # fmt: skip
      run_experiment("impala", args, factory, progress=False)
  assert not (tmp_path / "run").exists()
