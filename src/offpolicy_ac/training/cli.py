"""Command lines of the experiment scripts: tyro over a frozen dataclass, with presets.

    python experiments/impala.py --env-id CartPole-v1 --seed 0      # the script's defaults
    python experiments/impala.py --preset atari --env-id Breakout-v5  # a preset, then flags

A preset is a complete Args value (`offpolicy_ac.presets`); the other flags override its
fields. Naming an environment that has a tuned preset (`EnvPresets`) with no `--preset`
applies that preset and says so on the first line of output (as rl-baselines3-zoo picks
hyper-parameters by environment); `--preset none` keeps the script's defaults.
Nested configs (`train` and its groups, `agent`) are flattened (`tyro.conf.OmitArgPrefixes`):
`--learning-rate`, not `--agent.learning-rate`, so a field's name is its flag. `FIELD_FLAGS`
adds tyro's per-field settings by that name, through tyro's constructor registry (the
configs stay plain dataclasses): `--lambda` is an alias of `--lambda_`
(`tyro.conf.arg(aliases=...)`), and `--sweep` is repeated, one setting each
(`tyro.conf.UseAppendAction`: `--sweep learning_rate=1e-3,3e-3 --sweep gamma=0.99,0.995`).

Why `--preset` and `--env-id` are read before tyro parses: tyro takes the defaults of every
field as one value given before parsing (`tyro.cli(..., default=...)`), and picking that value
from the command line is what `--preset` does. tyro's own way to choose among configs is a
positional subcommand per preset (`tyro.extras.overridable_config_cli`), which would change
the command users know (`--preset NAME`) and cannot select a preset from `--env-id`. So an
argparse parser that knows only these two flags reads them first (`parse_known_args`,
nothing removed from argv), and tyro then parses the whole command line, `--preset` included
(a field with the presets' names as choices, shown in `--help`).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import sys
from typing import Annotated
from typing import Any
from typing import Literal
from typing import Mapping
from typing import Optional
from typing import Sequence
from typing import TypeVar

import tyro
from tyro.constructors import ConstructorRegistry
from tyro.constructors import StructConstructorSpec
from tyro.constructors import StructTypeInfo

ArgsT = TypeVar("ArgsT")

FIELD_FLAGS: Mapping[str, Any] = {
    "lambda_": tyro.conf.arg(aliases=("--lambda",)),
    "sweep": tyro.conf.UseAppendAction,
}
"""tyro's settings of a field, by field name, wherever the field is in the args' tree."""

NO_PRESET = "none"
"""`--preset none`: the script's defaults, even for an environment with a tuned preset."""


@dataclasses.dataclass(frozen=True)
class EnvPresets:
  """Which preset an environment selects when the command line names none.

  Attributes:
    patterns: env-id glob pattern (fnmatch, case-sensitive) -> preset name; the first
      pattern that matches wins.
    atari: the preset of every Atari task (`envs.is_atari`), checked after `patterns`.
  """

  patterns: Mapping[str, str] = dataclasses.field(default_factory=dict)
  atari: Optional[str] = None

  def select(self, env_id: str) -> Optional[str]:
    """The preset name for `env_id`, or None if it has none."""
    for pattern, name in self.patterns.items():
      if fnmatch.fnmatchcase(env_id, pattern):
        return name
    if self.atari is not None and ":" not in env_id:
      from offpolicy_ac import envs  # envpool's registry, only when needed

      if envs.is_atari(env_id):
        return self.atari
    return None

  def names(self) -> list[str]:
    return [*self.patterns.values(), *([self.atari] if self.atari else [])]

  def describe(self) -> str:
    """The selection, one `pattern: preset` per line."""
    lines = [f"{pattern}: {name}" for pattern, name in self.patterns.items()]
    return "\n".join(lines + ([f"Atari tasks: {self.atari}"] if self.atari else []))


_REGISTRY = ConstructorRegistry()
_EXPANDING: set[type] = set()


@_REGISTRY.struct_rule
def _with_field_flags(info: StructTypeInfo) -> Optional[StructConstructorSpec]:
  """A dataclass's flags as tyro makes them, with `FIELD_FLAGS` on the fields it names."""
  kind = info.type
  if not dataclasses.is_dataclass(kind) or kind in _EXPANDING:
    return None
  if not any(f.name in FIELD_FLAGS for f in dataclasses.fields(kind)):
    return None
  _EXPANDING.add(kind)  # this rule defers to tyro's own for the fields themselves
  try:
    spec = ConstructorRegistry.get_struct_spec(info)
  finally:
    _EXPANDING.discard(kind)
  if not isinstance(spec, StructConstructorSpec):
    return None
  fields = tuple(
      dataclasses.replace(f, type=Annotated[f.type, FIELD_FLAGS[f.name]])
      if f.name in FIELD_FLAGS
      else f
      for f in spec.fields
  )
  return dataclasses.replace(spec, fields=fields)


def _read_preset_flags(argv: Sequence[str]) -> tuple[Optional[str], Optional[str]]:
  """(--preset, --env-id) as given in argv (the last of each), None where absent."""
  parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
  parser.add_argument("--preset")
  parser.add_argument("--env-id", "--env_id", dest="env_id")
  try:
    known, _ = parser.parse_known_args(argv)
  except argparse.ArgumentError as e:
    raise SystemExit(str(e)) from None
  return known.preset, known.env_id


def parse_args(
    args_cls: type[ArgsT],
    presets: Optional[dict[str, ArgsT]] = None,
    argv: Optional[Sequence[str]] = None,
    description: str = "",
    env_presets: EnvPresets = EnvPresets(),
    prog: Optional[str] = None,
) -> ArgsT:
  """Parses argv into `args_cls`, starting from `--preset NAME` when given.

  Without `--preset`, an `--env-id` that `env_presets` knows selects its preset, and a
  line `[prog] --env-id X: preset NAME ...` is printed first; `--preset none` selects
  nothing. `prog` defaults to the script's file name.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  presets = presets or {}
  unknown = sorted(set(env_presets.names()) - set(presets))
  if unknown or NO_PRESET in presets:
    raise ValueError(
        f"env_presets name presets {unknown} that are not among {sorted(presets)}"
        if unknown
        else f"{NO_PRESET!r} is reserved for the script's defaults: rename that preset"
    )
  name, env_id = _read_preset_flags(argv)
  explicit = name is not None
  if name is not None:
    if name != NO_PRESET and name not in presets:
      raise ValueError(f"--preset {name}: choose one of {sorted(presets) + [NO_PRESET]}")
  elif env_id is not None:
    name = env_presets.select(env_id)
    if name is not None:
      prog = prog or (sys.argv[0].rsplit("/", 1)[-1].removesuffix(".py") or "script")
      print(
          f"[{prog}] --env-id {env_id}: preset {name} (the settings for this task; --preset "
          f"{NO_PRESET} for the script's defaults)",
          flush=True,
      )
  settings = dict(description=description or None, config=(tyro.conf.OmitArgPrefixes,),
                  registry=_REGISTRY)  # fmt: skip
  if not presets:
    return tyro.cli(args_cls, args=argv, **settings)
  selection = env_presets.describe().replace("\n", "; ")
  preset_help = (
      "Start from this preset; the other flags override its fields. "
      f"{NO_PRESET}: the script's defaults."
      + (f" Selected by --env-id when not given: {selection}." if selection else "")
  )
  choices: Any = Literal[tuple(sorted(presets)) + (NO_PRESET,)]  # type: ignore[misc]
  args_field: Any = (
      dataclasses.field(default=presets[name])
      if name not in (None, NO_PRESET)
      else dataclasses.field()
  )
  command = dataclasses.make_dataclass(
      "Command",
      [
          ("args", Annotated[args_cls, tyro.conf.arg(name="")], args_field),
          ("preset", Annotated[choices, tyro.conf.arg(help=preset_help)], name or NO_PRESET),
      ],
      frozen=True,
  )
  args = tyro.cli(command, args=argv, **settings).args
  if explicit and name not in (None, NO_PRESET) and hasattr(args, "train"):
    check_preset_task(name, presets[name].train, args.train, env_presets)
  return args


def _task_kind(config: Any) -> tuple[bool, int, str]:
  """(discrete actions, observation rank, a description) of a config's task."""
  from offpolicy_ac.training.sources import task_spec  # envpool's registry, only when needed

  spec = task_spec(config)
  kind = "discrete" if spec.is_discrete else "continuous"
  rank = len(spec.observation_shape)
  return spec.is_discrete, rank, f"{kind} actions, {rank}-d observations"


def check_preset_task(name: str, preset: Any, config: Any, env_presets: EnvPresets) -> None:
  """Refuses a preset used on a task of another kind than the one it was made for
  (discrete or continuous actions, vector or image observations): its networks and
  settings would not fit, and the run would train for nothing."""
  made_for, env_id = preset.env.env_id, config.env.env_id
  if made_for == env_id:
    return
  (*theirs, what), (*ours, given) = _task_kind(preset), _task_kind(config)
  if theirs != ours:
    selected = env_presets.select(env_id)
    hint = f"--preset {selected}" if selected else f"--preset {NO_PRESET} (the defaults)"
    raise ValueError(
        f"--preset {name} is made for {made_for} ({what}), not for {env_id} ({given}); "
        f"use {hint}"
    )
