"""The scripts' command lines: presets named, presets selected by --env-id, --preset none,
aliases and repeated flags."""

import dataclasses
import os
import pathlib

import pytest

from offpolicy_ac import cli
from offpolicy_ac import presets
from offpolicy_ac.cli import EnvPresets
from offpolicy_ac.cli import in_flag_terms
from offpolicy_ac.cli import parse_args


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
      "[test] --env-id Breakout-v5: preset atari (the settings for this task; --preset none "
      "for the script's defaults)"
  )


def test_preset_none_keeps_the_defaults_and_a_named_preset_wins(capsys):
  assert _parse(["--preset", "none", "--env-id", "Pendulum-v1"]) == Args("Pendulum-v1", 1e-3)
  assert _parse(["--preset=minatar", "--env-id", "Pendulum-v1"]) == Args("Pendulum-v1", 3e-3)
  assert _parse([]) == Args()  # the default env selects nothing
  assert capsys.readouterr().out == ""


def test_bad_presets_are_refused():
  with pytest.raises(ValueError, match=r"--preset mujoco: choose one of \['atari', 'minatar', "):
    _parse(["--preset", "mujoco"])
  with pytest.raises(ValueError, match=r"name presets \['mujoco'\] that are not among"):
    parse_args(Args, PRESETS, argv=[], env_presets=EnvPresets({"Hopper-v4": "mujoco"}))
  with pytest.raises(ValueError, match="'none' is reserved"):
    parse_args(Args, {**PRESETS, "none": Args()}, argv=[])
  # Two presets: the last replaced the first silently.
  with pytest.raises(ValueError, match=r"--preset is given 2 times \(atari, minatar\)"):
    _parse(["--preset", "atari", "--preset", "minatar"])
  assert _parse(["--preset", "atari", "--preset=atari"]) == _parse(["--preset", "atari"])


_SELECTED = [("Pendulum-v1", "pendulum"), ("Walker2d-v4", "mujoco"),
             ("gymnax:Asterix-MinAtar", "minatar"), ("brax:halfcheetah", "brax")]  # fmt: skip


@pytest.mark.parametrize(
    "script, env_id, preset",
    [(script, *pair) for script in ("impala", "acer") for pair in _SELECTED]
    + [("impala", "HalfCheetah-v4", "mujoco"), ("acer", "HalfCheetah-v4", "halfcheetah")],
)
def test_actor_critics_select_their_tuned_presets(script, env_id, preset, capsys):
  module = getattr(presets, script)
  args = parse_args(module.Args, module.PRESETS, argv=["--env-id", env_id],
                    env_presets=module.ENV_PRESETS)  # fmt: skip
  assert args.train == module.PRESETS[preset].train.replace(env_id=env_id)
  assert args.agent == module.PRESETS[preset].agent
  assert f"preset {preset}" in capsys.readouterr().out


@pytest.mark.parametrize("script", ["impala", "acer", "sql", "sqil"])
def test_every_script_selects_only_its_own_presets(script):
  module = getattr(presets, script)
  assert set(module.ENV_PRESETS.names()) <= set(module.PRESETS)
  assert module.ENV_PRESETS.select("Pendulum-v1") == "pendulum"
  assert module.ENV_PRESETS.select("Breakout-v5") == "atari"


@pytest.mark.parametrize(
    "env_id, preset, reward_scale",
    [("HalfCheetah-v4", "halfcheetah", 30.0), ("Hopper-v4", "hopper", 10.0),
     ("Walker2d-v4", "walker2d", 10.0), ("Ant-v4", "ant", 300.0)],
)  # fmt: skip
def test_sql_selects_the_reward_scale_per_mujoco_task(env_id, preset, reward_scale):
  sql = presets.sql
  args = parse_args(sql.Args, sql.PRESETS, argv=["--env-id", env_id],
                    env_presets=sql.ENV_PRESETS)  # fmt: skip
  assert args.train == sql.PRESETS[preset].train and args.train.env.env_id == env_id
  # The authors' reward scale (softqlearning: 30, 30, 10, 300; on Hopper ours is 10) as a
  # temperature: alpha = (rewards' scale) / reward_scale, to two significant digits (as the
  # preset literals are written).
  assert args.agent.alpha == float(f"{args.train.transform.reward_scale / reward_scale:.2g}")
  assert args.agent.num_q_networks == 2 and args.agent.num_particles == 16
  # Hopper's preset cools the step size down over the last 10% of the updates.
  assert args.learning_rate_cooldown == (0.1 if preset == "hopper" else 0.0)


def test_sqil_selects_its_halfcheetah_preset(capsys):
  sqil = presets.sqil
  args = parse_args(sqil.Args, sqil.PRESETS, env_presets=sqil.ENV_PRESETS,
                    argv=["--env-id", "HalfCheetah-v4", "--demos", "hc.npz"])  # fmt: skip
  assert args.train == sqil.PRESETS["halfcheetah"].train and args.demos == "hc.npz"
  assert args.agent.num_q_networks == 2 and args.agent.value_proposal_std == 0.1
  assert "preset halfcheetah" in capsys.readouterr().out


@pytest.mark.parametrize("script", ["impala", "acer", "sql"])
def test_each_minatar_game_selects_the_minatar_preset(script):
  module = getattr(presets, script)
  for game in ("Breakout", "Asterix", "Freeway", "SpaceInvaders"):
    env_id = f"gymnax:{game}-MinAtar"
    args = parse_args(module.Args, module.PRESETS, argv=["--env-id", env_id],
                      env_presets=module.ENV_PRESETS)  # fmt: skip
    assert args.train == module.PRESETS["minatar"].train.replace(env_id=env_id)
    assert args.agent == module.PRESETS["minatar"].agent


def test_the_preset_flag_may_come_anywhere_and_is_listed_in_help(capsys):
  assert _parse(["--learning-rate", "1e-2", "--preset", "minatar"]) == Args(
      "gymnax:Breakout-MinAtar", 1e-2
  )
  with pytest.raises(SystemExit):
    _parse(["--help-all"])
  assert "--preset {atari,minatar,pendulum,none}" in capsys.readouterr().out
  with pytest.raises(SystemExit):
    _parse(["--help"])
  assert "atari (Atari tasks), minatar (gymnax:*-MinAtar), pendulum (Pendulum-v1); none: " in (
      " ".join(capsys.readouterr().out.split())
  )


@pytest.mark.parametrize("script", ["sql", "sqil"])
def test_lambda_on_a_preset_of_1_step_targets_is_one_flag_not_two(script):
  """The pendulum presets set n_step 1: --lambda alone is not "both given"."""
  module = getattr(presets, script)
  args = parse_args(module.Args, module.PRESETS, argv=["--preset", "pendulum", "--lambda", "0.5"])
  assert (args.agent.n_step, args.agent.lambda_) == (1, 0.5)
  args.agent.validate()


@pytest.mark.parametrize("script", ["impala", "sql"])
@pytest.mark.parametrize("flag", ["--lambda", "--lambda_"])
def test_lambda_is_accepted_with_and_without_the_underscore(script, flag):
  module = getattr(presets, script)
  args = parse_args(module.Args, module.PRESETS, argv=[flag, "0.9"])
  assert args.agent.lambda_ == 0.9


@pytest.mark.parametrize(
    "message, expected",
    [
        ("num_envs (16) must divide evenly over learner_devices (3)",
         "--num-envs (16) must divide evenly over --learner-devices (3)"),
        ("lambda_ must lie in [0.0, 1.0], got 1.5", "--lambda must lie in [0.0, 1.0], got 1.5"),
        ("n_step=7 with lambda_=0.9", "--n-step=7 with --lambda=0.9"),
        # A name without an underscore is a setting where it starts the message.
        ("seed must be an int >= 0, got -1", "--seed must be an int >= 0, got -1"),
        ("gamma must lie in [0.0, 1.0], got 1.5", "--gamma must lie in [0.0, 1.0], got 1.5"),
        ("values must be finite", "values must be finite"),
        # A loss's check names its argument in backticks; starting the message, a setting.
        ("`n_step` must be an int >= 1, got 0", "--n-step must be an int >= 1, got 0"),
        ("`values` must be finite", "`values` must be finite"),
        # So is one a resume's refusal lists with its values; other words stay.
        ("differs from the run's in gamma (the run's 0.9, given 0.99); lambda_ (the run's 0.95, "
         "given 1.0); tau (the run's 1, given 2)",
         "differs from the run's in --gamma (the run's 0.9, given 0.99); --lambda (the run's "
         "0.95, given 1.0); tau (the run's 1, given 2)"),
        # Flags, paths, longer names and words of the sentence stay as they are.
        ("--num-envs 0: seed must be >= 0", "--num-envs 0: seed must be >= 0"),
        ("/runs/num_envs/x and my_num_envs", "/runs/num_envs/x and my_num_envs"),
        ("the setting {'learning_rate': inf}: learning_rate must be finite",
         "the setting {'learning_rate': inf}: --learning-rate must be finite"),
        # Not a setting: after --sweep (field names), in quotes, a file name or a path.
        ("--sweep learning_rate: a value is repeated",
         "--sweep learning_rate: a value is repeated"),
        ('differs in {"num_envs": 16}; its `env_id`', 'differs in {"num_envs": 16}; its `env_id`'),
        ("num_envs.json, C:\\runs\\num_envs, num_envs.",
         "num_envs.json, C:\\runs\\num_envs, --num-envs."),
    ],
)  # fmt: skip
def test_script_errors_name_the_flags_users_type(message, expected):
  assert in_flag_terms(message, presets.sql.Args) == expected
  assert in_flag_terms(message, type(None)) == message  # a plain script's args: no fields


@pytest.mark.parametrize(
    "algo, argv, expected",
    [
        ("acer", ["--replay-ratio", "0"], "--replay-ratio must be at least 1 (the replayed "
         "updates after each on-policy update, of which the training loop runs at least one), "
         "got 0"),
        ("acer", ["--preset", "pendulum", "--replay-ratio=-2"], "--replay-ratio must be at "
         "least 1"),
    ],
)  # fmt: skip
def test_errors_raised_while_parsing_name_only_flags(algo, argv, expected):
  """An `Args.__post_init__` refusal is raised inside tyro, before the script has its args
  to translate field names with (`script_main` prints it as raised): the message itself
  names only flags, none that the script refuses (`DERIVED_FLAGS`)."""
  module = getattr(presets, algo)
  with pytest.raises(ValueError) as info:
    parse_args(module.Args, module.PRESETS, argv=argv, env_presets=module.ENV_PRESETS)
  message = str(info.value)
  assert message.startswith(expected), message
  assert in_flag_terms(message, module.Args) == message  # no field names to translate
  assert not any(flag in message for flag in getattr(module.Args, "DERIVED_FLAGS", {}))


def test_sweep_is_repeated_one_field_per_flag():
  argv = ["--sweep", "learning_rate=1e-3,3e-3", "--sweep=gamma=0.99,0.995", "--seed", "1"]
  args = parse_args(presets.impala.Args, presets.impala.PRESETS, argv=argv)
  assert args.train.budget.sweep == ("learning_rate=1e-3,3e-3", "gamma=0.99,0.995")
  assert args.train.budget.seed == 1
  assert parse_args(presets.impala.Args, argv=[]).train.budget.sweep == ()


def test_an_output_file_is_checked_before_the_work(tmp_path, monkeypatch):
  from offpolicy_ac.cli import check_output_file  # pylint: disable=import-outside-toplevel

  assert check_output_file("--out", tmp_path / "new" / "x.json") == tmp_path / "new" / "x.json"
  with pytest.raises(ValueError, match="is a directory: give a file path"):
    check_output_file("--out", tmp_path)
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match="is a file, not a directory"):
    check_output_file("--out", tmp_path / "file" / "x.json")
  # Not writable (root may write anywhere, so the permission is what the OS answers).
  (tmp_path / "x.json").write_text("")
  monkeypatch.setattr("os.access", lambda path, mode: pathlib.Path(path) != tmp_path / "x.json")
  with pytest.raises(ValueError, match=f"{tmp_path / 'x.json'} is not writable"):
    check_output_file("--out", tmp_path / "x.json")
  monkeypatch.undo()
  # A folder that takes no file though the permissions say it does (root, who may write
  # anywhere: a read-only mount, /proc) is tried, not asked: the error came after the work.
  if pathlib.Path("/proc").is_dir() and os.access("/proc", os.W_OK):
    with pytest.raises(ValueError, match=r"--out /proc/x.json: /proc takes no new file \("):
      check_output_file("--out", "/proc/x.json")
    with pytest.raises(ValueError, match=r"/proc takes no new file .*: choose another --out-dir"):
      check_output_file("--out-dir", "/proc/plots/<env_id>.png")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  (tmp_path / "home").mkdir()
  assert check_output_file("--out", "~/x.json") == tmp_path / "home" / "x.json"


def test_check_command_reads_a_scripts_flags_quietly_and_names_them_when_refused(capsys):
  args = presets.check_command("sql", ["--env-id", "gymnax:Breakout-MinAtar", "--seed", "3"])
  assert args == dataclasses.replace(
      presets.sql.PRESETS["minatar"],
      train=presets.sql.PRESETS["minatar"].train.replace(seed=3),
  )
  acer = presets.check_command("acer", ["--replay-ratio", "2"])
  assert acer.agent.replay_ratio == 2
  assert capsys.readouterr() == ("", "")  # no preset line, no tyro box
  refused = [
      ("impala", ["--total-env-steps", "10"], "impala.py --total-env-steps 10: one iteration"),
      ("acer", ["--replay-buffer-size", "1"], "Unrecognized options: --replay-buffer-size"),
      ("sql", ["--num-envs", "x"], "Error parsing --num-envs: invalid literal for int()"),
      ("sqil", ["--demos", "d.npz", "--preset", "minatar"], "--preset minatar: choose one of"),
      ("ppo", [], "unknown algorithm 'ppo'; known: ['acer', 'impala', 'sqil', 'sql']"),
      ("impala", ["--gamma", "2"], "impala.py --gamma 2: gamma must lie in [0.0, 1.0], got 2.0"),
      ("impala", ["--hidden-sizes"], "hidden_sizes must be positive ints, got []"),
      ("sqil", [], "Missing from"),  # and which flag:
      ("sqil", [], "--demos STR"),
      ("sql", ["--preset"], "argument --preset: expected one argument"),
      ("impala", ["--env-id", "CartPol-v1"], "unknown task id 'CartPol-v1'; did you mean"),
      # A JAX environment's id, as the scripts refuse it (benchmarks launched the run first).
      ("impala", ["--env-id", "gymnax:Foo"], "--env-id gymnax:Foo: unknown task 'Foo' in"),
  ]
  for algo, argv, message in refused:
    with pytest.raises(ValueError) as info:
      presets.check_command(algo, argv)
    assert message in str(info.value), str(info.value)
  with pytest.raises(TypeError, match="argv is a sequence of arguments"):
    presets.check_command("impala", "--seed 3")
  assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(
    "argv, refused",
    [
        (["--obs-clip", "10"], "--obs-clip 10.0 has no effect in this run: it applies with "
                               "--normalize-observations"),
        (["--eval-every", "0", "--eval-episodes", "3"],
         "--eval-episodes 3 has no effect in this run: it applies to evaluations"),
        (["--checkpoint-every", "0", "--keep-checkpoints", "9"],
         "--keep-checkpoints 9 has no effect in this run: it applies to checkpoints"),
        (["--no-vmap-seeds"], "--no-vmap-seeds has no effect in this run: it applies to several"),
        # Typed, though at the default's value: the user believes it applies.
        (["--eval-every", "0", "--eval-episodes", "5"],
         "--eval-episodes 5 has no effect in this run: it applies to evaluations"),
        (["--grace-period-s", "0.5"],
         "--grace-period-s 0.5 has no effect in this run: it applies to --actors pools with "
         "--min-pools"),
        (["--obs_clip=5"], "--obs-clip 5.0 has no effect in this run"),
        # Seeds that cannot be vmapped run one after the other, whatever --vmap-seeds says.
        (["--num-seeds", "2", "--vmap-seeds", "--actors", "async", "--num-actors", "2"],
         "--vmap-seeds has no effect in this run: it applies to several seeds"),
        (["--num-seeds", "2", "--vmap-seeds", "--learner-devices", "2"],
         "--vmap-seeds has no effect in this run: it applies to several seeds"),
    ],
)  # fmt: skip
def test_a_flag_without_effect_in_its_run_is_refused(argv, refused):
  with pytest.raises(ValueError) as e:
    parse_args(presets.impala.Args, presets.impala.PRESETS, argv=argv)
  assert str(e.value).startswith(refused)


@pytest.mark.parametrize(
    "script, argv",
    [
        ("impala", ["--normalize-observations", "--obs-clip", "10"]),
        ("impala", ["--num-seeds", "2", "--no-vmap-seeds"]),
        ("impala", ["--checkpoint-every", "0"]),
        # A preset's own settings are not the user's: its eval_episodes 4, unused here.
        ("sql", ["--preset", "pendulum", "--eval-every", "0"]),
    ],
)
def test_settings_of_a_preset_or_with_effect_are_accepted(script, argv):
  module = getattr(presets, script)
  parse_args(module.Args, module.PRESETS, argv=argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--num-updates-per-train-iter", "1"],  # the default: was accepted, then replaced
        ["--num_updates_per_train_iter=4", "--replay-ratio", "4"],
    ],
)
def test_a_flag_the_script_sets_itself_is_refused_whatever_its_value(argv):
  with pytest.raises(ValueError, match="^--num-updates-per-train-iter: ACER sets the replayed "
                     "updates per iteration from --replay-ratio"):  # fmt: skip
    parse_args(presets.acer.Args, presets.acer.PRESETS, argv=argv)
  # Another script's Args declares no such flag: the same flag is its own setting.
  impala = parse_args(presets.impala.Args, presets.impala.PRESETS,
                      argv=["--num-updates-per-train-iter", "2"])  # fmt: skip
  assert impala.train.replay.num_updates_per_train_iter == 2


def test_a_bad_value_is_refused_for_itself_not_as_without_effect():
  with pytest.raises(ValueError, match="eval_every must be an int >= 0"):
    parse_args(presets.impala.Args, presets.impala.PRESETS,
               argv=["--eval-every", "-1", "--eval-episodes", "3"]).train.validate()  # fmt: skip


def test_out_of_memory_is_one_line_with_the_gib_and_for_a_training_run_its_sizes():
  import jax
  import jax.numpy as jnp

  from offpolicy_ac.presets import sql

  with pytest.raises(jax.errors.JaxRuntimeError) as e:
    jnp.zeros(2**50, jnp.uint8).block_until_ready()
  assert cli.is_out_of_memory(e.value) and not cli.is_out_of_memory(RuntimeError("x"))
  said = "RESOURCE_EXHAUSTED: Out of memory allocating 1125899906842624 bytes (1,048,576.0 GiB)"
  assert cli.out_of_memory_message(e.value, dict) == said
  assert cli.out_of_memory_message(e.value, sql.Args).startswith(
      f"{said}; the checkpoints written are intact: smaller sizes (--num-envs, "
  )


@pytest.mark.parametrize("script", ["evaluate", "plot", "record_demos"])
def test_scripts_without_presets_parse_under_python_OO(script):
  """`python -OO` strips docstrings: a script's description is then None."""
  import subprocess
  import sys

  root = pathlib.Path(__file__).parents[1]
  proc = subprocess.run([sys.executable, "-OO", str(root / "experiments" / f"{script}.py"),
                         "--help"], capture_output=True, text=True, timeout=300)  # fmt: skip
  assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr[-3000:]
