"""Command lines of the experiment scripts: tyro over a frozen dataclass, with presets.

    python experiments/impala.py --env-id CartPole-v1 --seed 0      # the script's defaults
    python experiments/impala.py --preset atari --env-id Breakout-v5  # a preset, then flags

A preset is a complete Args value; flags given after it override its fields.
Nested configs (`loop`, `agent`) are flattened: `--learning-rate`, not
`--agent.learning-rate`.
"""

from __future__ import annotations

import sys
from typing import Any
from typing import Optional
from typing import Sequence
from typing import TypeVar

import tyro

ArgsT = TypeVar("ArgsT")


def parse_args(
    args_cls: type[ArgsT],
    presets: Optional[dict[str, ArgsT]] = None,
    argv: Optional[Sequence[str]] = None,
    description: str = "",
) -> ArgsT:
  """Parses argv into `args_cls`, starting from `--preset NAME` when given."""
  argv = list(sys.argv[1:] if argv is None else argv)
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
