"""Command lines of the experiment scripts: tyro over a frozen dataclass, with presets.

    python experiments/impala.py --env-id CartPole-v1 --seed 0      # the script's defaults
    python experiments/impala.py --preset atari --env-id Breakout-v5  # a preset, then flags

A preset is a complete Args value; flags given after it override its fields. Naming an
environment that has a tuned preset (`EnvPresets`) with no `--preset` applies that preset
and says so on the first line of output (as rl-baselines3-zoo picks hyper-parameters by
environment); `--preset none` keeps the script's defaults.
Nested configs (`train` and its groups, `agent`) are flattened: `--learning-rate`, not
`--agent.learning-rate`. Shorthands: `--async-actors K` is `--actors async --num-actors
K`, `--actor-pools K` is `--actors pools --num-actors K`, `--xla-rollout` is
`--rollout compiled`. `--sweep` may be repeated, one field each (`--sweep
learning_rate=1e-3,3e-3 --sweep gamma=0.99,0.995`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import sys
from typing import Any
from typing import Mapping
from typing import Optional
from typing import Sequence
from typing import TypeVar

import tyro

ArgsT = TypeVar("ArgsT")

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


SHORTHANDS = {
    "--async-actors": lambda k: ["--actors", "async", "--num-actors", k],
    "--actor-pools": lambda k: ["--actors", "pools", "--num-actors", k],
}


def expand_shorthands(argv: Sequence[str]) -> list[str]:
  """The flags with the shorthands of the module docstring spelled out.

  Raises:
    ValueError: two flags name different actor topologies (e.g. `--async-actors 2
      --actor-pools 2`).
  """
  out, argv = [], list(argv)
  topologies = set()
  while argv:
    flag = argv.pop(0)
    name, eq, value = flag.partition("=")
    if name in SHORTHANDS:
      if not eq:
        if not argv:
          raise SystemExit(f"{name} takes a count")
        value = argv.pop(0)
      out += SHORTHANDS[name](value)
      topologies.add(out[-3])
    elif name == "--actors" and (eq or argv):
      topologies.add(value if eq else argv[0])
      out.append(flag)
    elif flag == "--xla-rollout":
      out += ["--rollout", "compiled"]
    else:
      out.append(flag)
  if len(topologies) > 1:
    raise ValueError(
        f"choose one actor topology: the flags name {sorted(topologies)} "
        "(--actors inline|pools|async, or one of --async-actors / --actor-pools)"
    )
  return out


def merge_sweeps(argv: Sequence[str]) -> list[str]:
  """Repeated `--sweep FIELD=VALUES` flags as one `--sweep A B ...` (tyro's form of a
  tuple), placed where the first one was."""
  out, sweeps, first, argv = [], [], None, list(argv)
  while argv:
    flag = argv.pop(0)
    name, eq, value = flag.partition("=")
    if name != "--sweep":
      out.append(flag)
      continue
    if first is None:
      first = len(out)
    if eq:
      sweeps.append(value)
      continue
    while argv and not argv[0].startswith("--"):
      sweeps.append(argv.pop(0))
  if first is not None:
    out[first:first] = ["--sweep", *sweeps]
  return out


def _flag_value(argv: Sequence[str], *names: str) -> Optional[str]:
  """The value of the last `--name VALUE` or `--name=VALUE` in argv, or None."""
  value = None
  for i, flag in enumerate(argv):
    name, eq, rest = flag.partition("=")
    if name in names:
      value = rest if eq else (argv[i + 1] if i + 1 < len(argv) else None)
  return value


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
  argv = merge_sweeps(expand_shorthands(sys.argv[1:] if argv is None else argv))
  presets = presets or {}
  unknown = sorted(set(env_presets.names()) - set(presets))
  if unknown or NO_PRESET in presets:
    raise ValueError(
        f"env_presets name presets {unknown} that are not among {sorted(presets)}"
        if unknown
        else f"{NO_PRESET!r} is reserved for the script's defaults: rename that preset"
    )
  default: Any = None
  name = _flag_value(argv, "--preset")
  named = [i for i, f in enumerate(argv) if f.partition("=")[0] == "--preset"]
  if named:
    if name != NO_PRESET and name not in presets:
      raise SystemExit(f"--preset takes one of {sorted(presets) + [NO_PRESET]}")
    drop = {j for i in named for j in (i, i + 1)[: 1 if "=" in argv[i] else 2]}
    argv = [f for j, f in enumerate(argv) if j not in drop]
  else:
    env_id = _flag_value(argv, "--env-id", "--env_id")
    name = env_presets.select(env_id) if env_id else None
    if name is not None:
      prog = prog or (sys.argv[0].rsplit("/", 1)[-1].removesuffix(".py") or "script")
      print(
          f"[{prog}] --env-id {env_id}: preset {name} (the settings for this task; --preset "
          f"{NO_PRESET} for the script's defaults)",
          flush=True,
      )
  if name is not None and name != NO_PRESET:
    default = presets[name]
  if presets:
    selected = "".join(
        f"\n  {pattern}: {name}" for pattern, name in env_presets.patterns.items()
    ) + (f"\n  Atari tasks: {env_presets.atari}" if env_presets.atari else "")
    description = (
        description + f"\n\nPresets (--preset NAME, before other flags): "
        f"{', '.join(sorted(presets))}; {NO_PRESET}: the script's defaults."
        + (f"\nSelected by --env-id when no --preset is given:{selected}" if selected else "")
    ).strip()
  return tyro.cli(
      args_cls,
      args=argv,
      default=default,
      description=description or None,
      config=(tyro.conf.OmitArgPrefixes,),
  )
