"""Run directories as offpolicy_ac 0.2 wrote them, made from a run of this version: the
files' 0.2 forms observed in runs of 0.2.0 (commit 779d0fc), so that no binary fixture is
kept."""

import json
import pathlib
import shutil


def as_written_by_0_2(run_dir):
  """Rewrites the run in `run_dir` (a single run, or a run of several seeds) in place as 0.2
  wrote it: config.json with `train.replay.whole_replay_buffer_training` (removed since) and
  a vmapped seed's root as `vmapped_seeds_of` (its lane unrecorded); checkpoints of record
  format 2 without checksums.json; parameters without their .crc32; no best parameters."""
  run_dir = pathlib.Path(run_dir)
  for config_path in [run_dir / "config.json", *run_dir.glob("seed*/config.json")]:
    record = json.loads(config_path.read_text())
    record["config"]["train"]["replay"]["whole_replay_buffer_training"] = False
    for field in ("sweep", "compile_for"):
      record["config"]["train"]["budget"].pop(field, None)
    if record.pop("learners_of", None) is not None:
      record["vmapped_seeds_of"] = str(run_dir)
      del record["learner"], record["learners"]
    config_path.write_text(json.dumps(record))
  for step in (run_dir / "checkpoints").iterdir():
    (step / "checksums.json").unlink()
    record_path = step / "record" / "metadata"
    record = json.loads(record_path.read_text())
    record["format"] = 2
    record_path.write_text(json.dumps(record))
  for pattern in ("*.crc32", "seed*/*.crc32", "best*", "seed*/best*"):
    for path in run_dir.glob(pattern):
      shutil.rmtree(path) if path.is_dir() else path.unlink()
  for summary_path in [run_dir / "summary.json", *run_dir.glob("seed*/summary.json")]:
    if summary_path.exists():
      summary = json.loads(summary_path.read_text())
      for field in ("best_eval_return", "best_env_steps", "checkpoint_env_steps"):
        summary.pop(field, None)
      summary_path.write_text(json.dumps(summary))
