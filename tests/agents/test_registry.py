"""agents.registry: what a run directory's config.json rebuilds. A registered agent's
config must come back from the JSON round trip as it is (an Enum or a function came back as
its str: `load_run` rebuilt another agent, silently, and `--resume` was refused), and an
algorithm's name must be a file name of its own (it begins the default run directory's)."""

import dataclasses
import enum
import functools
import json
from typing import Callable

import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import agents
from offpolicy_ac import presets
from offpolicy_ac.agents import registry
from offpolicy_ac.analysis.metrics_file import config_jsonable
from offpolicy_ac.training import run_experiment


class Eval(enum.Enum):
  ARGMAX = "argmax"
  FIRST_ACTION = "first"


class StrEval(str, enum.Enum):  # equal to its value, but another type comes back
  ARGMAX = "argmax"


@dataclasses.dataclass(frozen=True)
class EnumConfig(agents.ImpalaConfig):
  eval_mode: Eval = Eval.ARGMAX


@dataclasses.dataclass(frozen=True)
class StrEnumConfig(agents.ImpalaConfig):
  eval_mode: StrEval = StrEval.ARGMAX


@dataclasses.dataclass(frozen=True)
class FunctionConfig(agents.ImpalaConfig):
  squash: Callable = jnp.tanh


@dataclasses.dataclass(frozen=True)
class IntKeysConfig(agents.ImpalaConfig):
  weights: tuple = ({1: 0.5},)


def _make(spec, config):
  """IMPALA built from a config class of one's own (the extra fields unused)."""
  return agents.make_impala(spec, agents.ImpalaConfig(learning_rate=config.learning_rate))._replace(
      config=config
  )


@pytest.mark.parametrize(
    "config_cls, field, value, back",
    [
        (EnumConfig, "eval_mode", "<Eval.ARGMAX: 'argmax'>", "'Eval.ARGMAX'"),
        (StrEnumConfig, "eval_mode", "<StrEval.ARGMAX: 'argmax'>", "'argmax'"),
        (FunctionConfig, "squash", "<PjitFunction of <function tanh", "'<PjitFunction"),
        (IntKeysConfig, "weights", "({1: 0.5},)", "({'1': 0.5},)"),
    ],
    ids=["enum", "str-enum", "function", "int-keys"],
)
def test_a_config_that_config_json_does_not_give_back_is_refused_by_field(
    cartpole_spec, config_cls, field, value, back
):
  name = f"custom-{config_cls.__name__}"
  agents.register_agent(name, _make, config_cls)
  try:
    agent = _make(cartpole_spec, config_cls())
    with pytest.raises(ValueError) as refused:
      registry.check_registered(name, agent)
  finally:
    registry.AGENTS.pop(name)
  message = str(refused.value)
  assert f"config ({config_cls.__name__}) does not come back from config.json" in message
  assert f"in {field} = {value}" in message and f"(back: {back}" in message
  assert "make each field a JSON value (a number, string, bool, None" in message


def test_a_config_of_an_enum_is_refused_before_anything_is_written(tmp_path):
  agents.register_agent("custom-enum", _make, EnumConfig)
  args = presets.impala.Args()
  train = args.train.replace(total_env_steps=512, eval_every=0, log_every=256)
  args = dataclasses.replace(args, agent=EnumConfig(), train=train, run_dir=str(tmp_path / "r"))
  try:
    with pytest.raises(ValueError, match=r"in eval_mode = <Eval.ARGMAX: 'argmax'> \(back: "):
      run_experiment("custom-enum", args, functools.partial(_make, config=args.agent))
  finally:
    registry.AGENTS.pop("custom-enum")
  assert not (tmp_path / "r").exists()


def test_numbers_lists_and_infinities_come_back_as_they_are(cartpole_spec):
  """Lists come back as tuples, NumPy and JAX scalars as the numbers they hold, inf as inf
  (`config_from_dict`): the same settings, kept."""
  config = agents.ImpalaConfig(
      learning_rate=jnp.float32(1e-3),
      gamma=np.float64(0.9),
      hidden_sizes=[32, 32],
      max_grad_norm=float("inf"),
  )
  registry.check_registered("impala", agents.make_impala(cartpole_spec, config))


@pytest.mark.parametrize("algorithm", ["impala", "acer", "sql", "sqil"])
@pytest.mark.parametrize("spec_name", ["cartpole_spec", "pendulum_spec"])
def test_every_built_in_agent_passes_on_discrete_and_continuous_actions(
    algorithm, spec_name, request
):
  make_agent, config_cls = registry.AGENTS[algorithm]
  registry.check_registered(algorithm, make_agent(request.getfixturevalue(spec_name), config_cls()))


@pytest.mark.parametrize("algo", ["impala", "acer", "sql", "sqil"])
def test_every_presets_config_comes_back_from_config_json(algo):
  module = getattr(presets, algo)
  config_cls = registry.AGENTS[algo][1]
  for name, args in module.PRESETS.items():
    config = args.agent
    back = registry.config_from_dict(config_cls, json.loads(json.dumps(config_jsonable(config))))
    registry._check_config_survives(config, back)  # pylint: disable=protected-access
    assert back == config, name


@pytest.mark.parametrize("name", ["my/ac", "my\\ac", " ac", "ac ", "ac\n", "a\tc", "a\x00c"])
def test_an_algorithm_name_that_is_no_file_name_of_its_own_is_refused(name):
  with pytest.raises(ValueError, match="must not hold a path separator"):
    agents.register_agent(name, _make, EnumConfig)
  assert name not in registry.AGENTS


def test_an_algorithm_name_with_dots_dashes_and_inner_spaces_is_taken():
  for name in ["my-ac.v2", "my ac", "ac_2"]:
    agents.register_agent(name, _make, EnumConfig)
    registry.AGENTS.pop(name)
