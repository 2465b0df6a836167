r"""Records demonstrations with a finished run's final (or `--best`) parameters (`load_run`).

    python experiments/record_demos.py --run-dir runs/sql-cartpole --episodes 10 \
        --out demos/cartpole.npz

`--policy behaviour` samples actions as the run trained (for players whose greedy policy
gets stuck, playing until the time limit). On Atari each of `--episodes` is a whole game,
recorded as the episodes its life losses end (as in training).

Continuous actions are recorded as the environment takes them, clipped to its action box
(a Gaussian policy's, IMPALA's or ACER's, lie outside it), so sqil.py accepts the file;
`--action-box-fraction 0.9` keeps them off the box's faces.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Literal
from typing import Optional

import numpy as np

from offpolicy_ac import demos as demos_lib
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import check_outside_run
from offpolicy_ac.cli import check_paths_given
from offpolicy_ac.cli import check_suffix
from offpolicy_ac.cli import import_modules
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import load_run
from offpolicy_ac.training import pool_seed
from offpolicy_ac.training.config import MAX_SEED
from offpolicy_ac.training.evaluation import episode_pools


@dataclasses.dataclass(frozen=True)
class Args:
  run_dir: str
  """A finished run (holds config.json and final_params.msgpack, or checkpoints)."""
  out: str
  """Output .npz file (a file's path: a folder, or a path ending in /, is refused)."""
  episodes: int = 10
  """Episodes to record (one per environment, each from a fresh reset; in pools of at most
  256 environments, `training.evaluation.episode_pools`, as evaluate.py plays them). On
  Atari, whole games, each recorded as the episodes its life losses end (as in training)."""
  seed: int = 12345
  """Seed of the recording environments (`training.pool_seed(seed, "evaluate")`, as
  evaluate.py's) and of the behaviour policy's actions."""
  best: bool = False
  """Play the best-evaluated parameters (best_params.msgpack) instead of the final ones."""
  policy: Literal["greedy", "behaviour"] = "greedy"
  """'greedy': the greedy (discrete) or mean (continuous) action, as the in-training
  evaluation acts; 'behaviour': actions sampled from the policy the run trained with."""
  action_box_fraction: Optional[float] = None
  """Continuous actions: clip them to the action box shrunk to this fraction of its width
  around its centre (1: the box itself; 0.9: its middle 90%), so the file holds the actions
  taken (`demos.clip_to_box`).
  Below 1 keeps them off the box's faces, which SQIL's tanh sampler reaches only in the
  limit. None (default): 1 for continuous actions (the environment clips a Gaussian's to
  the box: the file holds the actions it takes, which sqil.py accepts); discrete actions
  are recorded as they are."""
  import_modules: tuple[str, ...] = ()
  """Modules to import first (dotted names, or .py files): those that register the run's
  custom agent or torso (agents.register_agent, networks.register_torso)."""


def _is_npz(path: pathlib.Path) -> bool:
  return path.suffix.lower() == ".npz"


def _plural(count: int, noun: str) -> str:
  return f"{count} {noun}{'' if count == 1 else 's'}"


def _note_actions_on_the_faces(actions: np.ndarray, spec) -> None:
  """One line on stderr when recorded continuous actions lie on the action box's faces
  (the default clip to the box itself put a Gaussian's there): SQIL's tanh sampler
  reaches them only in the limit."""
  low, high = (np.asarray(b).astype(actions.dtype).reshape(spec.action_shape)
               for b in (spec.action_low, spec.action_high))  # fmt: skip
  on_face = ((actions <= low) | (actions >= high)).reshape(len(actions), -1).any(axis=1)
  if on_face.any():
    print(f"note: {on_face.mean():.0%} of the steps' actions lie on the action box's faces "
          "(clipped to it, as the environment clips them); SQIL's tanh sampler reaches them "
          "only in the limit: --action-box-fraction 0.9 keeps them inside", file=sys.stderr)  # fmt: skip


def main(args: Args) -> dict:
  check_paths_given({"--run-dir": args.run_dir, "--out": args.out})
  if not 0 <= args.seed < MAX_SEED:  # a PRNG key's seed (the behaviour policy's)
    raise ValueError(f"--seed must be in [0, 2**32), got {args.seed}")
  pools = episode_pools(args.episodes, pool_seed(args.seed, "evaluate"))  # checks --episodes
  fraction = args.action_box_fraction
  if fraction is not None and not 0.0 < fraction <= 1.0:
    raise ValueError(f"--action-box-fraction must lie in (0, 1], got {fraction}")
  out = check_output_file("--out", args.out, example="demos.npz")  # with ~ expanded
  # Demonstrations recorded into the run before may be replaced: a run writes no .npz.
  check_outside_run("--out", args.out, args.run_dir, may_overwrite=_is_npz)
  check_suffix("--out", args.out, ".npz", "a NumPy .npz archive")
  import_modules("--import-modules", args.import_modules)
  run = load_run(args.run_dir, best=args.best)
  env_id = run.config.env.env_id
  policy = run.greedy_policy() if args.policy == "greedy" else run.behaviour_policy(args.seed)
  spec = run.agent.spec
  if args.action_box_fraction is not None and spec.num_actions is not None:
    raise ValueError(f"--action-box-fraction needs continuous actions; {env_id} has "
                     f"{spec.num_actions} discrete ones")  # fmt: skip
  if spec.num_actions is None:  # continuous: by default, clipped to the box itself
    fraction = 1.0 if args.action_box_fraction is None else args.action_box_fraction
    policy = demos_lib.clip_to_box(policy, spec.action_low, spec.action_high, fraction)
  parts = []
  for size, seed in pools:  # bounded memory; on envpool, the episodes of one pool
    with run.make_env(size, seed) as env:
      parts.append(demos_lib.record_episodes(env, policy, size))
  demos = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
  out.parent.mkdir(parents=True, exist_ok=True)
  demos_lib.save_demos(out, demos, env_id=env_id)
  ends = np.cumsum(demos["episode_lengths"])
  starts = np.concatenate([[0], ends[:-1]])
  returns = [float(demos["reward"][s + 1 : e].sum()) for s, e in zip(starts, ends)]
  what = f"{_plural(args.episodes, 'episode')} of {env_id}"
  if len(returns) > args.episodes:  # Atari: the games' lives, each an episode as in training
    what = (f"{_plural(args.episodes, 'game')} of {env_id} (mean score "
            f"{sum(returns) / args.episodes:.1f}) as {len(returns)} episodes, a life loss "
            "ending one as in training")  # fmt: skip
  print(
      f"recorded {what} ({args.policy} policy, {run.source} parameters) to {out}: returns "
      f"{returns} (mean {np.mean(returns):.1f})",
      flush=True,
  )
  if spec.num_actions is None and args.action_box_fraction is None:
    _note_actions_on_the_faces(demos["action"], spec)
  return demos


if __name__ == "__main__":
  # A bad run directory, file or setting: one line and exit code 2.
  script_main(lambda: parse_plain(Args, __doc__), main, refuse=(ValueError, OSError))
