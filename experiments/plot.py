"""Overlays learning curves of several runs (mean and min-max spread over seeds).

python experiments/plot.py runs/impala-* --out impala.png
python experiments/plot.py runs/a runs/b --separate --out ab.png
"""

from __future__ import annotations

import dataclasses

import tyro

from offpolicy_ac.training import plot_runs


@dataclasses.dataclass(frozen=True)
class Args:
  run_dirs: tyro.conf.Positional[tuple[str, ...]]
  """Run directories (each holds a metrics.jsonl)."""
  out: str = "learning_curves.png"
  """Output PNG."""
  separate: bool = False
  """Draw each run on its own instead of the mean and spread over runs (seeds)."""
  title: str = ""
  """Figure title."""


def main(args: Args) -> None:
  path = plot_runs(list(args.run_dirs), args.out, title=args.title, group=not args.separate)
  print(f"wrote {path}")


if __name__ == "__main__":
  main(tyro.cli(Args))
