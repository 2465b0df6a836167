"""Weights & Biases tracking (`--track`), in offline mode: no network.

The offline run files (`run-<id>.wandb`: a LevelDB-style log of W&B's protobuf records)
are read back here to check what the W&B run holds: its name, config and history.
"""

import dataclasses
import json
import pathlib
import struct
import sys
import time

import pytest

from offpolicy_ac import presets
from offpolicy_ac.training import MultiLogger
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import WandbLogger
from offpolicy_ac.training import read_metrics

wandb_pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

BLOCK = 32768  # W&B's record log: LevelDB's log format after a 7-byte file header


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path, monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
  monkeypatch.setenv("WANDB_SILENT", "true")
  (tmp_path / "wandb_dir").mkdir()
  return tmp_path / "wandb_dir"


def _records(path, timeout_s=30.0):
  """The protobuf records of one finished offline run file. W&B's service may still be
  writing it when `finish` returns: read until its exit record is there."""
  deadline = time.monotonic() + timeout_s
  while True:
    records = _read_records(path)
    if any(r.WhichOneof("record_type") == "exit" for r in records):
      return records
    assert time.monotonic() < deadline, f"{path} has no exit record"
    time.sleep(0.1)


def _read_records(path):
  """The whole records written so far (none while the file's header is not yet written)."""
  data = pathlib.Path(path).read_bytes()
  if len(data) < 7:  # the service under load: the file exists, its header comes later
    return []
  assert data[:4] == b":W&B"
  records, pos, pending = [], 7, b""
  while pos + 7 <= len(data):
    if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
      pos += BLOCK - pos % BLOCK
      continue
    _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    if kind == 0 or pos + 7 + length > len(data):  # the end, or a chunk still being written
      break
    chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
    pending += chunk
    if kind in (1, 4):  # FULL or LAST
      record = wandb_pb.Record()
      record.ParseFromString(pending)
      records.append(record)
      pending = b""
  return records


def _offline_runs(wandb_dir, run_id):
  return sorted((wandb_dir / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))


def _history(path):
  rows = []
  for r in _records(path):
    if r.WhichOneof("record_type") == "history":
      rows.append(
          {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
      )
  return rows


def _run_record(path):
  return next(r.run for r in _records(path) if r.WhichOneof("record_type") == "run")


def _config(path):
  config = {}
  for r in _records(path):
    kind = r.WhichOneof("record_type")
    updates = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
    config.update({u.key: json.loads(u.value_json) for u in updates})
  return config


def test_wandb_logger_writes_metrics_config_and_name(tmp_path, offline_wandb):
  run_dir = tmp_path / "impala-run"
  run_dir.mkdir()
  logger = WandbLogger(run_dir, project="p", mode="offline", config={"algorithm": "impala"})
  logger.log({"env_steps": 100, "wall_time_s": 1.0, "episode_return": None, "loss": 0.5})
  logger.log({"env_steps": 200, "wall_time_s": 2.0, "episode_return": 9.0, "final": True})
  logger.close()
  (path,) = _offline_runs(offline_wandb, logger.run_id)
  assert _run_record(path).display_name == "impala-run"
  assert _config(path)["algorithm"] == "impala"
  rows = _history(path)
  assert [(r["env_steps"], r.get("loss"), r.get("episode_return")) for r in rows] == [
      (100, 0.5, None),
      (200, None, 9.0),
  ]
  assert "final" not in rows[1]  # only numbers are sent
  assert json.loads((run_dir / "wandb.json").read_text())["id"] == logger.run_id


def test_wandb_runs_of_a_sweep_and_of_a_job_s_processes_are_told_apart(tmp_path, offline_wandb):
  """A sweep's learners were all named seed<k>; a multi-host job's other processes were
  runs named process<i> in no group."""
  from offpolicy_ac.training import experiment

  config = TrainConfig.of(track=True, wandb_mode="offline")
  for run_dir, label, group in [(tmp_path / "root" / "learning_rate=0.001" / "seed0",
                                 "learning_rate=0.001 ", "root"),
                                (tmp_path / "root" / "process1", "", "root")]:  # fmt: skip
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"algorithm": "impala"}))
    logger = experiment._make_tracker(config, run_dir, group=group, label=label)
    logger.close()
    run_id = json.loads((run_dir / "wandb.json").read_text())["id"]
    (path,) = _offline_runs(offline_wandb, run_id)
    assert _run_record(path).display_name == f"{label}{run_dir.name}"
    assert _run_record(path).run_group == group


def test_wandb_s_own_mode_variable_applies_without_a_mode(tmp_path, offline_wandb, monkeypatch):
  """--wandb-mode passed 'online' to wandb.init by default, overriding WANDB_MODE."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # never reached
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  assert TrainConfig.of(track=True).tracking.wandb_mode is None
  logger = WandbLogger(tmp_path, project="p")
  logger.log({"env_steps": 1, "wall_time_s": 0.1, "episode_return": 1.0})
  logger.close()
  assert _offline_runs(offline_wandb, logger.run_id)


def test_a_resumed_logger_continues_the_run_without_repeating_lines(tmp_path, offline_wandb):
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  first = WandbLogger(run_dir, project="p", mode="offline")
  for step in (100, 200, 300):
    first.log({"env_steps": step, "loss": step / 100})
  first.close()
  time.sleep(1.1)  # W&B names offline run directories by the second and the run id
  second = WandbLogger(run_dir, project="p", mode="offline")
  assert second.run_id == first.run_id
  second.truncate(1)  # resumed from the checkpoint after line 1: 200 and 300 come again
  for step in (200, 300, 400):
    second.log({"env_steps": step, "loss": step / 100})
  second.close()
  paths = _offline_runs(offline_wandb, first.run_id)
  assert len(paths) == 2
  assert [r["env_steps"] for r in _history(paths[1])] == [400]


def test_wandb_logger_rejects_an_unknown_mode(tmp_path):
  with pytest.raises(ValueError, match="wandb_mode"):
    WandbLogger(tmp_path, project="p", mode="cloud")


def _impala_args(run_dir, **overrides):
  module = presets.impala
  args = module.Args()
  train = args.train.replace(total_env_steps=768, log_every=256, eval_every=0, **overrides)
  return module, dataclasses.replace(args, run_dir=str(run_dir), train=train)


def test_track_logs_a_script_run_to_wandb_and_resume_continues_it(tmp_path, offline_wandb):
  run_dir = tmp_path / "run"
  module, args = _impala_args(
      run_dir, track=True, wandb_mode="offline", wandb_project="tests", checkpoint_every=512
  )
  module.run(args)
  run_id = json.loads((run_dir / "wandb.json").read_text())["id"]
  (path,) = _offline_runs(offline_wandb, run_id)
  assert _run_record(path).display_name == "run"
  config = _config(path)
  assert config["algorithm"] == "impala"
  assert config["config"]["train"]["tracking"]["track"] is True
  logged = [(r["env_steps"], r["episode_return"]) for r in read_metrics(run_dir)]
  history = _history(path)
  assert [(r["env_steps"], r.get("episode_return")) for r in history] == logged
  assert all("loss" in r and "wall_time_s" in r for r in history)

  # W&B names an offline run's folder by the second it started and the run id: a resume
  # in the same second as the first run would write into the first run's folder.
  started = time.time()
  time.sleep(max(0.0, 1.05 - (started - int(started))))
  module.run(dataclasses.replace(args, resume=True, train=args.train.replace(total_env_steps=1280)))
  paths = _offline_runs(offline_wandb, run_id)
  assert len(paths) == 2  # the same W&B run, continued
  more = [r["env_steps"] for r in _history(paths[1])]
  assert more and min(more) > logged[-1][0]
  assert more == [r["env_steps"] for r in read_metrics(run_dir)][len(logged) :]


@pytest.mark.slow  # about 40 s on a 2-core CPU
def test_vmapped_seeds_each_get_a_wandb_run(tmp_path, offline_wandb):
  module, args = _impala_args(tmp_path / "run", track=True, wandb_mode="offline", num_seeds=2)
  module.run(args)
  for seed in (0, 1):
    state = json.loads((tmp_path / "run" / f"seed{seed}" / "wandb.json").read_text())
    (path,) = _offline_runs(offline_wandb, state["id"])
    assert _run_record(path).display_name == f"seed{seed}"
    assert _run_record(path).run_group == "run"
    assert len(_history(path)) == len(read_metrics(tmp_path / "run" / f"seed{seed}"))


def test_track_without_wandb_fails_before_training_naming_the_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  module, args = _impala_args(tmp_path / "run", track=True)
  with pytest.raises(
      ImportError,
      match=r"needs wandb, which is not installed: pip install 'offpolicy_ac\[track\]'$",
  ):
    module.run(args)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "error",
    [
        "ImportError: cannot import name builder from google.protobuf.internal",
        "TypeError: Descriptors cannot be created directly",  # protobuf's, not an ImportError
    ],
)
def test_track_with_a_broken_wandb_shows_its_error(tmp_path, monkeypatch, error):
  """wandb installed but failing to import (a dependency at a version it does not take):
  the message quotes wandb's own error."""
  (tmp_path / "fake" / "wandb").mkdir(parents=True)
  kind, message = error.split(": ", 1)
  (tmp_path / "fake" / "wandb" / "__init__.py").write_text(f"raise {kind}({message!r})\n")
  monkeypatch.syspath_prepend(str(tmp_path / "fake"))
  for name in [n for n in sys.modules if n == "wandb" or n.startswith("wandb.")]:
    monkeypatch.delitem(sys.modules, name)
  module, args = _impala_args(tmp_path / "run", track=True)
  with pytest.raises(ImportError) as raised:
    module.run(args)
  assert str(raised.value) == (
      "--track (Weights & Biases logging) needs wandb, which is installed but fails to import "
      f"({error}). pip install 'offpolicy_ac[track]' installs it with what it needs"
  )
  assert not (tmp_path / "run").exists()


def test_multi_logger_fans_out_and_closes_all():
  calls = []

  class Recorder:

    def __init__(self, name, fail_close=False):
      self.name, self.fail_close = name, fail_close

    def log(self, record):
      calls.append((self.name, "log", record["env_steps"]))

    def truncate(self, num_lines):
      calls.append((self.name, "truncate", num_lines))

    def close(self):
      calls.append((self.name, "close", None))
      if self.fail_close:
        raise RuntimeError("close failed")

  both = MultiLogger(Recorder("a", fail_close=True), Recorder("b"))
  both.truncate(3)
  both.log({"env_steps": 7})
  with pytest.raises(RuntimeError, match="close failed"):
    both.close()
  assert calls == [("a", "truncate", 3), ("b", "truncate", 3), ("a", "log", 7),
                   ("b", "log", 7), ("a", "close", None), ("b", "close", None)]  # fmt: skip


def test_config_rejects_an_unknown_wandb_mode():
  with pytest.raises(ValueError, match="wandb_mode"):
    TrainConfig.of(wandb_mode="cloud").validate()


def test_wandb_refusing_its_run_refuses_the_run_in_one_line(tmp_path, monkeypatch):
  import wandb  # pylint: disable=import-outside-toplevel

  from offpolicy_ac.training import is_refusal  # pylint: disable=import-outside-toplevel

  def no_key(**kwargs):
    raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

  monkeypatch.setattr(wandb, "init", no_key)
  module, args = _impala_args(tmp_path / "run", track=True)
  with pytest.raises(ValueError, match=r"--track: W&B could not start its run: No API key") as e:
    module.run(args)
  assert is_refusal(e.value)
  # Refused before the logs were made: no empty metrics file, TensorBoard folder or plot.
  assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock", "config.json"]


def test_a_learner_s_w_and_b_run_refused_leaves_no_logs_and_ends_the_others(tmp_path,
                                                                              offline_wandb,
                                                                              monkeypatch):  # fmt: skip
  """W&B refusing a run was found after the run directory's logs were made (an empty
  metrics file, a TensorBoard folder, a plot of nothing), and a sweep's other learners'
  logs were left open."""
  import wandb  # pylint: disable=import-outside-toplevel

  started, init = [], wandb.init

  def second_refused(**kwargs):
    if started:
      raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")
    started.append(init(**kwargs))
    return started[-1]

  monkeypatch.setattr(wandb, "init", second_refused)
  module, args = _impala_args(tmp_path / "root", track=True, num_seeds=2)
  with pytest.raises(ValueError, match=r"--track: W&B could not start its run: No API key"):
    module.run(args)
  made = [
      sorted(p.name for p in (tmp_path / "root" / seed).iterdir()) for seed in ("seed0", "seed1")
  ]
  assert made == [[".lock", "config.json", "wandb.json"], [".lock", "config.json"]]
  run_id = started[0].id
  (path,) = _offline_runs(offline_wandb, run_id)
  assert any(r.WhichOneof("record_type") == "exit" for r in _records(path))  # finished


def test_tracking_settings_without_track_are_refused():
  for field, value in [("wandb_mode", "offline"), ("wandb_project", "p"), ("wandb_entity", "e")]:
    with pytest.raises(ValueError, match="apply to --track"):
      TrainConfig.of(**{field: value}).validate()
  TrainConfig.of(track=True, wandb_mode="offline").validate()
