"""Evaluates a run's greedy policy, and records a video of it.

    python experiments/evaluate.py --run-dir runs/impala-cartpole --episodes 10
    python experiments/evaluate.py --run-dir runs/impala-cartpole --video greedy.mp4
    python experiments/evaluate.py --run-dir runs/impala-pong --checkpoint 2000000
    python experiments/evaluate.py --run-dir runs/impala-cartpole --best   # best evaluated

Plays `--episodes` episodes with the deterministic policy (greedy, or the Gaussian's
mean), each on its own freshly reset environment, as the in-training evaluation does
(`training/evaluation.py`); prints each episode's return and their mean, std (of the
episodes played: NumPy's, ddof 0), min and max, and writes them to
<run-dir>/evaluation.json (`evaluation_best.json` with `--best`,
`evaluation_checkpoint<N>.json` for checkpoint N's, with `--checkpoint N` or where the final
parameters are missing or older; or `--out`, which, like `--video`,
may not name a file of this run or another, or a path in their folders: `check_outputs`). The
episodes are played in pools of at most 256 environments seeded from
`training.pool_seed(seed, "evaluate")` (`training.evaluation.episode_pools`): on envpool
tasks, the same episodes as one pool of them all, in bounded memory. With `--video`, also
renders episode 0 (same seed, so the same episode) with envpool's renderer and writes an
MP4. Runs on JAX environments (gymnax, brax) evaluate on a host pool of them
(`envs.FunctionalPool`); they cannot be rendered (`--video` fails before evaluating).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import re
from typing import Any
from typing import Optional

import numpy as np

from offpolicy_ac import envs
from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import check_outside_run
from offpolicy_ac.cli import check_paths_given
from offpolicy_ac.cli import check_suffix
from offpolicy_ac.cli import import_modules
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import RenderedEpisode
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import describe_protocol
from offpolicy_ac.training import evaluate
from offpolicy_ac.training import load_run
from offpolicy_ac.training import pool_seed
from offpolicy_ac.training import write_video
from offpolicy_ac.training.evaluation import EpisodeLimitError
from offpolicy_ac.training.evaluation import episode_pools
from offpolicy_ac.training.logger import write_atomic
from offpolicy_ac.training.sources import task_kwargs
from offpolicy_ac.training.video import check_fps
from offpolicy_ac.training.video import check_video_path
from offpolicy_ac.training.video import video_writer


@dataclasses.dataclass(frozen=True)
class Args:
  run_dir: str
  """A run directory written by an experiment script (impala, acer, sql, sqil)."""
  episodes: int = 10
  """Episodes to play, each on its own environment."""
  seed: int = 0
  """Seed of the evaluation environments (`training.pool_seed(seed, "evaluate")`: unrelated
  to any run's training and evaluation pools)."""
  checkpoint: Optional[int] = None
  """Evaluate the checkpoint taken at this many env steps (default: the final
  parameters, or the newest checkpoint of a run that wrote none)."""
  best: bool = False
  """Evaluate the best-evaluated parameters (best_params.msgpack) instead of the final
  ones."""
  out: Optional[str] = None
  """Where to write the results as JSON (default: <run-dir>/evaluation.json, or
  evaluation_best.json with --best, evaluation_checkpoint<N>.json for checkpoint N's
  parameters)."""
  video: Optional[str] = None
  """Also write an MP4 of episode 0 here."""
  fps: Optional[float] = None
  """Frames per second of the video (default: real time on Atari, one frame per env step
  at 60 emulator frames a second over the frame skip: 15; 30 on other tasks); from 0.001 to
  1,000,000."""
  max_steps: int = 1_000_000
  """Give up (an error) if the episodes of a pool (`POOL_SIZE`) have not ended after this
  many steps."""
  import_modules: tuple[str, ...] = ()
  """Modules to import first (dotted names, or .py files): those that register the run's
  custom agent or torso (agents.register_agent, networks.register_torso)."""


def main(args: Args) -> dict:
  """Evaluates; returns what it writes to the JSON file."""
  check_paths_given({"--run-dir": args.run_dir, "--out": args.out, "--video": args.video})
  if args.seed < 0:
    raise ValueError(f"--seed must be >= 0, got {args.seed}")
  pools = episode_pools(args.episodes, pool_seed(args.seed, "evaluate"))  # checks --episodes
  if args.best and args.checkpoint is not None:
    raise ValueError("--best and --checkpoint: choose one (the best-evaluated parameters, or "
                     "those of a checkpoint)")  # fmt: skip
  if args.max_steps < 1:
    raise ValueError(f"--max-steps must be >= 1, got {args.max_steps}")
  if args.fps is not None:
    check_fps(args.fps, "--fps")
  if args.fps is not None and not args.video:
    raise ValueError("--fps sets the video's frame rate: it applies to --video")
  if args.out:
    check_output_file("--out", args.out, example="evaluation.json")
  if args.video:
    check_output_file("--video", args.video, example="episode.mp4")
    check_video_path(args.video)
    try:
      video_writer()  # before the episodes are played
    except ImportError as e:
      raise ValueError(f"--video: {e}") from e
  check_outputs(args)
  if args.out:
    check_suffix("--out", args.out, ".json", "JSON")
  import_modules("--import-modules", args.import_modules)
  run = load_run(args.run_dir, checkpoint=args.checkpoint, best=args.best)
  if not args.out:  # before the episodes are played
    check_output_file("--out", _default_out(run))
  with contextlib.ExitStack() as stack:
    # The video's pool first: a task that cannot render (a JAX environment) fails now.
    video_env = None
    if args.video:
      try:
        video_env = stack.enter_context(
            run.make_env(1, pool_seed(args.seed, "evaluate"), render_mode="rgb_array")
        )
      except ValueError as e:  # a task that cannot be rendered
        raise ValueError(f"--video: {e}") from e
    try:
      return _evaluate(args, run, pools, video_env)
    except EpisodeLimitError as e:
      raise ValueError(f"{e}: raise --max-steps") from e


_OWN_FILE = re.compile(r"evaluation(_best|_checkpoint\d+)?\.json|.*\.mp4", re.IGNORECASE)
"""The names of the files in a run directory that evaluate.py may overwrite: its own
results (`_default_out`) and videos (a run writes none)."""
_RESULT_KEYS = {"run_dir", "parameters", "returns", "protocol"}


def _written_here(path: pathlib.Path) -> bool:
  """Whether the file `path` is evaluate.py's: named as its results or videos are, or
  results it wrote to an `--out` of another name (a JSON object with their fields)."""
  if _OWN_FILE.fullmatch(path.name):
    return True
  if path.suffix.lower() != ".json" or not path.is_file():
    return False
  try:
    written = json.loads(path.read_text())
  except (OSError, ValueError):
    return False
  return isinstance(written, dict) and _RESULT_KEYS <= written.keys()


def check_outputs(args: Args) -> None:
  """Refuses (ValueError naming the flag) an `--out` or `--video` that would overwrite the
  run evaluated or another (`cli.check_outside_run`; evaluate.py's own results and videos
  there may be overwritten: `_written_here`), and the two naming the same file (the results would
  replace the video)."""
  outputs = {flag: path for flag, path in (("--out", args.out), ("--video", args.video)) if path}
  for flag, given in outputs.items():
    check_outside_run(flag, given, args.run_dir, may_overwrite=_written_here)
  if len(outputs) == 2:
    out, video = (pathlib.Path(p).expanduser().resolve() for p in outputs.values())
    if out == video:
      raise ValueError(f"--out {args.out} and --video {args.video} are the same file: the "
                       "results would replace the video; give each its own path")  # fmt: skip


def video_fps(config: TrainConfig) -> float:
  """The video's default frame rate for a run: an Atari game's real time (60 emulator
  frames a second, `frame_skip` of them per env step and video frame), else 30."""
  if config.env.atari:
    return 60 / envs.atari_protocol(config.env.env_id, **task_kwargs(config)).frame_skip
  return 30.0


def _default_out(run: Any) -> pathlib.Path:
  """The results file in the run directory, one per set of parameters the run loaded
  (`run.source`): an evaluation of the best ones, or of a checkpoint's (asked for, or the
  newest where the final ones are missing or older), does not overwrite the final ones'."""
  if run.source == "best":
    return run.run_dir / "evaluation_best.json"
  if run.source == "checkpoint":
    return run.run_dir / f"evaluation_checkpoint{run.env_steps}.json"
  return run.run_dir / "evaluation.json"


def _evaluate(args: Args, run: Any, pools: list[tuple[int, int]], video_env: Any) -> dict:
  """`main` after its checks: evaluates, writes the JSON, renders into `video_env`."""
  env_id = run.config.env.env_id
  returns = []
  for size, seed in pools:
    with run.make_env(size, seed) as env:
      returns.append(evaluate(env, run.greedy, run.acting, size, max_steps=args.max_steps))
  returns = np.concatenate(returns)
  protocol = describe_protocol(run.config, args.episodes)
  result = {
      "run_dir": str(run.run_dir),
      "algorithm": run.algorithm,
      "env_id": env_id,
      "parameters": run.source,
      "env_steps": run.env_steps,
      "seed": args.seed,
      "episodes": args.episodes,
      "returns": returns.tolist(),
      "mean": float(np.mean(returns)),
      "std": float(np.std(returns)),
      "min": float(np.min(returns)),
      "max": float(np.max(returns)),
      "protocol": protocol,
  }
  for k, ret in enumerate(returns):
    print(f"episode {k}: return {ret:.2f}")
  print(
      f"{run.algorithm} {env_id} ({run.source} parameters, "
      f"{'unknown' if run.env_steps is None else f'{run.env_steps:,}'} env steps): "
      f"{args.episodes} episode{'s' * (args.episodes != 1)}, mean {result['mean']:.2f} "
      f"std {result['std']:.2f} "
      f"min {result['min']:.2f} max {result['max']:.2f}"
  )
  print(f"protocol: {protocol}")
  out = pathlib.Path(args.out).expanduser() if args.out else _default_out(run)
  out.parent.mkdir(parents=True, exist_ok=True)
  write_atomic(out, json.dumps(result, indent=2))  # before rendering, which may fail
  print(f"wrote {out}")
  if args.video:
    episode = RenderedEpisode(video_env, run.greedy, run.acting, max_steps=args.max_steps)
    fps = video_fps(run.config) if args.fps is None else args.fps
    path = write_video(args.video, episode, fps=fps)  # each frame as it is rendered
    frames, video_return = episode.num_frames, episode.episode_return
    result["video"] = {"path": str(path), "frames": frames, "fps": fps, "return": video_return}
    write_atomic(out, json.dumps(result, indent=2))
    print(f"video of episode 0 ({frames} frames, return {video_return:.2f}): {path}")
  return result


if __name__ == "__main__":
  # A bad run directory, file or setting: one line and exit code 2.
  script_main(lambda: parse_plain(Args, __doc__), main, refuse=(ValueError, OSError))
