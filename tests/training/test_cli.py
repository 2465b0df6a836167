"""The scripts' command lines: presets named, presets selected by --env-id, --preset none."""

import dataclasses

import pytest

from offpolicy_ac.training import EnvPresets
from offpolicy_ac.training import parse_args
from tests.scripts import load_script


@dataclasses.dataclass(frozen=True)
class Args:
  env_id: str = "CartPole-v1"
  learning_rate: float = 1e-3


PRESETS = {
    "pendulum": Args("Pendulum-v1", 3e-4),
    "minatar": Args("gymnax:Breakout-MinAtar", 3e-3),
    "atari": Args("Pong-v5", 6e-4),
}
ENV_PRESETS = EnvPresets({"Pendulum-v1": "pendulum", "gymnax:*-MinAtar": "minatar"}, "atari")


def _parse(argv):
  return parse_args(Args, PRESETS, argv=argv, env_presets=ENV_PRESETS, prog="test")


@pytest.mark.parametrize(
    "env_id, preset",
    [
        ("Pendulum-v1", "pendulum"),
        ("gymnax:Asterix-MinAtar", "minatar"),
        ("Breakout-v5", "atari"),
        ("CartPole-v1", None),
        ("gymnax:CartPole-v1", None),
        ("HalfCheetah-v4", None),
    ],
)
def test_an_env_id_selects_its_preset(env_id, preset):
  assert ENV_PRESETS.select(env_id) == preset


@pytest.mark.parametrize("form", [["--env-id", "Breakout-v5"], ["--env-id=Breakout-v5"]])
def test_a_selected_preset_is_applied_and_announced_first(form, capsys):
  args = _parse([*form, "--learning-rate", "1e-2"])
  assert args == Args("Breakout-v5", 1e-2)  # the preset, then the flags over it
  first = capsys.readouterr().out.splitlines()[0]
  assert first == (
      "[test] --env-id Breakout-v5: preset atari (its tuned settings; --preset none for the "
      "script's defaults)"
  )


def test_preset_none_keeps_the_defaults_and_a_named_preset_wins(capsys):
  assert _parse(["--preset", "none", "--env-id", "Pendulum-v1"]) == Args("Pendulum-v1", 1e-3)
  assert _parse(["--preset=minatar", "--env-id", "Pendulum-v1"]) == Args("Pendulum-v1", 3e-3)
  assert _parse([]) == Args()  # the default env selects nothing
  assert capsys.readouterr().out == ""


def test_bad_presets_are_refused():
  with pytest.raises(SystemExit, match=r"--preset takes one of \['atari', 'minatar', "):
    _parse(["--preset", "mujoco"])
  with pytest.raises(ValueError, match=r"name presets \['mujoco'\] that are not among"):
    parse_args(Args, PRESETS, argv=[], env_presets=EnvPresets({"Hopper-v4": "mujoco"}))
  with pytest.raises(ValueError, match="'none' is reserved"):
    parse_args(Args, {**PRESETS, "none": Args()}, argv=[])


@pytest.mark.parametrize(
    "env_id, preset",
    [("Pendulum-v1", "pendulum"), ("HalfCheetah-v4", "mujoco"), ("Walker2d-v4", "mujoco")],
)
def test_impala_selects_its_tuned_presets(env_id, preset, capsys):
  impala = load_script("impala")
  args = parse_args(impala.Args, impala.PRESETS, argv=["--env-id", env_id],
                    env_presets=impala.ENV_PRESETS)  # fmt: skip
  assert args.train == impala.PRESETS[preset].train.replace(env_id=env_id)
  assert args.agent == impala.PRESETS[preset].agent
  assert f"preset {preset}" in capsys.readouterr().out


@pytest.mark.parametrize("script", ["impala", "acer", "sql", "sqil"])
def test_every_script_selects_only_its_own_presets(script):
  module = load_script(script)
  assert set(module.ENV_PRESETS.names()) <= set(module.PRESETS)
  assert module.ENV_PRESETS.select("Pendulum-v1") == "pendulum"
  assert module.ENV_PRESETS.select("Breakout-v5") == "atari"
