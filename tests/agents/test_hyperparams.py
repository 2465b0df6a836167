"""Hyper-parameters as data: tunable fields as (traced, vmapped) arrays, sweeps parsed and
validated before anything compiles."""

import dataclasses
import json

from agent_data import agent_trajectory as _trajectory
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import envs
from offpolicy_ac.agents import AcerConfig
from offpolicy_ac.agents import ImpalaConfig
from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents import hyperparams as hp_lib
from offpolicy_ac.agents import make_acer
from offpolicy_ac.agents import make_impala
from offpolicy_ac.agents import make_sql
from offpolicy_ac.agents import registry
from offpolicy_ac.analysis.metrics_file import config_jsonable
from offpolicy_ac.analysis.metrics_file import jsonable

AGENTS = [
    (make_impala, ImpalaConfig(), {"learning_rate": 1e-2, "gamma": 0.9, "entropy_weight": 0.1}),
    (make_acer, AcerConfig(), {"learning_rate": 1e-2, "trust_region_delta": 0.5, "clip_c": 2.0}),
    (make_sql, SqlConfig(), {"learning_rate": 1e-2, "alpha": 0.5, "target_update_tau": 0.5}),
]


@pytest.fixture(scope="module")
def cartpole_spec():
  return envs.spec("CartPole-v1", num_envs=3)


@pytest.mark.parametrize("make, config, setting", AGENTS, ids=["impala", "acer", "sql"])
def test_traced_hyperparams_give_the_update_of_the_concrete_config(cartpole_spec, make, config,
                                                                    setting):  # fmt: skip
  """An agent built inside jit from traced hyper-parameters updates exactly as the agent
  built from the concrete config; vmapped over two settings, each lane equals its own."""
  changed = dataclasses.replace(config, **setting)
  concrete = make(cartpole_spec, changed)
  state = concrete.init(jax.random.PRNGKey(0))
  traj = _trajectory(cartpole_spec, concrete, state.params, jax.random.PRNGKey(1))
  want, want_metrics = concrete.update(state, traj)

  def update(hp, state, traj):
    return make(cartpole_spec, hp_lib.with_hyperparams(config, hp)).update(state, traj)

  hp = {**hp_lib.hyperparams_of(config), **{k: jnp.float32(v) for k, v in setting.items()}}
  got, got_metrics = jax.jit(update)(hp, state, traj)
  for a, b in zip(jax.tree.leaves((want, want_metrics)), jax.tree.leaves((got, got_metrics))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)

  default_want, _ = make(cartpole_spec, config).update(state, traj)
  both = jax.tree.map(lambda d, s: jnp.stack([d, s]), hp_lib.hyperparams_of(config), hp)
  lanes, _ = jax.jit(jax.vmap(update, in_axes=(0, None, None)))(both, state, traj)
  for k, expected in enumerate((default_want, want)):
    lane = jax.tree.map(lambda x: x[k], lanes)
    for a, b in zip(jax.tree.leaves(expected.params), jax.tree.leaves(lane.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_hyperparams_of_lists_the_tunable_fields_as_float32():
  hp = hp_lib.hyperparams_of(SqlConfig(alpha=0.25))
  assert set(hp) == set(SqlConfig.TUNABLE)
  assert hp["alpha"].dtype == jnp.float32 and float(hp["alpha"]) == 0.25
  for config in (ImpalaConfig(), AcerConfig(), SqlConfig()):
    fields = {f.name for f in dataclasses.fields(config)}
    assert set(type(config).TUNABLE) <= fields


def test_parse_sweep_and_settings():
  values = hp_lib.parse_sweep(
      ImpalaConfig(), ["learning_rate=1e-3,3e-3", "gamma=0.99,0.995", "entropy-weight=0"]
  )
  assert values == {"learning_rate": [1e-3, 3e-3], "gamma": [0.99, 0.995], "entropy_weight": [0.0]}
  settings = hp_lib.sweep_settings(values)
  assert len(settings) == 4
  assert settings[0] == {"learning_rate": 1e-3, "gamma": 0.99, "entropy_weight": 0.0}
  assert settings[1]["gamma"] == 0.995 and settings[2]["learning_rate"] == 3e-3
  assert hp_lib.sweep_settings({}) == [{}]
  # A field named as its flag is: --lambda is lambda_ (it was "has no field 'lambda'").
  assert hp_lib.parse_sweep(ImpalaConfig(), ["lambda=0.9,1.0"]) == {"lambda_": [0.9, 1.0]}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("learning_rat=1e-3", "has no field 'learning_rat'"),
        ("hidden_sizes=32,64", "'hidden_sizes' is a static field"),
        ("optimizer=1", "'optimizer' is a static field"),
        ("gamma=0.9,1.5", "gamma must lie in"),
        ("learning_rate=-1", "learning_rate must be > 0"),
        ("learning_rate", "FIELD=V1,V2"),
        ("learning_rate=fast", "must be numbers"),
        ("gamma=0.9,0.9", "repeated"),
    ],
)
def test_a_bad_sweep_names_what_is_wrong(spec, message):
  with pytest.raises(ValueError, match=message):
    hp_lib.parse_sweep(ImpalaConfig(), [spec])


@pytest.mark.parametrize("config", [ImpalaConfig(), AcerConfig(), SqlConfig()], ids=type)
@pytest.mark.parametrize(
    "setting, message",
    [
        ({"learning_rate": -3e-3}, "learning_rate must be > 0"),
        ({"learning_rate": 0.0}, "learning_rate must be > 0"),
        ({"learning_rate": float("nan")}, "learning_rate must be > 0"),
        ({"learning_rate": float("inf")}, "learning_rate must be finite"),
        ({"max_grad_norm": -1.0}, "max_grad_norm must be > 0"),
        ({"learning_rate": "fast"}, "the setting of learning_rate must be a number, got 'fast'"),
    ],
)
def test_every_agent_refuses_a_step_size_out_of_range(config, setting, message):
  # SQL's were checked only when its optimizer was built, which a swept (traced) value
  # skips: a sweep trained with a negative learning rate.
  with pytest.raises(ValueError, match=message):
    hp_lib.check_setting(config, setting)
  hp_lib.check_setting(config, {"max_grad_norm": float("inf")})  # no clipping


@pytest.mark.parametrize("config", [ImpalaConfig(), AcerConfig()], ids=type)
def test_an_infinite_optimizer_eps_is_refused(config):
  # Adam's step is lr * m / (sqrt(v) + eps): at eps inf every step is 0, silently.
  with pytest.raises(ValueError, match="optimizer_eps must be finite"):
    dataclasses.replace(config, optimizer_eps=float("inf")).validate()


@pytest.mark.parametrize("sweep", [["gamma=,"], ["gamma= , "]])
def test_a_sweep_field_without_values_is_refused(sweep):
  # parse_sweep returned {"gamma": []}: a run of no learners that the command check passed.
  with pytest.raises(ValueError, match="no value"):
    hp_lib.parse_sweep(ImpalaConfig(), sweep)
  with pytest.raises(ValueError, match="a list of FIELD=V1,V2,... strings"):
    hp_lib.parse_sweep(ImpalaConfig(), "gamma=0.9")


@pytest.mark.parametrize("listed", ["1e-3,,3e-3", "1e-3,3e-3,", "1e-3, ,3e-3"])
def test_a_sweep_with_a_missing_value_is_refused(listed):
  # The empty value was dropped: a sweep of fewer settings than written, without a word.
  with pytest.raises(ValueError, match=f"--sweep learning_rate: a value is missing in '{listed}'"):
    hp_lib.parse_sweep(ImpalaConfig(), [f"learning_rate={listed}"])


def test_a_combination_out_of_range_is_refused():
  """rho-bar >= c-bar holds per value but not for the combination."""
  with pytest.raises(ValueError, match="clip_rho_threshold >= clip_c_threshold"):
    hp_lib.check_setting(ImpalaConfig(), {"clip_rho_threshold": 0.5})


def test_a_custom_config_without_validate_takes_its_settings():
  """register_agent takes any frozen dataclass; a sweep or several seeds of it ended in
  AttributeError: no `validate`."""

  @dataclasses.dataclass(frozen=True)
  class PlainConfig:
    TUNABLE = ("learning_rate",)
    learning_rate: float = 3e-3

  assert hp_lib.check_setting(PlainConfig(), {"learning_rate": 1e-3}).learning_rate == 1e-3
  assert hp_lib.check_setting(PlainConfig(), {}) == PlainConfig()  # a seed of the defaults


def test_sql_lambda_is_static():
  with pytest.raises(ValueError, match="'lambda_' is a static field"):
    hp_lib.parse_sweep(SqlConfig(), ["lambda_=0.5"])


def test_concrete_hyperparams_are_checked_inside_a_trace(cartpole_spec):
  """A concrete array compared inside a `lax.cond` branch would be traced: the checks
  compare it on the host, so an eager compiled run (its evaluation is a cond branch)
  refuses a bad value instead of failing on a traced bool."""
  good = hp_lib.with_hyperparams(ImpalaConfig(), {"gamma": jnp.float32(0.9)})
  bad = hp_lib.with_hyperparams(ImpalaConfig(), {"gamma": jnp.float32(2.0)})
  make = lambda config: (make_impala(cartpole_spec, config), jnp.float32(0.0))[1]  # noqa: E731
  jax.lax.cond(True, lambda: make(good), lambda: jnp.float32(0.0))
  with pytest.raises(ValueError, match=r"gamma must lie in \[0.0, 1.0\], got 2.0"):
    jax.lax.cond(True, lambda: make(bad), lambda: jnp.float32(0.0))


@pytest.mark.parametrize("shape", [(3,), (1,)])
def test_a_hyperparameter_that_is_not_a_scalar_is_refused_by_name(shape):
  # Several values are several learners: vmap over them. Unchecked, (3,) failed deep in
  # the optimizer and (1,) trained silently.
  with pytest.raises(
      ValueError, match=rf"'learning_rate' must be a scalar, got shape \({shape[0]},\)"
  ):
    hp_lib.with_hyperparams(ImpalaConfig(), {"learning_rate": jnp.full(shape, 1e-3)})
  each = lambda lr: hp_lib.with_hyperparams(ImpalaConfig(), {"learning_rate": lr}).learning_rate
  assert jax.vmap(each)(jnp.full((3,), 1e-3)).shape == (3,)


@pytest.mark.parametrize("config_cls", [ImpalaConfig, AcerConfig, SqlConfig], ids=str)
def test_infinite_settings_come_back_from_config_json(config_cls):
  # config.json held inf as null: a run with --max-grad-norm inf (no clipping) trained, then
  # could neither load nor resume ("max_grad_norm must be a number, got None").
  floats = [f.name for f in dataclasses.fields(config_cls) if isinstance(f.default, float)]
  assert "max_grad_norm" in floats
  for name in floats:
    for value in (float("inf"), float("-inf")):
      config = dataclasses.replace(config_cls(), **{name: value})
      saved = json.loads(json.dumps(config_jsonable(config), allow_nan=False))
      assert saved[name] == str(value)
      assert getattr(registry.config_from_dict(config_cls, saved), name) == value
  strings = [f.name for f in dataclasses.fields(config_cls) if isinstance(f.default, str)]
  for name in strings:  # a str setting keeps the text "inf"
    saved = config_jsonable(dataclasses.replace(config_cls(), **{name: "inf"}))
    assert getattr(registry.config_from_dict(config_cls, saved), name) == "inf"
  assert jsonable({"loss": float("inf")}) == {"loss": None}  # metrics lines: null, as before
