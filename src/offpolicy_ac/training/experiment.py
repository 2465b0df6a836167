"""Shared plumbing of the experiment scripts: run dir, config.json, logger, summary."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from typing import Any, Callable, Optional

import flax.serialization
import jax

from offpolicy_ac.training.logger import RunLogger
from offpolicy_ac.training.logger import write_config
from offpolicy_ac.training.loop import LoopConfig
from offpolicy_ac.training.loop import RunResult
from offpolicy_ac.training.loop import train


def save_params(path: pathlib.Path, params: Any) -> None:
  """Writes parameters (flax msgpack) atomically."""
  tmp = path.with_suffix(".tmp")
  tmp.write_bytes(flax.serialization.to_bytes(jax.device_get(params)))
  os.replace(tmp, path)


def load_params(path: str | os.PathLike, template: Any) -> Any:
  """Reads parameters written by `save_params` into the structure of `template`."""
  return flax.serialization.from_bytes(template, pathlib.Path(path).read_bytes())


def default_run_dir(name: str, loop: LoopConfig) -> str:
  stamp = time.strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{name}-{loop.env_id}-seed{loop.seed}-{stamp}")


def run_experiment(name: str, args: Any, agent_factory: Callable, *,
                   batch_fn: Optional[Callable] = None,
                   progress: Optional[bool] = None) -> RunResult:
  """Runs `train` for a script's args (fields `loop`, `agent`, `run_dir`).

  Writes config.json first, then metrics.jsonl / TensorBoard / PNG as it goes,
  and summary.json at the end (env steps, wall time, whether the target was
  reached, last evaluation).
  """
  loop: LoopConfig = args.loop
  run_dir = pathlib.Path(args.run_dir or default_run_dir(name, loop))
  run_dir.mkdir(parents=True, exist_ok=True)
  write_config(run_dir, args, extra={"algorithm": name})
  logger = RunLogger(run_dir, total_env_steps=loop.total_env_steps,
                     title=f"{name} {loop.env_id} seed {loop.seed}", progress=progress)
  try:
    result = train(agent_factory, loop, logger, batch_fn=batch_fn)
  finally:
    logger.close()
  save_params(run_dir / "final_params.msgpack", result.agent_state.params)
  summary = {k: v for k, v in dataclasses.asdict(result).items() if k != "agent_state"}
  summary["run_dir"] = str(run_dir)
  (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
  print(f"[{name}] done: {summary}", flush=True)
  return result
