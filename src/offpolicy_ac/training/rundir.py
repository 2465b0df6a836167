"""The run directory (docs/design.md, contract 3): its config.json, parameters and summary.

    check_or_write_config(name, args, run_dir, resume)   # refuse overwriting / a changed config
    write_results(name, run_dir, result, protocol, stopped_by=None)  # parameters, summary.json
    params = load_params(run_dir / FINAL_PARAMS, template)

`training.load_run` (`training/runs.py`) reads what these write.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from typing import Any
from typing import Optional
from typing import Sequence

import flax.serialization
import jax

from offpolicy_ac.training import records
from offpolicy_ac.training.config import TrainConfig
from offpolicy_ac.training.driver import RunResult
from offpolicy_ac.training.logger import jsonable
from offpolicy_ac.training.logger import write_config

FINAL_PARAMS = "final_params.msgpack"
FINAL_TRANSFORM = "final_transform.msgpack"

RESUMABLE_CHANGES = (
    "train.budget.total_env_steps",
    "train.parallel.coordinator_address",
    "train.tracking.track",
    "train.tracking.wandb_project",
    "train.tracking.wandb_entity",
    "train.tracking.wandb_mode",
    "resume",
    "run_dir",
)
"""Config fields that may change when a run is resumed."""


def save_params(path: pathlib.Path, params: Any) -> None:
  """Writes parameters (flax msgpack) atomically."""
  tmp = path.with_suffix(".tmp")
  tmp.write_bytes(flax.serialization.to_bytes(jax.device_get(params)))
  os.replace(tmp, path)


def load_params(path: str | os.PathLike, template: Any) -> Any:
  """Reads parameters written by `save_params` into the structure of `template`."""
  return flax.serialization.from_bytes(template, pathlib.Path(path).read_bytes())


def default_run_dir(name: str, config: TrainConfig) -> str:
  stamp = time.strftime("%Y%m%d-%H%M%S")
  return os.path.join("runs", f"{name}-{config.env.env_id}-seed{config.budget.seed}-{stamp}")


def _flatten(d: Any, prefix: str = "") -> dict:
  if isinstance(d, dict):
    out = {}
    for k, v in d.items():
      out.update(_flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: d}


def config_differences(old: dict, new: dict, defaults: Optional[dict] = None) -> list[str]:
  """Fields (dotted) whose values differ, ignoring RESUMABLE_CHANGES. A field the old
  config lacks (added to the library since) counts as unchanged when the new value is
  its default in `defaults`: a new field's default keeps the old behaviour."""
  a, b = _flatten(old), _flatten(new)
  known = _flatten(defaults) if defaults is not None else {}
  for k in set(b) - set(a):
    if k in known:
      a[k] = known[k]
  return sorted(k for k in set(a) | set(b) if k not in RESUMABLE_CHANGES and a.get(k) != b.get(k))


def holds_run(run_dir: pathlib.Path) -> bool:
  """Whether a run logged or checkpointed anything there (a run refused before its
  first step leaves only config.json and an empty metrics.jsonl: not a run)."""
  metrics = run_dir / "metrics.jsonl"
  checkpoints = run_dir / "checkpoints"
  return (metrics.exists() and metrics.stat().st_size > 0) or (
      checkpoints.exists() and any(checkpoints.iterdir())
  )


def _field_defaults(args: Any) -> Optional[dict]:
  """The script's default args as JSON (None when its args class needs arguments)."""
  try:
    return jsonable(type(args)())
  except TypeError:
    return None


def check_or_write_config(name: str, args: Any, run_dir: pathlib.Path, resume: bool,
                          others: Sequence[pathlib.Path] = ()) -> None:  # fmt: skip
  """On resume, refuses a changed config; otherwise refuses to overwrite a run (in
  `run_dir` or any of `others`). Then writes config.json."""
  config_path = run_dir / "config.json"
  if resume:
    if not config_path.exists():
      raise FileNotFoundError(f"--resume: {run_dir} holds no run (no config.json)")
    old = json.loads(config_path.read_text())
    if "loop" in old["config"]:
      raise ValueError(
          f"--resume: {run_dir} was written by offpolicy_ac 0.1 (a flat `loop` config, "
          "checkpoint record format 1); this version reads format "
          f"{records.RECORD_FORMAT} (a grouped `train` config): resume that run with "
          "offpolicy_ac 0.1"
      )
    diffs = config_differences(old["config"], jsonable(args), _field_defaults(args))
    if old.get("algorithm") != name:
      diffs.insert(0, f"algorithm ({old.get('algorithm')} -> {name})")
    if diffs:
      raise ValueError(
          f"--resume: the config differs from the run's in {diffs}; only the "
          "step budget (--total-env-steps) and the tracking flags may change"
      )
  else:
    for d in (run_dir, *others):
      if holds_run(d):
        raise FileExistsError(
            f"{d} already holds a run: pass --resume to continue it, or choose another --run-dir"
        )
  run_dir.mkdir(parents=True, exist_ok=True)
  write_config(run_dir, args, extra={"algorithm": name})


def write_results(name: str, run_dir: pathlib.Path, result: RunResult, protocol: str,
                  stopped_by: Optional[str] = None) -> dict:  # fmt: skip
  """Writes a finished (or stopped) run's final parameters, its data transformer's state
  (when it has one: observation statistics the policy acts with) and summary.json;
  returns the summary."""
  save_params(run_dir / FINAL_PARAMS, result.agent_state.params)
  if jax.tree.leaves(result.transform_state):
    save_params(run_dir / FINAL_TRANSFORM, result.transform_state)
  summary = {
      k: v
      for k, v in dataclasses.asdict(result).items()
      if k not in ("agent_state", "transform_state")
  }
  summary["run_dir"] = str(run_dir)
  summary["evaluation_protocol"] = protocol
  if stopped_by:
    summary["stopped_by"] = stopped_by
  (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
  print(f"[{name}] done: {summary}", flush=True)
  return summary
