"""Command lines of the experiment scripts: tyro over a frozen dataclass, with presets.

    python experiments/impala.py --env-id CartPole-v1 --seed 0      # the script's defaults
    python experiments/impala.py --preset atari --env-id Breakout-v5  # a preset, then flags

A preset is a complete Args value; flags given after it override its fields.
Nested configs (`train` and its groups, `agent`) are flattened: `--learning-rate`, not
`--agent.learning-rate`. Shorthands: `--async-actors K` is `--actors async --num-actors
K`, `--actor-pools K` is `--actors pools --num-actors K`, `--xla-rollout` is
`--rollout compiled`. `--sweep` may be repeated, one field each (`--sweep
learning_rate=1e-3,3e-3 --sweep gamma=0.99,0.995`).
"""

from __future__ import annotations

import sys
from typing import Any
from typing import Optional
from typing import Sequence
from typing import TypeVar

import tyro

ArgsT = TypeVar("ArgsT")


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


def parse_args(
    args_cls: type[ArgsT],
    presets: Optional[dict[str, ArgsT]] = None,
    argv: Optional[Sequence[str]] = None,
    description: str = "",
) -> ArgsT:
  """Parses argv into `args_cls`, starting from `--preset NAME` when given."""
  argv = merge_sweeps(expand_shorthands(sys.argv[1:] if argv is None else argv))
  presets = presets or {}
  default: Any = None
  if "--preset" in argv:
    i = argv.index("--preset")
    if i + 1 >= len(argv) or argv[i + 1] not in presets:
      raise SystemExit(f"--preset takes one of {sorted(presets)}")
    default = presets[argv[i + 1]]
    del argv[i : i + 2]
  if presets:
    description = (
        description + f"\n\nPresets (--preset NAME, before other flags): "
        f"{', '.join(sorted(presets))}."
    ).strip()
  return tyro.cli(
      args_cls,
      args=argv,
      default=default,
      description=description or None,
      config=(tyro.conf.OmitArgPrefixes,),
  )
