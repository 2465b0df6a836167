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
(a field with the presets' names as choices, shown in `--help-all`).

`--help` is short: the common flags of each group (`HELP_GROUPS`), each with its default
in the preset the command line selects and the first clause of its docstring, then a line
naming `--help-all`, tyro's listing of every flag. The short help reads the dataclasses and
the preset's values that tyro parses (no defaults written twice), and the tests pass each flag
it shows back with the default it shows.
"""

from __future__ import annotations

import argparse
import ast
import collections.abc
import contextlib
import contextvars
import dataclasses
import errno
import fnmatch
import functools
import importlib
import importlib.util
import inspect
import os
import pathlib
import re
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import types
from typing import Annotated
from typing import Any
from typing import Callable
from typing import Iterator
from typing import Literal
from typing import Mapping
from typing import Optional
from typing import Sequence
from typing import TypeVar
from typing import Union
from typing import get_args
from typing import get_origin
from typing import get_type_hints
import warnings

import tyro
from tyro.constructors import ConstructorRegistry
from tyro.constructors import StructConstructorSpec
from tyro.constructors import StructTypeInfo

from offpolicy_ac.agents import hyperparams
from offpolicy_ac.networks import TORSOS
from offpolicy_ac.training.checkpoint import STORAGE_FULL
from offpolicy_ac.training.config import fields_without_effect
from offpolicy_ac.training.driver import NonFiniteError
from offpolicy_ac.training.experiment import REFUSED
from offpolicy_ac.training.experiment import is_refusal
from offpolicy_ac.training.rundir import enclosing_run
from offpolicy_ac.training.rundir import recorded_budget

__all__ = [
    "EnvPresets",
    "parse_args",
    "script_main",
    "exit_process",
    "check_output_file",
    "check_outside_run",
    "import_modules",
]

ArgsT = TypeVar("ArgsT")

FIELD_FLAGS: Mapping[str, Any] = {
    "lambda_": tyro.conf.arg(aliases=("--lambda",)),
    "sweep": tyro.conf.UseAppendAction,
}
"""tyro's settings of a field, by field name, wherever the field is in the args' tree."""

NO_PRESET = "none"
"""`--preset none`: the script's defaults, even for an environment with a tuned preset."""

HELP_ALL = "--help-all"
"""The flag that prints tyro's full listing: every flag with its whole description."""

PRESET = "preset"
"""`HELP_GROUPS`' name for the `--preset` flag (not a field of the args)."""

HELP_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Task and budget",
     ("env_id", "demos", "total_env_steps", "num_envs", "reward_scale", "seed", "num_seeds",
      "sweep")),
    ("Agent",
     ("gamma", "lambda_", "alpha", "learning_rate", "entropy_weight", "trust_region_delta",
      "replay_ratio", "n_step", "hidden_sizes", "anneal_learning_rate",
      "learning_rate_cooldown", "demo_batch_size")),
    ("Acting and speed", ("actors", "num_actors", "unroll_length", "learner_devices",
                          "compile_for")),
    ("Evaluation and logging", ("eval_every", "eval_episodes", "target_return", "log_every",
                                "track")),
    ("Run directory", (PRESET, "run_dir", "resume", "checkpoint_every")),
)  # fmt: skip
"""The short `--help`: its groups and the fields each shows, by field name wherever the
field is in the args' tree; a script shows the names its args have."""


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
    """The preset name for `env_id`, or None if it has none.

    Raises:
      ValueError: an envpool id that no pattern matches and envpool does not know (when
        `atari` is set, the Atari check looks it up), naming the closest known ids.
    """
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
_DERIVED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "derived_fields", default=frozenset()
)
"""The fields whose flags the script being parsed refuses (`DERIVED_FLAGS`): not listed."""


@_REGISTRY.struct_rule
def _with_field_flags(info: StructTypeInfo) -> Optional[StructConstructorSpec]:
  """A dataclass's flags as tyro makes them, with `FIELD_FLAGS` on the fields it names;
  the script's derived fields (`_DERIVED`) have none (its `--help-all` listed a flag it
  then refused)."""
  kind = info.type
  if not dataclasses.is_dataclass(kind) or kind in _EXPANDING:
    return None
  marked = {**FIELD_FLAGS, **{name: tyro.conf.Suppress for name in _DERIVED.get()}}
  if not any(f.name in marked for f in dataclasses.fields(kind)):
    return None
  _EXPANDING.add(kind)  # this rule defers to tyro's own for the fields themselves
  try:
    spec = ConstructorRegistry.get_struct_spec(info)
  finally:
    _EXPANDING.discard(kind)
  if not isinstance(spec, StructConstructorSpec):
    return None
  fields = tuple(
      dataclasses.replace(f, type=Annotated[f.type, marked[f.name]]) if f.name in marked else f
      for f in spec.fields
  )
  return dataclasses.replace(spec, fields=fields)


def _read_preset_flags(argv: Sequence[str]) -> tuple[Optional[str], Optional[str]]:
  """(--preset, --env-id) as given in argv (the last --env-id), None where absent.

  Raises:
    ValueError: two different presets (one would silently replace the other), or
      --preset or --env-id without a value.
  """
  parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
  parser.add_argument("--preset", action="append")
  parser.add_argument("--env-id", "--env_id", dest="env_id")
  try:
    known, _ = parser.parse_known_args(argv)
  except argparse.ArgumentError as e:  # a flag without its value
    raise ValueError(str(e)) from None
  named = list(dict.fromkeys(known.preset or []))
  if len(named) > 1:
    raise ValueError(f"--preset is given {len(known.preset)} times ({', '.join(named)}): a "
                     "preset is a whole configuration, give one")  # fmt: skip
  return (named[0] if named else None), known.env_id


def _flags_of(argv: Sequence[str]) -> Sequence[str]:
  """`argv` up to `--` (what follows it are values)."""
  argv = list(argv)
  return argv[: argv.index("--")] if "--" in argv else argv


def _refuse_derived_flags(argv: Sequence[str], args_cls: type) -> None:
  """Refuses a flag that `args_cls.DERIVED_FLAGS` names (flag -> why): the script sets that
  field itself (ACER's replayed updates per iteration follow --replay-ratio), so a value
  given, even the field's default, would be replaced. Flags after `--` are values."""
  derived = getattr(args_cls, "DERIVED_FLAGS", {})
  for arg in _flags_of(argv):
    flag = arg.split("=", 1)[0].replace("_", "-")
    if flag in derived:
      raise ValueError(f"{flag}: {derived[flag]}")


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
  nothing. `prog` defaults to the script's file name. `-h`/`--help` prints the short help
  (`short_help`) and `--help-all` tyro's full one; both exit (SystemExit(0)).
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  help_request = _help_request(argv)
  if help_request == HELP_ALL:
    argv = ["--help" if arg == HELP_ALL else arg for arg in argv]
  presets = presets or {}
  unknown = sorted(set(env_presets.names()) - set(presets))
  if unknown or NO_PRESET in presets:
    raise ValueError(
        f"env_presets name presets {unknown} that are not among {sorted(presets)}"
        if unknown
        else f"{NO_PRESET!r} is reserved for the script's defaults: rename that preset"
    )
  name, env_id = _read_preset_flags(argv)
  _refuse_derived_flags(argv, args_cls)
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
  if help_request == "--help":
    defaults = presets[name] if name not in (None, NO_PRESET) else None
    if defaults is not None and env_id is not None and hasattr(defaults, "train"):
      defaults = dataclasses.replace(defaults, train=defaults.train.replace(env_id=env_id))
    print(short_help(args_cls, defaults, description, presets=sorted(presets),
                     preset=name or NO_PRESET, env_presets=env_presets))  # fmt: skip
    raise SystemExit(0)
  description = _one_line_paragraphs(description) if description else None
  settings = dict(description=description, config=(tyro.conf.OmitArgPrefixes,),
                  registry=_REGISTRY)  # fmt: skip
  if not presets:
    with _field_docstrings_joined(), _derived_unlisted(args_cls):
      return _budget_kept_on_resume(tyro.cli(args_cls, args=argv, **settings), argv)
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
  with _field_docstrings_joined(), _derived_unlisted(args_cls):
    args = tyro.cli(command, args=argv, **settings).args
  try:
    if explicit and name not in (None, NO_PRESET) and hasattr(args, "train"):
      check_preset_task(name, presets[name].train, args.train, env_presets)
    base = presets[name] if name not in (None, NO_PRESET) else None
    if hasattr(args, "train"):
      base_train = base.train if base is not None else _field_default(args_cls, "train")
      _check_changes_have_effect(args.train, base_train, argv)
    if hasattr(args, "agent") and hasattr(args, "train"):
      base_agent = base.agent if base is not None else _field_default(args_cls, "agent")
      _check_swept_fields(args.agent, base_agent, args.train.budget.sweep, argv)
      _check_agent_settings_have_effect(args.agent, base_agent, argv)
  except ValueError as e:
    raise ValueError(in_flag_terms(str(e), args_cls)) from None
  return _budget_kept_on_resume(args, argv)


def _given_flags(argv: Sequence[str]) -> set[str]:
  """The flags given in `argv` (before `--`), as `--name` with dashes."""
  return {arg.split("=", 1)[0].replace("_", "-") for arg in _flags_of(argv) if arg[:2] == "--"}


def _budget_kept_on_resume(args: Any, argv: Sequence[str]) -> Any:
  """A `--resume` without `--total-env-steps` continues to the run's own budget (it took
  the script's default: a 2,000-step run resumed so trained on to 500,000)."""
  if not (getattr(args, "resume", False) and hasattr(args, "train")):
    return args
  if "--total-env-steps" in _given_flags(argv):
    return args
  budget = recorded_budget(args.run_dir) if args.run_dir else None
  if budget is None or budget == args.train.budget.total_env_steps:
    return args
  return dataclasses.replace(args, train=args.train.replace(total_env_steps=budget))


def _field_default(cls: type, name: str) -> Any:
  field = next(f for f in dataclasses.fields(cls) if f.name == name)
  return field.default_factory() if field.default is dataclasses.MISSING else field.default


def _typed(field: str, argv: Sequence[str]) -> bool:
  """Whether `argv` gives the flag of `field` (`--no-` for a bool's False too)."""
  flag, given = flag_name(field), _given_flags(argv)
  return flag in given or f"--no-{flag[2:]}" in given


def _check_changes_have_effect(train: Any, base_train: Any, argv: Sequence[str] = ()) -> None:
  """Refuses a flag that sets a setting of the run where the setting has no effect
  (`training.config.CONDITIONAL_FIELDS`), given in `argv` (also with the preset's or the
  default's value) or changed from the preset's (or the default's) value: the user would
  believe it applied. A config that `validate` refuses is left to its message."""
  try:
    train.validate()
  except ValueError:
    return
  given_fields, base_fields = train.fields_by_name(), base_train.fields_by_name()
  for field, where in fields_without_effect(train).items():
    given = given_fields[field]
    if given != base_fields[field] or _typed(field, argv):
      flag = flag_name(field)
      typed = (f"--no-{flag[2:]}" if not given else flag) if isinstance(given, bool) else (
          f"{flag} {format_value(given)}")  # fmt: skip
      raise ValueError(f"{typed} has no effect in this run: it applies {where}")


def _check_swept_fields(agent: Any, base_agent: Any, sweep: Sequence[str],
                        argv: Sequence[str] = ()) -> None:  # fmt: skip
  """Refuses a flag that sets a field `--sweep` sweeps (given in `argv`, or its value
  differs from the preset's or the default's): the sweep's values would replace it,
  silently, also where it is given the default's value."""
  for field in hyperparams.parse_sweep(agent, sweep):  # a bad --sweep is refused here too
    value = getattr(agent, field)
    if value != getattr(base_agent, field) or _typed(field, argv):
      raise ValueError(f"{flag_name(field)} {format_value(value)} sets a field --sweep "
                       f"sweeps: drop {flag_name(field)}")  # fmt: skip


def _check_agent_settings_have_effect(agent: Any, base_agent: Any,
                                      argv: Sequence[str] = ()) -> None:  # fmt: skip
  """Refuses a flag, given in `argv` or changing an agent setting from the preset's (or the
  default's) value, where the rest of the config leaves the setting without effect (the
  config's `ignored_settings()`): SQL's --n-step with --lambda, ACER's --avg-decay without
  the trust region. The library's `check_settings_used` compares with the config class's
  defaults, which a preset's may differ from (SQL's n_step)."""
  for field, why in getattr(agent, "ignored_settings", dict)().items():
    value = getattr(agent, field)
    if value != getattr(base_agent, field) or _typed(field, argv):
      raise ValueError(f"{flag_name(field)} {format_value(value)} has no effect in this run: "
                       f"{why}")  # fmt: skip


def parse_plain(args_cls: type[ArgsT], description: str,
                argv: Optional[Sequence[str]] = None) -> ArgsT:  # fmt: skip
  """tyro's parse of a script without presets (evaluate.py, plot.py, the benchmarks). Its
  `--help` lists every flag, so `--help-all` (the training scripts' full listing) is the
  same."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if _help_request(argv) == HELP_ALL:
    argv = ["--help" if arg == HELP_ALL else arg for arg in argv]
  with _field_docstrings_joined():
    description = _one_line_paragraphs(description) if description else None  # None: -OO
    return tyro.cli(args_cls, description=description, args=argv)


@contextlib.contextmanager
def _derived_unlisted(args_cls: type) -> Iterator[None]:
  """While tyro parses `args_cls`: its `DERIVED_FLAGS` fields get no flag (`_DERIVED`)."""
  flags = getattr(args_cls, "DERIVED_FLAGS", {})
  token = _DERIVED.set(frozenset(flag[2:].replace("-", "_") for flag in flags))
  try:
    yield
  finally:
    _DERIVED.reset(token)


@contextlib.contextmanager
def _field_docstrings_joined() -> Iterator[None]:
  """While tyro parses: a field's docstring (the string under it) as its paragraphs, each
  on one line (a list's items on their own). tyro reads them through docstring_parser,
  which keeps the continuation lines' indentation, and keeps a line break before every
  line that does not start with a letter: each line of the source became a line of the
  help, cut mid-sentence."""
  import docstring_parser  # pylint: disable=import-outside-toplevel  (tyro's own dependency)

  parse = docstring_parser.parse_from_object

  def joined(obj: Any) -> Any:
    docstring = parse(obj)
    for param in docstring.params:
      if param.description:
        param.description = _one_line_paragraphs(param.description)
    return docstring

  docstring_parser.parse_from_object = joined
  try:
    yield
  finally:
    docstring_parser.parse_from_object = parse


def _one_line_paragraphs(text: str) -> str:
  """`text` dedented (`inspect.cleandoc`), each paragraph on one line; blank lines, indented
  lines (a command, a list item's continuation) and list items ("- ", "* ") stay as they
  are."""
  lines: list[str] = []
  for line in inspect.cleandoc(text).split("\n"):
    previous = lines[-1] if lines else ""
    if previous[:1].strip() and line[:1].strip() and not line.startswith(("- ", "* ")):
      lines[-1] = f"{previous} {line}"
    else:
      lines.append(line)
  return "\n".join(lines)


def one_line_warnings() -> None:
  """Prints this process's warnings as `warning: <message>`, one line each (a script's
  notes to its user: a run left out of a plot, a checkpoint passed over)."""
  warnings.formatwarning = lambda message, *args, **kwargs: f"warning: {message}\n"


def _help_request(argv: Sequence[str]) -> Optional[str]:
  """Which help argv asks for: HELP_ALL, "--help" (-h too) or None; flags after `--` are
  values."""
  flags = argv[: argv.index("--")] if "--" in argv else argv
  if HELP_ALL in flags:
    return HELP_ALL
  return "--help" if "-h" in flags or "--help" in flags else None


@dataclasses.dataclass(frozen=True)
class HelpEntry:
  """One flag of the short help.

  Attributes:
    name: the field's name (`PRESET` for --preset).
    flag: what to type: `--env-id`, `--lambda` (its alias), `--[no-]resume` for a bool.
    metavar: the value's form, as tyro writes it (`INT`, `{inline,pools,async}`); "" for
      a bool.
    default: the value of the args' defaults (the selected preset's, if any); MISSING for a
      required field.
    summary: the docstring's first sentence, up to its first semicolon.
  """

  name: str
  flag: str
  metavar: str
  default: Any
  summary: str

  def describe(self) -> str:
    """The summary and the default, one sentence."""
    text = self.summary[:-1] if self.summary.endswith((".", ":")) else self.summary
    if text.endswith(".."):
      text += "."
    if self.default is dataclasses.MISSING:
      said = "(required)"
    elif self.default is None and "default" in text:  # the docstring says what None means
      said = ""
    elif self.default == "":  # unset: the docstring says what to give
      said = ""
    elif self.default == ():
      said = "(repeatable)" if FIELD_FLAGS.get(self.name) is tyro.conf.UseAppendAction else ""
    else:
      said = f"(default: {format_value(self.default)})"
    return f"{text} {said}".strip()


def format_value(value: Any) -> str:
  """A default as it is typed on the command line (tuples as space-separated values)."""
  if isinstance(value, (tuple, list)):
    return " ".join(format_value(v) for v in value) or "()"
  if isinstance(value, str):
    return value if value and " " not in value else repr(value)
  return str(value)


@functools.cache
def field_docstrings(cls: type) -> dict[str, str]:
  """The docstrings written under a dataclass's fields (`field: T = v` then a string), as
  tyro reads them for --help-all."""
  try:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
  except (OSError, TypeError, SyntaxError):  # no source: a class made at run time
    return {}
  body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
  docs = {}
  for node, after in zip(body, body[1:]):
    if (
        isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    ):
      docs[node.target.id] = inspect.cleandoc(after.value.value)
  return docs


def summary(doc: str) -> str:
  """A docstring's first sentence, up to its first semicolon (outside brackets), on one
  line."""
  text, depth = " ".join(doc.split()), 0
  for i, char in enumerate(text):
    depth += (char in "([{") - (char in ")]}")
    if depth == 0 and char in ".;" and text[i + 1 : i + 2] in (" ", ""):
      return text[: i + (char == ".")]
  return text


def _unwrap(kind: Any) -> Any:
  """The type under `Annotated` and `Optional`."""
  while get_origin(kind) is Annotated:
    kind = get_args(kind)[0]
  if get_origin(kind) in (Union, types.UnionType):
    members = [a for a in get_args(kind) if a is not type(None)]
    if len(members) == 1:
      return _unwrap(members[0])
  return kind


def _metavar(kind: Any) -> str:
  """The value's form in tyro's words: INT, FLOAT, STR, {a,b}, INT ..., FLOAT FLOAT."""
  kind = _unwrap(kind)
  origin, args = get_origin(kind), get_args(kind)
  if kind is bool:
    return ""
  if origin is Literal:
    return "{" + ",".join(str(a) for a in args) + "}"
  if origin is tuple and args and args[-1] is not Ellipsis:
    return " ".join(_metavar(a) for a in args)
  if origin in (tuple, list, collections.abc.Sequence):
    return f"{_metavar(args[0]) if args else 'VALUE'} ..."
  return kind.__name__.upper() if kind in (int, float, str) else "VALUE"


def _leaf_fields(
    cls: type, value: Any = None
) -> Iterator[tuple[type, dataclasses.Field, Any, Any]]:
  """(owner class, field, type, value) of every field that is a flag, depth first; values
  from `value`, else the class's defaults (MISSING where a field has none, and where
  `value` leaves such a field empty: a preset's placeholder for SQIL's --demos)."""
  hints = get_type_hints(cls, include_extras=True)
  for f in dataclasses.fields(cls):
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    if value is not None:
      current = getattr(value, f.name)
      if required and current == "":
        current = dataclasses.MISSING
    elif f.default is not dataclasses.MISSING:
      current = f.default
    elif f.default_factory is not dataclasses.MISSING:
      current = f.default_factory()
    else:
      current = dataclasses.MISSING
    kind = _unwrap(hints[f.name])
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
      yield from _leaf_fields(kind, None if current is dataclasses.MISSING else current)
    else:
      yield cls, f, hints[f.name], current


def flag_name(field_name: str) -> str:
  """The flag users type for a field: its first alias (`FIELD_FLAGS`), else tyro's."""
  settings = FIELD_FLAGS.get(field_name)
  aliases = getattr(settings, "aliases", None)
  return aliases[0] if aliases else "--" + field_name.replace("_", "-")


def in_flag_terms(message: str, args_cls: type) -> str:
  """`message` with the names of `args_cls`'s fields replaced by the flags users type.

  The library's checks name a setting as Python spells it (`num_envs`, `lambda_`); a
  script's user typed `--num-envs`, `--lambda`. Only names with an underscore are
  replaced (they cannot be read as a word of the sentence), any name that starts the
  message ("seed must be ...", in backticks too: a loss's check) and any that a resume's
  refusal lists with its values ("gamma (the run's 0.9, given 0.99)"); elsewhere not where
  they are not a setting: inside quotes or backticks, paths, file names and flags, or after
  `--sweep ` (which takes field names).
  """
  if not dataclasses.is_dataclass(args_cls):
    return message
  every = {f.name for _, f, _, _ in _leaf_fields(args_cls)}
  # "seed must be ...", "`surrogate_clip` must be ..." (a loss's check): a setting, whatever
  # its name
  first = re.match(r"(`?)(\w+)\1 must ", message)
  if first and first.group(2) in every:
    message = flag_name(first.group(2)) + message[first.end() - len(" must ") :]
  listed = re.compile(r"(?<![\w./\\'\"`-])(\w+)(?= \(the run's )")  # rundir's differences
  message = listed.sub(lambda m: flag_name(m.group(1)) if m.group(1) in every else m.group(1),
                       message)  # fmt: skip
  names = sorted({name for name in every if "_" in name}, key=len, reverse=True)
  if not names:
    return message
  pattern = re.compile(r"(?<![\w./\\'\"`-])(?<!--sweep )(" + "|".join(map(re.escape, names))
                       + r")(?![\w/\\'\"`-])(?!\.\w)")  # fmt: skip
  return pattern.sub(lambda match: flag_name(match.group(1)), message)


def help_entries(args_cls: type, defaults: Any = None) -> dict[str, HelpEntry]:
  """Every flag of `args_cls` as the short help shows it, by field name, with the defaults
  of `defaults` (an `args_cls` value) or else of the class."""
  entries = {}
  for owner, f, kind, value in _leaf_fields(args_cls, defaults):
    repeated = FIELD_FLAGS.get(f.name) is tyro.conf.UseAppendAction  # one value a flag
    metavar = _metavar(get_args(_unwrap(kind))[0] if repeated else kind)
    name = flag_name(f.name)
    flag = f"--[no-]{name[2:]}" if _unwrap(kind) is bool else name
    doc = in_flag_terms(summary(field_docstrings(owner).get(f.name, "")), args_cls)
    entries[f.name] = HelpEntry(f.name, flag, metavar, value, doc)
  return entries


def short_help(
    args_cls: type,
    defaults: Any = None,
    description: str = "",
    presets: Sequence[str] = (),
    preset: str = NO_PRESET,
    env_presets: EnvPresets = EnvPresets(),
    prog: Optional[str] = None,
    width: Optional[int] = None,
    column: Optional[int] = None,
) -> str:
  """The short --help: usage, the description's summary and examples, the common flags of
  each group (`HELP_GROUPS`) with their defaults in `defaults` (the selected preset's
  args; None: the script's), and a last line naming --help-all."""
  prog = prog or sys.argv[0] or "script"
  width = width or min(100, max(80, shutil.get_terminal_size((100, 24)).columns))
  column = column or (32 if width >= 100 else 26)
  wrap = functools.partial(textwrap.wrap, width=width, break_on_hyphens=False,
                           subsequent_indent=" " * column)  # fmt: skip
  lines = [f"usage: {prog} {'[--preset NAME] ' if presets else ''}[FLAGS]", ""]
  paragraphs = [p for p in textwrap.dedent(description or "").strip().split("\n\n") if p]
  if paragraphs:  # the summary, and the examples when they follow it (indented lines)
    lines += [paragraphs[0].strip(), ""]
    if len(paragraphs) > 1 and paragraphs[1].startswith(" "):
      lines += [*paragraphs[1].splitlines(), ""]
  entries = help_entries(args_cls, defaults)
  torso = getattr(getattr(defaults, "agent", None), "torso", None)
  if torso in TORSOS and torso != "mlp":  # a pixel torso (Atari's): no layers they size
    entries.pop("hidden_sizes", None)
  if presets:
    entries[PRESET] = HelpEntry(
        PRESET, "--preset", "NAME", preset, "Start from a preset; other flags change its settings"
    )

  def entry_lines(entry: HelpEntry) -> list[str]:
    left = f"  {entry.flag}{' ' + entry.metavar if entry.metavar else ''}"
    text = entry.describe()
    if len(left) > column - 2:
      return [left, *wrap(text, initial_indent=" " * column)]
    return wrap(text, initial_indent=left.ljust(column))

  for title, names in HELP_GROUPS:
    shown = [entries[n] for n in names if n in entries]
    if not shown:
      continue
    lines.append(f"{title}:")
    for entry in shown:
      lines += entry_lines(entry)
      if entry.name == PRESET:
        lines += wrap(_presets_note(presets, env_presets), initial_indent=" " * column)
    lines.append("")
  lines.append(f"Every flag, with what it does: {prog} {HELP_ALL}")
  return "\n".join(lines)


def _presets_note(presets: Sequence[str], env_presets: EnvPresets) -> str:
  """The presets, each with the env ids that select it when no --preset is given."""
  selecting: dict[str, list[str]] = {}
  for pattern, name in env_presets.patterns.items():
    selecting.setdefault(name, []).append(pattern)
  if env_presets.atari:
    selecting.setdefault(env_presets.atari, []).append("Atari tasks")
  named = [f"{n} ({', '.join(selecting[n])})" if n in selecting else n for n in presets]
  intro = "Presets, and the --env-id that selects each without --preset" if selecting else "Presets"
  return f"{intro}: {', '.join(named)}; {NO_PRESET}: the defaults."


def _task_kind(config: Any) -> tuple[bool, int, str]:
  """(discrete actions, observation rank, a description) of a config's task. brax's tasks
  are all continuous control from vector observations: known without loading brax and
  building the task (seconds)."""
  from offpolicy_ac.training.sources import task_spec  # envpool's registry, only when needed

  if config.env.env_id.startswith("brax:"):
    is_discrete, rank = False, 1
  else:
    spec = task_spec(config)
    is_discrete, rank = spec.is_discrete, len(spec.observation_shape)
  kind = "discrete" if is_discrete else "continuous"
  return is_discrete, rank, f"{kind} actions, {rank}-d observations"


def check_preset_task(name: str, preset: Any, config: Any, env_presets: EnvPresets) -> None:
  """Refuses a preset used on a task of another kind than the one it was made for
  (discrete or continuous actions, vector or image observations; Atari; a JAX
  environment's run compiled for startup): its networks and settings would not fit, and
  the run would train for nothing."""
  from offpolicy_ac import envs  # envpool's registry, only when needed

  made_for, env_id = preset.env.env_id, config.env.env_id
  if made_for == env_id:
    return
  selected = env_presets.select(env_id)
  hint = f"--preset {selected}" if selected else f"--preset {NO_PRESET} (the defaults)"
  if preset.budget.compile_for == "startup" and not envs.is_functional(env_id):
    what, given = "a JAX environment's run, compiled for startup", "an envpool task"
  elif preset.env.atari and (envs.is_functional(env_id) or not envs.is_atari(env_id)):
    made_for, what, given = "Atari tasks", "envpool ids such as Pong-v5", "not an Atari task"
  elif not preset.env.atari and not envs.is_functional(env_id) and envs.is_atari(env_id):
    what, given = "no Atari preprocessing", "an Atari task"
  else:
    (*theirs, what), (*ours, given) = _task_kind(preset), _task_kind(config)
    if theirs == ours:
      return
  raise ValueError(
      f"--preset {name} is made for {made_for} ({what}), not for {env_id} ({given}); use {hint}"
  )


def check_paths_given(paths: dict[str, Any]) -> None:
  """Refuses (ValueError naming the flag) an empty or blank path: `{flag: path or None}`
  (None: not given). An empty string is not the working directory, which pathlib would
  make of it."""
  for flag, given in paths.items():
    if given is not None and not str(given).strip():
      raise ValueError(f"{flag} is empty: give a path")


def check_output_file(flag: str, path: str | os.PathLike, example: str = "out") -> pathlib.Path:
  """Refuses (ValueError naming `flag`) an output file that cannot be written: a
  directory, a path spelt as one (`out/`, `out/.`: the file would take the folder's name),
  a path under a file, or one this process may not write. For scripts to call before
  their long work; `example` is the file name the message suggests."""
  if os.path.basename(os.fspath(path)) in ("", ".", ".."):
    suggested = os.path.join(os.path.normpath(os.fspath(path)), example)
    raise ValueError(f"{flag} {os.fspath(path)} names a folder: give a file's path, e.g. "
                     f"{suggested}")  # fmt: skip
  path = pathlib.Path(path).expanduser()
  if path.is_dir():
    raise ValueError(f"{flag} {path} is a directory: give a file path")
  parent = next((d for d in path.parents if d.exists()), None)
  if parent is not None and not parent.is_dir():
    raise ValueError(f"{flag} {path}: {parent} is a file, not a directory")
  if path.exists() and not os.access(path, os.W_OK):
    raise ValueError(f"{flag} {path}: {path} is not writable")
  if parent is not None:
    check_writable_folder(flag, path, parent)
  return path


def check_writable_folder(flag: str, path: pathlib.Path, folder: pathlib.Path) -> None:
  """Refuses (ValueError naming `flag`) `path` where its nearest existing `folder` takes no
  new file: tried, not asked of the permissions, which say yes to root everywhere (a
  read-only mount, /proc)."""
  try:
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as e:
    raise ValueError(f"{flag} {path}: {folder} takes no new file ({e.strerror or e}): "
                     f"choose another {flag}") from None  # fmt: skip


def check_suffix(flag: str, path: str | os.PathLike, suffix: str, written: str) -> None:
  """Refuses (ValueError naming `flag`) an output path that does not end in `suffix` (any
  case): the file is written as `written` (a .txt given by mistake was replaced by it)."""
  if pathlib.Path(path).suffix.lower() != suffix:
    raise ValueError(f"{flag} {os.fspath(path)}: the file is written as {written}: give a path "
                     f"ending in {suffix}")  # fmt: skip


def check_outside_run(flag: str, given: str | os.PathLike, run_dir: str | os.PathLike, *,
                      may_overwrite: Callable[[pathlib.Path], bool] = lambda path: False
                      ) -> None:  # fmt: skip
  """Refuses (ValueError naming `flag`) an output path that would damage the run in
  `run_dir`: an existing file in its directory (but those `may_overwrite` allows: a
  script's own earlier outputs) or any path in one of its folders (checkpoints/,
  best_at_checkpoint/, tensorboard/, ...); for a learner of a run of several
  (<root>/seed<k>, <root>/<setting>/seed<k>), the root's too (its config.json and
  checkpoints/, which the learner loads); and another run's alike, for a path inside one
  (`rundir.enclosing_run`). Paths are compared resolved (`..`, links); the run directory
  itself is left to `check_output_file`."""
  run_dir = pathlib.Path(run_dir).expanduser().resolve()
  # The root of a run of several seeds or settings: where load_run finds its checkpoints.
  roots = [d for d in (run_dir.parent, run_dir.parent.parent) if (d / "config.json").is_file()]
  path = pathlib.Path(given).expanduser().resolve()
  owner = next((d for d in (run_dir, *roots[:1]) if path.is_relative_to(d)), None)
  owner = owner or enclosing_run(path)  # another run's
  if owner is None or path == owner:
    return
  first = owner / path.relative_to(owner).parts[0]
  if first != path and first.is_dir():
    raise ValueError(f"{flag} {given} is in {first}, a folder of the run: writing there "
                     "would damage the run; give a path outside it")  # fmt: skip
  if first == path and path.exists() and not may_overwrite(path):
    raise ValueError(f"{flag} {given} is the file {path.name} of the run in {owner}: "
                     "overwriting it would damage the run; give another path")  # fmt: skip


def import_modules(flag: str, modules: Sequence[str]) -> None:
  """Imports `modules`, each a module's dotted name (found from the current directory
  too) or a .py file's path (the modules beside it found too): the modules that register
  a run's custom agent (`agents.register_agent`) or torso (`networks.register_torso`), for
  scripts that load runs. One that cannot be found, or a file named as a module already
  imported (`string.py` would replace the standard library's `string` for every later
  import), or a dotted name whose module in the current directory another one shadows, is
  refused (ValueError naming `flag`), as is a module whose own import of another is not
  found (naming both); another error inside a module keeps its traceback."""
  if os.getcwd() not in sys.path:
    sys.path.append(os.getcwd())
  for name in modules:
    path = pathlib.Path(name).expanduser()
    if name.endswith(".py"):
      spec = importlib.util.spec_from_file_location(path.stem, path)
      if not path.is_file() or spec is None or spec.loader is None:
        raise ValueError(f"{flag} {name}: no such file")
      taken = getattr(sys.modules.get(path.stem), "__file__", None)
      if path.stem in sys.modules and (taken is None or not path.samefile(taken)):
        raise ValueError(f"{flag} {name}: a module named {path.stem!r} is already imported "
                         f"({taken or 'built in'}), which it would replace; rename the file")  # fmt: skip
      if str(path.resolve().parent) not in sys.path:  # its own imports, as `python FILE`
        sys.path.append(str(path.resolve().parent))
      module = importlib.util.module_from_spec(spec)
      sys.modules[path.stem] = module
      try:
        spec.loader.exec_module(module)
      except Exception as e:  # as a failed import does, leaves no half-made module
        sys.modules.pop(path.stem, None)
        if isinstance(e, ModuleNotFoundError):
          _refuse_missing_import(flag, name, e)
        raise
      continue
    _refuse_shadowed(flag, name)
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name != name and not name.startswith(f"{e.name}."):
        _refuse_missing_import(flag, name, e)
      where = f"on the path or in {os.getcwd()}"
      raise ValueError(f"{flag} {name}: no module named {e.name!r} ({where}); give a "
                       "module's dotted name or a .py file's path") from e  # fmt: skip


def _refuse_missing_import(flag: str, name: str, error: ModuleNotFoundError) -> None:
  """Names the module of `flag` whose own import of another failed (the message alone read
  as if the flag's module were missing)."""
  raise ValueError(f"{flag} {name}: it imports {error.name!r}, which is not installed or "
                   f"not on the path ({error})") from error  # fmt: skip


def _refuse_shadowed(flag: str, name: str) -> None:
  """Refuses a dotted name whose top-level module is in the current directory but is found
  first elsewhere (installed, or the standard library's): that one would be imported."""
  top = name.split(".")[0]
  here = next((p for p in (pathlib.Path(f"{top}.py"), pathlib.Path(top)) if p.exists()), None)
  try:
    found = importlib.util.find_spec(top) if here is not None else None
  except (ImportError, ValueError):  # the import itself reports it
    return
  if found is None:
    return
  origin = found.origin or next(iter(found.submodule_search_locations or []), "built-in")
  # The one here: its file, its package's __init__.py or folder, or a namespace package's
  # folder (no origin); not merely a module somewhere below the current directory (.venv).
  found_at = [found.origin] if found.has_location else []
  found_at += list(found.submodule_search_locations or [])
  local = {pathlib.Path(f"{top}.py").resolve(), pathlib.Path(top).resolve()}
  if local & {pathlib.Path(p).resolve() for p in found_at}:
    return
  # Imported already (json, numpy), the module cannot be loaded by its path either (it
  # would replace the one in use): only a new name helps.
  advice = "rename it" if top in sys.modules else "give the file's path (a .py file) or rename it"
  raise ValueError(f"{flag} {name}: {here} in the current directory is shadowed by the module "
                   f"{top!r} ({origin}), which Python imports instead; {advice}")  # fmt: skip


def script_main(parse: Callable[[], Any], run: Callable[[Any], Any], *,
                refuse: tuple[type[BaseException], ...] = ()) -> None:  # fmt: skip
  """The `__main__` of an experiment script: `run(parse())`, then ends the process
  (`exit_process`).

  A refusal (`is_refusal`: bad settings, a run directory in use, ...; or an error of a
  type in `refuse`, for scripts that only read: evaluate.py, record_demos.py, plot.py)
  prints one line, "[<script>] error: <why>" (naming settings by their flags:
  `in_flag_terms`), and exits with code 2; a full disk prints one line and exits with code
  1 (for a training run: the checkpoints written are intact, for `--resume`), and so does
  a training run that storage refuses as it runs (`WRITE_REFUSED`); a warning
  prints one line (`one_line_warnings`). A closed stdout (`| head`) silences the output
  and nothing else.
  A non-finite loss, gradient or environment datum (`NonFiniteError`) prints one line and
  exits with code 1 (the last good checkpoint is kept); so does XLA running out of memory
  (`out_of_memory_message`). Anything else (a bug) keeps its traceback. A Ctrl-C, or a
  second stop signal during a training run, prints one line and exits with 128 + the
  signal's number (130, 143).
  """
  one_line_warnings()
  sys.stdout = _ConsoleThatMayClose(sys.stdout)
  prog = pathlib.Path(sys.argv[0]).stem or "script"
  args = None
  try:
    try:
      args = parse()
    except (ValueError, OSError) as e:  # bad flags or files named on the command line
      setattr(e, REFUSED, True)
      raise
    try:
      run(args)
    except refuse as e:
      setattr(e, REFUSED, True)
      raise
  except KeyboardInterrupt as e:  # a Ctrl-C, or a training run's second stop signal
    training = bool(e.args) and e.args[0] in ("SIGINT", "SIGTERM")  # (run_experiment's)
    name = e.args[0] if training else "SIGINT"
    kept = ("; the checkpoints written are intact: --resume goes on from the last one (or "
            "starts over if there is none)") if training else ""  # fmt: skip
    exit_process(128 + signal.Signals[name].value,
                 last_words=f"[{prog}] stopped at once by {name}{kept}")  # fmt: skip
  except Exception as e:  # pylint: disable=broad-except
    storage = _storage_error(e, args)
    if storage is not None:
      exit_process(1, last_words=f"[{prog}] error: {storage}")
    if isinstance(e, NonFiniteError):  # found after the step: a traceback shows no cause
      exit_process(1, last_words=f"[{prog}] error: {in_flag_terms(str(e), type(args))}")
    if is_out_of_memory(e):
      exit_process(1, last_words=f"[{prog}] error: {out_of_memory_message(e, type(args))}")
    if not is_refusal(e):
      raise
    exit_process(2, last_words=f"[{prog}] error: {in_flag_terms(str(e), type(args))}")
  exit_process(0)


def _in_distributed_job() -> bool:
  """Whether this process has joined a multi-process JAX job (without importing JAX)."""
  jax = sys.modules.get("jax")
  return jax is not None and jax.distributed.is_initialized()


WRITE_REFUSED = {
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "read-only file system",
}
"""Write errors of storage that refuses this process (permissions, a read-only mount), with
what the scripts call them when a training run meets one as it runs."""


def _storage_error(e: BaseException, args: Any) -> Optional[str]:
  """The line of a write error of storage (and what to do): storage that is full
  (`STORAGE_FULL`), or, for a training run as it runs, storage that refuses it
  (`WRITE_REFUSED`: its directory's permissions changed; a refusal before it starts names
  the directory itself); None for other errors."""
  if not isinstance(e, OSError):
    return None
  resumable = _resumable(args)
  if e.errno in STORAGE_FULL:
    what, fix = STORAGE_FULL[e.errno], "make room"
  elif e.errno in WRITE_REFUSED and resumable and not is_refusal(e):
    what, fix = WRITE_REFUSED[e.errno], "allow writing there"
  else:
    return None
  where = f" ({e.filename})" if e.filename else ""
  then = (f"the checkpoints written are intact: {fix}, then --resume (it starts over if there "
          "is none)" if resumable else f"{fix}, then run it again")  # fmt: skip
  return f"{what}{where}; {then}"


def _resumable(args: Any) -> bool:
  """Whether a script's parsed `args` are a training run's, which `--resume` continues."""
  return dataclasses.is_dataclass(args) and any(
      f.name == "resume" for f in dataclasses.fields(args)
  )


_ARRAY_SIZES = ("num_envs", "unroll_length", "mini_batch_size", "replay_capacity", "num_seeds")
"""The settings that size a run's arrays, in the order `out_of_memory_message` names them."""


def is_out_of_memory(error: BaseException) -> bool:
  """Whether `error` is XLA's failure to allocate memory (on any device)."""
  import jax  # pylint: disable=import-outside-toplevel  (loaded by then: a run's error)

  return isinstance(error, jax.errors.JaxRuntimeError) and str(error).startswith(
      "RESOURCE_EXHAUSTED: Out of memory"
  )


def out_of_memory_message(error: BaseException, args_cls: type) -> str:
  """One line for XLA's out-of-memory error: its first line, and for a training run's
  `args_cls`, that the checkpoints written are intact and the flags that size its arrays."""
  said = str(error).strip().splitlines()[0].rstrip(".")
  asked = re.search(r"allocat\w* (\d+) bytes", said)  # (a GPU's: "... trying to allocate")
  if asked:
    said += f" ({int(asked.group(1)) / 2**30:,.1f} GiB)"
  names = set()
  if dataclasses.is_dataclass(args_cls):
    names = {f.name for _, f, _, _ in _leaf_fields(args_cls)}
  sizes = ", ".join(flag_name(name) for name in _ARRAY_SIZES if name in names)
  if not sizes:  # not a training run
    return said
  return (f"{said}; the checkpoints written are intact: smaller sizes ({sizes}) ask for less; "
          "start again in a new --run-dir (--resume keeps the run's settings)")  # fmt: skip


class _ConsoleThatMayClose:
  """A script's stdout that goes quiet when it cannot be written (`| head` or a closed
  terminal's pipe gone, a full or failing disk under a redirection, stdout closed at
  start: `>&-`) instead of raising into the training loop: a run's record is its run
  directory, not its console. The descriptor then writes to os.devnull. Characters the
  console's encoding lacks (a run directory's name on an ASCII console) are escaped."""

  def __init__(self, stream: Any):
    if stream is None:  # started with stdout closed
      stream = open(os.devnull, "w")  # pylint: disable=consider-using-with
    self._stream = stream

  def write(self, text: str) -> int:
    try:
      return self._stream.write(text)
    except UnicodeEncodeError:
      encoding = getattr(self._stream, "encoding", None) or "ascii"
      return self.write(text.encode(encoding, "backslashreplace").decode(encoding))
    except OSError:
      self._to_devnull()
      return len(text)

  def flush(self) -> None:
    try:
      self._stream.flush()
    except OSError:
      self._to_devnull()

  def _to_devnull(self) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
      os.dup2(devnull, self._stream.fileno())
    except (OSError, ValueError):  # no descriptor of its own: write to os.devnull instead
      self._stream = open(os.devnull, "w")  # pylint: disable=consider-using-with
    finally:
      os.close(devnull)

  def __getattr__(self, name: str) -> Any:
    return getattr(self._stream, name)


def exit_process(code: int = 0, last_words: Optional[str] = None) -> None:
  """Ends a finished script's process at once: flushes stdout and stderr, runs the
  `atexit` handlers, then `os._exit(code)`.

  For the `__main__` block of a script whose `main` has returned: every file is closed
  and every checkpoint written by then. What it skips is the interpreter's own
  finalization (module teardown, the C++ destructors of envpool's and XLA's libraries),
  which took 0.6-0.9 s of a CartPole run's launch-to-stop time on this 2-core machine
  and does nothing a finished run needs. Never call it from library code or tests: it
  ends the calling process.

  `last_words` (an error) is printed to stderr last, after the handlers, whose own errors
  and those of dying threads are then silenced (a full disk fails every writer's cleanup
  too), so that it is the last line a user reads.

  A process of a multi-process job that ends with an error skips the handlers: JAX's
  would enter the distributed runtime's shutdown barrier and wait for the other
  processes, which may be waiting for this one in a collective (a refusal on one process
  only, such as its own directory missing on `--resume`): both would hang for minutes,
  then abort, the error unprinted. Leaving at once ends their collective with an error,
  and they stop too (`training.experiment`).
  """
  import atexit

  try:
    sys.stdout.flush()
    sys.stderr.flush()
    if code != 0 and _in_distributed_job():
      if last_words is not None:
        print(last_words, file=sys.stderr, flush=True)
    elif last_words is not None:
      threading.excepthook = lambda args: None
      with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
        atexit._run_exitfuncs()  # pylint: disable=protected-access
      print(last_words, file=sys.stderr, flush=True)
    else:
      atexit._run_exitfuncs()  # pylint: disable=protected-access
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(code)
