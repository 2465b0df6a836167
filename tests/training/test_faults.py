"""Faults a run must survive without silent damage: stop signals and kill -9 at any moment
(during a checkpoint write too), two processes on one run directory, flipped bytes in
checkpoints and parameters, and non-finite data from the environment.

Each scripted run is experiments/impala.py on CartPole in a process of its own, as a user
runs it (the runs that go to their end are forked off `tests/script_server.py`'s server);
the reference is the uninterrupted run with the same flags (metrics.jsonl but the
wall-clock fields, and the final parameters byte for byte).
"""

import contextlib
import dataclasses
import errno
import json
import logging
import os
import pathlib
import random
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from script_server import run_script

from offpolicy_ac.presets import impala
from offpolicy_ac.training import checkpoint
from offpolicy_ac.training import load_run
from offpolicy_ac.training import make_training_rollout
from offpolicy_ac.training import rundir
from offpolicy_ac.training.driver import NonFiniteError
from offpolicy_ac.training.driver import ResumeError

ROOT = pathlib.Path(__file__).parents[2]
WALL_CLOCK = ("wall_time_s", "env_steps_per_s")
# 256 env steps per iteration (16 envs x 16 steps); a checkpoint every 5 iterations.
FLAGS = ["--checkpoint-every", "1280", "--log-every", "640", "--eval-every", "1280",
         "--eval-episodes", "2"]  # fmt: skip
TOTAL = 6400


def _cmd(run_dir, *extra, steps=TOTAL):
  return [sys.executable, str(ROOT / "experiments" / "impala.py"), "--run-dir", str(run_dir),
          "--total-env-steps", str(steps), *FLAGS, *extra]  # fmt: skip


def _run(run_dir, *extra, check=True, steps=TOTAL):
  script, *args = _cmd(run_dir, *extra, steps=steps)[1:]
  proc = run_script(script, args, timeout=600)
  if check and proc.returncode != 0:
    raise AssertionError(f"{run_dir} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
  return proc


def _metrics(run_dir):
  lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in l.items() if k not in WALL_CLOCK} for l in lines]


def _same_run(run_dir, straight):
  assert _metrics(run_dir) == _metrics(straight)
  final = "final_params.msgpack"
  assert (run_dir / final).read_bytes() == (straight / final).read_bytes()


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
  run_dir = tmp_path_factory.mktemp("straight") / "run"
  _run(run_dir)
  return run_dir


def _checkpoints(run_dir):
  ckpts = run_dir / "checkpoints"
  return sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.exists() else []


def _start_and_wait(run_dir, ready, *extra, steps=TOTAL):
  """Starts a run; returns its process once `ready(run_dir)` holds (polled every ms)."""
  proc = subprocess.Popen(_cmd(run_dir, *extra, steps=steps), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None and not ready(run_dir):
    time.sleep(0.001)
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  return proc


def _lines(run_dir):
  path = run_dir / "metrics.jsonl"
  return path.read_text().count("\n") if path.exists() else 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_at_a_random_moment_resumes_exactly(tmp_path, straight, sig):
  rng = random.Random(sig)
  run_dir = tmp_path / "run"
  proc = _start_and_wait(run_dir, lambda d: _lines(d) >= 1)
  time.sleep(rng.uniform(0.0, 0.8))  # the run takes about 2.5 s from its first line
  proc.send_signal(sig)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["interrupted"] and summary["stopped_by"] == sig.name
  assert "--resume continues" in out
  # The stop writes no checkpoint of its own (the environments cannot be saved mid-segment):
  # the newest is a checkpoint point's, where the resumed run goes on.
  assert summary["checkpoint_env_steps"] == max(_checkpoints(run_dir), default=None)
  resumed = _run(run_dir, "--resume")
  if summary["checkpoint_env_steps"] is not None:  # the run says where it goes on
    assert f"resuming from the checkpoint at env step {summary['checkpoint_env_steps']:,}" in (
        resumed.stdout
    )
  _same_run(run_dir, straight)


def test_kill_9_at_random_moments_and_mid_checkpoint_resumes_exactly(tmp_path, straight):
  rng = random.Random(0)
  run_dir = tmp_path / "run"
  for _ in range(2):  # at random moments, the run resumed in between
    extra = ["--resume"] if (run_dir / "config.json").exists() else []
    proc = _start_and_wait(run_dir, lambda d: _lines(d) >= 1, *extra)
    time.sleep(rng.uniform(0.0, 1.0))
    proc.kill()
    proc.communicate()

  def writing(d):  # orbax writes a checkpoint into a temporary directory, then renames it
    ckpts = d / "checkpoints"
    return ckpts.exists() and any("tmp" in p.name for p in ckpts.iterdir())

  proc = _start_and_wait(run_dir, writing, "--resume")
  proc.kill()
  proc.communicate()
  _run(run_dir, "--resume")
  _same_run(run_dir, straight)


def test_a_second_process_on_a_run_directory_is_refused(tmp_path):
  run_dir = tmp_path / "run"
  first = _start_and_wait(run_dir, lambda d: _lines(d) >= 1, steps=10_000_000)
  try:
    for extra in ([], ["--resume"]):
      proc = _run(run_dir, *extra, check=False)
      assert proc.returncode != 0
      assert "is in use by another process" in proc.stderr
      assert f'"pid": {first.pid}' in proc.stderr
    assert first.poll() is None  # the holder goes on
  finally:
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
  assert first.returncode == 0
  with rundir.locked(run_dir):  # released with its process
    pass


def test_removing_a_held_lock_file_does_not_let_a_second_holder_in(tmp_path):
  """After a kill -9 the .lock file stays and looks stale; removed while a run holds the
  directory, it must not let a second process in (the directory itself is locked)."""
  run_dir = tmp_path / "run"
  with rundir.locked(run_dir):
    with pytest.raises(rundir.RunDirectoryInUse, match=f'"pid": {os.getpid()}'):
      with rundir.locked(run_dir):
        pass
    (run_dir / ".lock").unlink()
    with pytest.raises(rundir.RunDirectoryInUse, match="unknown: its .lock file was removed"):
      with rundir.locked(run_dir):
        pass
  with rundir.locked(run_dir):  # released
    pass


def test_a_refused_run_removes_the_directories_it_made_and_no_other(tmp_path):
  made, found = tmp_path / "made", tmp_path / "found"
  found.mkdir()
  for path in (made, found):
    with pytest.raises(ValueError, match="refused"):
      with rundir.locked(path):
        raise ValueError("refused")
  assert not made.exists() and list(found.iterdir()) == []  # (its lock file gone too)
  with pytest.raises(ValueError, match="refused"):
    with rundir.locked(made):
      (made / "config.json").write_text("{}")
      raise ValueError("refused")
  assert sorted(p.name for p in made.iterdir()) == [rundir.LOCK, "config.json"]


def _short_impala(run_dir):
  args = impala.Args()
  train = args.train.replace(total_env_steps=512, checkpoint_every=512, log_every=512,
                             eval_every=0)  # fmt: skip
  return dataclasses.replace(args, train=train, run_dir=str(run_dir))


def test_a_run_refused_after_its_lock_leaves_none_of_the_folders_it_made(tmp_path, monkeypatch):
  def refuse(*args, **kwargs):
    raise ValueError("refused")

  monkeypatch.setattr(rundir, "check_or_write_config", refuse)
  for run_dir in (tmp_path / "a" / "b" / "run", tmp_path / "sweep" / "c"):
    args = _short_impala(run_dir)
    if run_dir.name == "c":  # learners in seed<k>/ below the root
      args = dataclasses.replace(args, train=args.train.replace(num_seeds=2))
    with pytest.raises(ValueError, match="refused"):
      impala.run(args)
  assert list(tmp_path.iterdir()) == []


def test_a_run_refused_in_a_folder_that_was_there_leaves_it_as_it_found_it(tmp_path):
  """The lock file a refused run made goes with it; one that was there stays."""
  empty, notes, locked = tmp_path / "empty", tmp_path / "notes", tmp_path / "locked"
  for folder in (empty, notes, locked):
    folder.mkdir()
  (notes / "notes.txt").write_text("mine")
  (locked / rundir.LOCK).write_text("{}")
  for folder in (empty, notes, locked):
    held = sorted(p.name for p in folder.iterdir())
    args = dataclasses.replace(_short_impala(folder), resume=True)
    with pytest.raises(FileNotFoundError, match="holds no run"):
      impala.run(args)
    assert sorted(p.name for p in folder.iterdir()) == held, folder


def test_a_refused_run_leaves_the_directory_another_made_and_locked_meanwhile(tmp_path,
                                                                             monkeypatch):  # fmt: skip
  """Made and locked by another process after this one saw it missing: the refused run
  must not remove it, the holder's lock file with it (the holder would go on unlocked)."""
  run_dir, real_locked, holder = tmp_path / "new" / "run", rundir.locked, []

  def another_process_first(path):
    if path == run_dir and not holder:
      holder.append(real_locked(path))
      holder[0].__enter__()
    return real_locked(path)

  monkeypatch.setattr(rundir, "locked", another_process_first)
  with pytest.raises(rundir.RunDirectoryInUse, match=f'"pid": {os.getpid()}'):
    impala.run(_short_impala(run_dir))
  try:
    assert sorted(p.name for p in run_dir.iterdir()) == [rundir.LOCK]
  finally:
    holder[0].__exit__(None, None, None)


def test_a_lock_taken_on_a_directory_removed_meanwhile_is_refused(tmp_path, monkeypatch):
  run_dir, real_flock = tmp_path / "run", rundir.fcntl.flock

  def removed_before_locking(fd, operation):
    if run_dir.exists() and not (run_dir / rundir.LOCK).exists():  # the directory's lock
      run_dir.rmdir()  # a refused run removing the directory it made
      run_dir.mkdir()  # and another making it again
    return real_flock(fd, operation)

  monkeypatch.setattr(rundir.fcntl, "flock", removed_before_locking)
  with pytest.raises(rundir.RunDirectoryInUse, match="was removed by another process"):
    with rundir.locked(run_dir):
      pass


def test_a_new_run_is_refused_a_directory_of_other_files_or_inside_a_run(tmp_path):
  """A run's files must not mix with others: a folder of documents, another run's
  checkpoints/. An empty folder, and one a refused start left (lock files only), are
  taken; a run's own directory is refused (pass --resume) or resumed."""
  args = impala.Args()
  train = args.train.replace(total_env_steps=512, checkpoint_every=512, log_every=512,
                             eval_every=0)  # fmt: skip
  run = lambda d, **kw: impala.run(dataclasses.replace(args, train=train, run_dir=str(d), **kw))
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "notes.md").write_text("mine")
  with pytest.raises(ValueError, match=r"docs holds other files \(notes.md\) and no run"):
    run(tmp_path / "docs")
  assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == ["notes.md"]
  left = tmp_path / "left"
  (left / "seed0").mkdir(parents=True)
  (left / "seed0" / rundir.LOCK).write_text("")
  run(left)
  with pytest.raises(ValueError, match=r"checkpoints is inside the directory of the run in"):
    run(left / "checkpoints")
  with pytest.raises(ValueError, match=r"inside the directory of the run in .*left"):
    run(left / "seed0" / "deeper")
  with pytest.raises(FileExistsError, match="already holds a run: pass --resume"):
    run(left)
  run(left, resume=True)
  processed = tmp_path / "data" / "processed"  # a folder of the user's, not process<i>/
  processed.mkdir(parents=True)
  (processed / "table.csv").write_text("1,2")
  with pytest.raises(ValueError, match=r"data holds other files \(processed\) and no run"):
    run(tmp_path / "data")
  (tmp_path / "file").write_text("")  # [Errno 20] Not a directory: '.../file/run'
  with pytest.raises(ValueError, match=r"file/run cannot be made \(Not a directory\): choose"):
    run(tmp_path / "file" / "run")


def test_a_run_directory_there_but_not_writable_is_refused_by_name(tmp_path, monkeypatch):
  """A read-only mount (or a folder without write permission): the lock file's errno came
  as the error, "[Errno 30] Read-only file system: '.../.lock'"."""
  real_open = os.open

  def read_only(path, flags, *args, **kwargs):
    if str(path).endswith(rundir.LOCK):
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
    return real_open(path, flags, *args, **kwargs)

  monkeypatch.setattr(os, "open", read_only)
  with pytest.raises(ValueError, match=r"the run directory .* cannot be written \(Read-only "
                     r"file system\): choose another --run-dir"):  # fmt: skip
    with rundir.locked(tmp_path):
      pass


def test_no_new_run_inside_a_run_of_seeds_nor_from_a_working_directory_inside_a_run(
    tmp_path, monkeypatch
):
  """A run of seeds one after the other (seeds.json, seed<k>/, no config.json of its own)
  was not seen as a run: a new run went inside it, as did the default run directory
  (./runs/...) of a script started inside a run, and neither was refused."""
  args = impala.Args()
  train = args.train.replace(total_env_steps=512, checkpoint_every=512, log_every=512,
                             eval_every=0)  # fmt: skip
  run = lambda d, **kw: impala.run(dataclasses.replace(args, train=train, run_dir=d, **kw))
  seeds = tmp_path / "seeds"
  train = train.replace(num_seeds=2, vmap_seeds=False)
  run(str(seeds))  # starts each seed in seeds/seed<k>: not refused as inside the run
  train = train.replace(num_seeds=1)
  with pytest.raises(ValueError, match=r"seeds/other is inside the directory of the run in "):
    run(str(seeds / "other"))
  assert not (seeds / "other").exists()
  monkeypatch.chdir(seeds / "seed0")
  with pytest.raises(ValueError, match=r"the default run directory, \./runs/\.\.\., would be "
                     r"inside the directory of the run in .*seed0 \(the working"):  # fmt: skip
    run(None)
  assert not (seeds / "seed0" / "runs").exists()


def test_a_folder_of_runs_is_not_taken_for_a_run_when_one_of_them_holds_seeds(tmp_path):
  """runs/<run>/seed<k>/config.json, a run of several seeds among others, looked like a
  sweep's <setting>/seed<k>/: a new run with --run-dir runs/ was written at the top of the
  folder of runs, and a later --resume of it rebuilt tensorboard/ there."""
  args = impala.Args()
  train = args.train.replace(total_env_steps=512, checkpoint_every=512, log_every=512,
                             eval_every=0, num_seeds=2)  # fmt: skip
  runs = tmp_path / "runs"
  impala.run(dataclasses.replace(args, train=train, run_dir=str(runs / "seeds")))
  assert (runs / "seeds" / "config.json").exists() and (runs / "seeds" / "seed1").is_dir()
  written = sorted(p.relative_to(runs) for p in runs.rglob("*"))
  with pytest.raises(ValueError, match=r"runs holds other files \(seeds\) and no run"):
    rundir.check_new_run_dir(runs)
  assert sorted(p.relative_to(runs) for p in runs.rglob("*")) == written
  # Seeds one after the other: <run>/seeds.json and <run>/seed<k>/, no <run>/config.json
  # (a run's files were written beside it, even in a folder named like a sweep setting).
  others = tmp_path / "others"
  train = train.replace(vmap_seeds=False)
  impala.run(dataclasses.replace(args, train=train, run_dir=str(others / "one_by_one")))
  assert not (others / "one_by_one" / "config.json").exists()
  with pytest.raises(ValueError, match=r"others holds other files \(one_by_one\) and no run"):
    rundir.check_new_run_dir(others)
  (others / "one_by_one").rename(others / "lr=1")
  with pytest.raises(ValueError, match=r"others holds other files \(lr=1\) and no run"):
    rundir.check_new_run_dir(others)


def test_a_folder_that_cannot_be_read_is_not_taken_for_an_empty_one(tmp_path, monkeypatch):
  """os.walk and Path.rglob skip a folder they cannot read: it looked empty, and the run
  was written beside what it holds (root reads any mode: the error is made here)."""
  (tmp_path / "run" / "secret").mkdir(parents=True)
  scandir = os.scandir

  def refused(path="."):
    if os.fspath(path).endswith("secret"):
      raise PermissionError(13, "Permission denied", os.fspath(path))
    return scandir(path)

  monkeypatch.setattr(os, "scandir", refused)
  with pytest.raises(ValueError, match=r"run holds other files \(secret\) and no run"):
    rundir.check_new_run_dir(tmp_path / "run")
  (tmp_path / "left" / "seed0").mkdir(parents=True)
  rundir.check_new_run_dir(tmp_path / "left")  # an empty folder a refused start left


def test_more_learners_than_files_the_process_may_open_are_refused_first(tmp_path,
                                                                         monkeypatch):  # fmt: skip
  """They failed part way with "Too many open files", with thousands of directories made."""
  import resource

  monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
  args = impala.Args()
  args = dataclasses.replace(args, train=args.train.replace(num_seeds=300),
                             run_dir=str(tmp_path / "run"))  # fmt: skip
  with pytest.raises(ValueError, match=r"300 learners \(--num-seeds\) keep 3 files open each: "
                                       r"about 1,156 files, more than this process may open "
                                       r"\(1,024, ulimit -n\)"):  # fmt: skip
    impala.run(args)
  assert not (tmp_path / "run").exists()


def _flip_byte(path, offset=None):
  data = bytearray(path.read_bytes())
  offset = len(data) // 2 if offset is None else offset
  data[offset] ^= 0x5A
  path.write_bytes(bytes(data))


def test_a_flipped_byte_in_the_newest_checkpoint_is_found_and_skipped(tmp_path, straight):
  run_dir = tmp_path / "run"
  _run(run_dir, steps=3840)
  newest = run_dir / "checkpoints" / "3840"
  arrays = [p for p in newest.rglob("*") if p.is_file() and "arrays" in str(p.relative_to(newest))]
  largest = max(arrays, key=lambda p: p.stat().st_size)
  # A byte at 16 places through the file: orbax's data files can hold stretches no array
  # reads, where one flipped byte changes nothing.
  for k in range(1, 17):
    _flip_byte(largest, offset=largest.stat().st_size * k // 17)
  proc = _run(run_dir, "--resume")
  assert "checkpoint 3840" in proc.stderr and "falling back" in proc.stderr
  assert "Event loop is closed" not in proc.stderr  # the reads pending as it failed
  _same_run(run_dir, straight)  # from the checkpoint before: the same run


@pytest.mark.parametrize("field, changed", [(b'"log_lines": 6', b'"log_lines": 4'),
                                            (b'"format": 3', b'"format": 1')])  # fmt: skip
def test_a_changed_record_in_the_newest_checkpoint_is_found_and_skipped(tmp_path, straight, field,
                                                                       changed):  # fmt: skip
  """The record (schedule, accumulators) is JSON that may still parse after a flipped
  byte; its checksum catches that, before a changed format could pass for a run of
  another version."""
  run_dir = tmp_path / "run"
  _run(run_dir, steps=3840)
  [record] = [p for p in (run_dir / "checkpoints" / "3840" / "record").iterdir() if p.is_file()
              and field in p.read_bytes()]  # fmt: skip
  record.write_bytes(record.read_bytes().replace(field, changed))
  proc = _run(run_dir, "--resume")
  assert "checkpoint 3840" in proc.stderr and "record does not match" in proc.stderr
  _same_run(run_dir, straight)


def test_a_kill_as_the_first_checkpoint_is_written_starts_over(tmp_path, straight):
  """The first save cut short before its checksums (orbax had renamed it complete): the
  run wrote no checkpoint, and `--resume` starts over rather than refusing."""
  run_dir = tmp_path / "run"
  first = run_dir / "checkpoints" / "1280"
  proc = _start_and_wait(run_dir, lambda d: (first / "checksums.json").exists())
  proc.kill()
  proc.communicate()
  assert _checkpoints(run_dir) == [1280]
  (first / "checksums.json").unlink()  # as the kill would have left it a moment earlier
  resumed = _run(run_dir, "--resume")
  assert "the save of the first one did not finish (1280.unreadable-" in resumed.stderr
  assert "no checkpoint to resume from: starting over" in resumed.stdout
  _same_run(run_dir, straight)


@pytest.mark.parametrize("keep", ["2", "1"])
def test_no_intact_checkpoint_is_an_error_not_a_fresh_start(tmp_path, keep):
  """Without their checksums, checkpoints but the run's first were complete once (a save
  starts when the one before it has its checksums): damaged, never started over."""
  run_dir = tmp_path / "run"
  _run(run_dir, "--keep-checkpoints", keep, steps=2560)
  assert _checkpoints(run_dir) == [1280, 2560][-int(keep) :]
  for step in _checkpoints(run_dir):
    (run_dir / "checkpoints" / str(step) / "checksums.json").unlink()  # as if cut short
  config = (run_dir / "config.json").read_bytes()
  proc = _run(run_dir, "--resume", "--keep-checkpoints", keep, check=False, steps=3840)
  assert proc.returncode != 0 and "no intact checkpoint" in proc.stderr
  # Nothing ran: config.json keeps the run's budget (a larger one would refuse a resume
  # with the run's own as "smaller") and lists no resume.
  assert (run_dir / "config.json").read_bytes() == config


def test_a_checkpoint_the_machine_cannot_read_is_left_as_it_is_not_set_aside(tmp_path,
                                                                            monkeypatch):  # fmt: skip
  """No permission (or memory, or open files) to read the checkpoints is not damage: set
  aside as damaged, every intact one was renamed and the run could not be resumed."""
  args = _short_impala(tmp_path / "run")
  args = dataclasses.replace(args, train=args.train.replace(total_env_steps=1024))
  impala.run(args)
  read_json = checkpoint.read_json

  def denied(path):
    if pathlib.Path(path).name == checkpoint.CHECKSUMS:
      raise PermissionError(errno.EACCES, "Permission denied", str(path))
    return read_json(path)

  monkeypatch.setattr(checkpoint, "read_json", denied)
  more = dataclasses.replace(args, resume=True, train=args.train.replace(total_env_steps=1536))
  access = r"checkpoint 1024 in .* could not be read \(PermissionError: .*\): not damage"
  with pytest.raises(ResumeError, match=access):
    impala.run(more)
  with pytest.raises(checkpoint.CheckpointAccessError, match=access):
    load_run(tmp_path / "run", checkpoint=1024)
  monkeypatch.undo()
  assert _checkpoints(tmp_path / "run") == [512, 1024]
  assert not list((tmp_path / "run" / "checkpoints").glob("*.unreadable-*"))
  impala.run(more)
  assert load_run(tmp_path / "run").env_steps == 1536


_READ_THEN_UNRAISABLE = """
import sys
from offpolicy_ac.training import checkpoint, load_run

class Callback:  # a tensorstore read completing into orbax's closed event loop
  def __init__(self, error):
    self.error = error
  def __del__(self):
    raise self.error

try:
  load_run(sys.argv[1], checkpoint=512)
except checkpoint.DamagedCheckpointError as e:
  print("damaged:", str(e)[:40], file=sys.stderr)
Callback(RuntimeError("Event loop is closed"))
Callback(RuntimeError("another error"))
"""


def test_reads_pending_as_a_checkpoint_fails_leave_no_tracebacks(tmp_path):
  """A failed read's pending tensorstore reads complete into orbax's closed event loop:
  each printed a traceback ("Event loop is closed"), a dozen before the one-line warning."""
  impala.run(_short_impala(tmp_path / "run"))
  for data in (tmp_path / "run" / "checkpoints" / "512" / "arrays").rglob("d/*"):
    data.write_bytes(data.read_bytes()[:16])  # cut short
  proc = subprocess.run([sys.executable, "-c", _READ_THEN_UNRAISABLE, str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=300)  # fmt: skip
  assert proc.returncode == 0 and "damaged: checkpoint 512" in proc.stderr, proc.stderr[-3000:]
  assert "another error" in proc.stderr and "Event loop is closed" not in proc.stderr


def test_errors_of_the_machine_are_told_from_damage():
  assert checkpoint._access_error(ValueError('PERMISSION_DENIED: Error opening "zarr" driver'))
  assert checkpoint._access_error(OSError(errno.EIO, "Input/output error"))
  assert checkpoint._access_error(MemoryError())
  try:
    try:
      raise ValueError("RESOURCE_EXHAUSTED: out of memory")
    except ValueError as e:
      raise RuntimeError("orbax failed") from e
  except RuntimeError as e:
    assert checkpoint._access_error(e)
  assert not checkpoint._access_error(ValueError("DATA_LOSS: Error reading the chunk"))
  assert not checkpoint._access_error(FileNotFoundError(errno.ENOENT, "No such file"))
  assert not checkpoint._access_error(checkpoint.DamagedCheckpointError("checksum mismatch"))


def test_checkpoints_of_other_shapes_are_refused_and_left_as_they_are(tmp_path):
  """config.json edited to other network sizes: the intact checkpoints do not fit the
  run's arrays. That is one line naming an array, not damage: none is moved aside, and
  with the config put back the run resumes."""
  run_dir = tmp_path / "run"
  _run(run_dir, steps=2560)
  config_path = run_dir / "config.json"
  original = config_path.read_text()
  config = json.loads(original)
  config["config"]["agent"]["hidden_sizes"] = [32, 32]
  config_path.write_text(json.dumps(config))
  proc = _run(run_dir, "--resume", "--hidden-sizes", "32", "32", check=False)
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode == 2 and "hold arrays of other shapes than this run's" in last, last
  assert "stored <f4[" in last and "this run's <f4[" in last
  assert _checkpoints(run_dir) == [1280, 2560]
  assert not list((run_dir / "checkpoints").glob("*.unreadable-*"))
  config_path.write_text(original)
  _run(run_dir, "--resume", steps=3840)


def test_damaged_final_parameters_are_never_loaded_silently(tmp_path):
  """Damaged final parameters give way, with a warning, to the newest intact checkpoint
  (which the run's --resume would go on from); without one, they are refused."""
  run_dir = tmp_path / "run"
  _run(run_dir, steps=1280)
  load_run(run_dir)  # intact
  _flip_byte(run_dir / "final_params.msgpack", offset=-3)
  with pytest.warns(RuntimeWarning, match="does not match its checksum"):
    assert load_run(run_dir).source == "checkpoint"
  evaluate = [sys.executable, str(ROOT / "experiments" / "evaluate.py"), "--run-dir",
              str(run_dir), "--episodes", "2"]  # fmt: skip
  proc = subprocess.run(evaluate, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and "does not match its checksum" in proc.stderr
  # Written as the checkpoint's evaluation, not as the final parameters'.
  result = json.loads((run_dir / "evaluation_checkpoint1280.json").read_text())
  assert (result["parameters"], result["env_steps"]) == ("checkpoint", 1280)
  (run_dir / "evaluation_checkpoint1280.json").unlink()
  assert not (run_dir / "evaluation.json").exists()
  shutil.rmtree(run_dir / "checkpoints")
  with pytest.raises(ValueError, match="does not match its checksum"):
    load_run(run_dir)
  proc = subprocess.run(evaluate, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0 and "does not match its checksum" in proc.stderr
  assert not list(run_dir.glob("evaluation*.json"))


class _NaNRewardAt:
  """A rollout factory whose first pool's unroll number `at` returns a NaN reward."""

  def __init__(self, at):
    self.at, self.calls = at, 0

  def __call__(self, act, config, seed, to_device):
    rollout = make_training_rollout(act, config, seed, to_device)
    factory = self

    class Poisoned:
      env = rollout.env
      init = staticmethod(rollout.init)

      @staticmethod
      def unroll(acting, state):
        state, traj, stats = rollout.unroll(acting, state)
        factory.calls += 1
        if factory.calls == factory.at:
          reward = np.array(traj.reward)
          reward[3, 5] = np.nan
          traj = traj._replace(reward=reward)
        return state, traj, stats

    return Poisoned()


def test_non_finite_data_from_the_environment_is_stopped_before_it_is_stored(tmp_path):
  args = impala.Args()
  train = args.train.replace(total_env_steps=3840, checkpoint_every=1280, log_every=640,
                             eval_every=0)  # fmt: skip
  args = dataclasses.replace(args, train=train, run_dir=str(tmp_path / "run"))
  with pytest.raises(
      NonFiniteError, match=r"non-finite reward from environment \d+ .* env step 2560"
  ):
    impala.run(args, rollout_factory=_NaNRewardAt(10))  # unroll 10 ends at env step 2560
  assert _checkpoints(tmp_path / "run") == [1280]  # none holds the NaN
  straight = dataclasses.replace(args, run_dir=str(tmp_path / "straight"))
  impala.run(straight)
  impala.run(dataclasses.replace(args, resume=True))
  assert _metrics(tmp_path / "run") == _metrics(tmp_path / "straight")


@contextlib.contextmanager
def _tmpfs(folder: pathlib.Path, size: str):
  """A tmpfs of `size` mounted on `folder` (made) for the context, unmounted after it; the
  test is skipped where it cannot be mounted (not root, a container that forbids it)."""
  if os.geteuid() != 0:
    pytest.skip("mounting a tmpfs needs root")
  folder.mkdir(parents=True, exist_ok=True)
  mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                           capture_output=True, text=True)  # fmt: skip
  if mounted.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
  try:
    yield folder
  finally:
    subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize("size", ["250k", "300k"])  # full as checkpoint 2560 or the end is written
def test_a_full_disk_stops_with_one_line_and_resumes_exactly(tmp_path, straight, size):
  """The run directory on a small tmpfs fills before the run ends: the script ends with
  exit code 1 and one line (orbax's threads' tracebacks not shown), the last checkpoint
  intact; with the space freed (the tmpfs grown), --resume repeats the uninterrupted run."""
  with _tmpfs(tmp_path / "disk", size) as disk:
    proc = _run(disk / "run", check=False)
    last = [l for l in proc.stderr.splitlines() if l.strip()][-1]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert last.startswith("[impala] error: no space left on device"), last
    assert "Traceback" not in proc.stderr and "ERROR:absl" not in proc.stderr  # orbax's
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
    _run(disk / "run", "--resume")
    _same_run(disk / "run", straight)


def test_a_full_disk_under_tensorboard_stops_with_one_line_and_resumes_exactly(tmp_path,
                                                                               straight):  # fmt: skip
  """TensorBoard's events on a full disk: the run stops with one line naming tensorboard/
  (tensorboardX's writing thread died there, and the run waited on its queue for good);
  with the room back, --resume repeats the uninterrupted run."""
  with _tmpfs(tmp_path / "run" / "tensorboard", "4k") as events:
    proc = _run(tmp_path / "run", check=False)
  last = [l for l in proc.stderr.splitlines() if l.strip()][-1]
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert last.startswith(f"[impala] error: no space left on device ({events}); the "
                         "checkpoints written are intact"), last  # fmt: skip
  _run(tmp_path / "run", "--resume")
  _same_run(tmp_path / "run", straight)


def test_checkpoints_made_read_only_as_the_run_goes_stop_it_with_one_line(tmp_path, straight):
  """The checkpoints' folder remounted read-only after the first checkpoint: the run stops
  with one line naming it (orbax's PermissionError came with a 75-line traceback), and,
  writable again, --resume repeats the uninterrupted run."""
  with _tmpfs(tmp_path / "run" / "checkpoints", "64m") as folder:
    proc = _start_and_wait(tmp_path / "run", lambda d: _checkpoints(d) == [1280])
    while subprocess.run(["mount", "-o", "remount,ro", str(folder)]).returncode != 0:
      time.sleep(0.01)  # busy while a checkpoint is written
    _, err = proc.communicate(timeout=300)
    last = [l for l in err.splitlines() if l.strip()][-1]
    assert proc.returncode == 1, err[-3000:]
    assert last.startswith(f"[impala] error: read-only file system ({folder}"), last
    assert last.endswith("the checkpoints written are intact: allow writing there, then "
                         "--resume (it starts over if there is none)"), last  # fmt: skip
    assert "Traceback" not in err
    subprocess.run(["mount", "-o", "remount,rw", str(folder)], check=True)
    _run(tmp_path / "run", "--resume")
    _same_run(tmp_path / "run", straight)


def test_full_storage_lines_logged_after_a_failed_save_are_dropped(caplog, monkeypatch):
  """orbax writes a checkpoint's arrays on several threads: one's full-disk error reaches
  `save` while another may still be writing, and logs its own (with a traceback) later.
  After a failed save those lines stay dropped; after one that succeeds, nothing is."""
  monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
  absl = logging.getLogger("absl")
  monkeypatch.setattr(absl, "filters", list(absl.filters))
  full = f"RESOURCE_EXHAUSTED: Failed writing: {os.strerror(errno.ENOSPC)}"
  with checkpoint._quiet_failed_save():  # pylint: disable=protected-access
    absl.error(full)
  absl.error(full)  # after a save that succeeded: shown
  with pytest.raises(OSError), checkpoint._quiet_failed_save():  # pylint: disable=protected-access
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
  late = threading.Thread(target=absl.error, args=(full,))
  late.start()
  late.join()
  absl.error("an error of its own")
  assert [r.getMessage() for r in caplog.records if r.name == "absl"] == [
      full,
      "an error of its own",
  ]


# The best parameters' file is 19 KB; a checkpoint's arrays, 53 KB, are one file or two of
# 21 KB and more (orbax's OCDBT store splits them as its writes fall).
@pytest.mark.parametrize("kilobytes", [10, 20])  # the best parameters' file, a checkpoint's
def test_a_file_size_limit_stops_with_one_line_and_resumes_exactly(tmp_path, straight, kilobytes):
  """A file-size limit (ulimit -f, EFBIG; a quota's EDQUOT alike) is full storage too: one
  line, no traceback of orbax's threads, the last checkpoint intact; --resume without the
  limit repeats the uninterrupted run."""
  limit = (kilobytes * 1024,) * 2
  limited = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, limit)
  proc = subprocess.run(_cmd(tmp_path / "run"), capture_output=True, text=True, timeout=600,
                        preexec_fn=limited)  # fmt: skip
  last = [l for l in proc.stderr.splitlines() if l.strip()][-1]
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert last.startswith("[impala] error: a file would pass the file-size limit (ulimit -f)")
  assert (f"{tmp_path / 'run' / 'checkpoints'})" in last) == (kilobytes == 20)
  assert "Traceback" not in proc.stderr and "ERROR:absl" not in proc.stderr
  assert not list((tmp_path / "run").glob("*.tmp"))
  _run(tmp_path / "run", "--resume")
  _same_run(tmp_path / "run", straight)


def test_a_stop_signal_in_a_compiled_run_checkpoints_there_and_resumes_exactly(tmp_path):
  """A JAX environment's run holds its environments in its state: a stop writes a
  checkpoint where it stopped (between two chunks), and --resume repeats the
  uninterrupted run."""
  pytest.importorskip("gymnax")
  flags = ["--env-id", "gymnax:CartPole-v1", "--preset", "none", "--log-every", "16384",
           "--eval-every", "65536", "--checkpoint-every", "1000000"]  # fmt: skip
  steps = 2_097_152  # about 5 s of training after the stop's third line, at full speed
  straight = tmp_path / "straight"
  _run(straight, *flags, steps=steps)
  run_dir = tmp_path / "run"
  proc = _start_and_wait(run_dir, lambda d: _lines(d) >= 3, *flags, steps=steps)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["interrupted"] and summary["checkpoint_env_steps"] == summary["env_steps"] < steps
  _run(run_dir, "--resume", *flags, steps=steps)
  _same_run(run_dir, straight)


_KILLED_WHILE_SAVING = """
import os, signal, sys
import numpy as np
from offpolicy_ac.training import checkpoint

saves = []
checksums = checkpoint.array_checksums

def checksums_then_die(tree):  # the second save dies after orbax finished its part
  saves.append(1)
  if len(saves) == 2:
    os.kill(os.getpid(), signal.SIGKILL)
  return checksums(tree)

checkpoint.array_checksums = checksums_then_die
ckpt = checkpoint.Checkpointer(sys.argv[1], max_to_keep=1)
ckpt.save(1, {"x": np.ones(3)}, {"step": 1})
ckpt.save(2, {"x": np.full(3, 2.0)}, {"step": 2})
"""


def test_a_kill_as_a_checkpoint_completes_keeps_the_one_before(tmp_path):
  """With one checkpoint kept, the older one goes only once the new one is complete."""
  from offpolicy_ac.training.checkpoint import Checkpointer

  proc = subprocess.run([sys.executable, "-c", _KILLED_WHILE_SAVING, str(tmp_path)],
                        capture_output=True, text=True, timeout=300)  # fmt: skip
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
  ckpt = Checkpointer(tmp_path, max_to_keep=1)
  with pytest.warns(RuntimeWarning, match="checkpoint 2 .* could not be read"):
    step, arrays, record = ckpt.restore_latest({"x": np.zeros(3)})
  ckpt.close()
  assert step == 1 and record == {"step": 1}
  np.testing.assert_array_equal(arrays["x"], np.ones(3))


def test_files_are_on_the_disk_before_they_are_relied_on(tmp_path, monkeypatch):
  """A power loss must leave the old file or the new one (the data synced before the
  rename, the rename synced after), and a checkpoint's checksums, written last to say it
  is complete, only once its arrays are on the disk (the older ones are deleted then)."""
  from offpolicy_ac.training import logger  # pylint: disable=import-outside-toplevel

  synced, fsync = [], os.fsync

  def recording(fd):
    synced.append(os.readlink(f"/proc/self/fd/{fd}"))
    fsync(fd)

  monkeypatch.setattr(os, "fsync", recording)
  logger.write_atomic(tmp_path / "summary.json", "{}")
  assert synced == [str(tmp_path / "summary.json.tmp"), str(tmp_path)]
  synced.clear()
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints", max_to_keep=1)
  ckpt.save(1, {"x": np.zeros(3)}, {"step": 1})
  ckpt.close()
  step = tmp_path / "checkpoints" / "1"
  written = {str(p) for p in step.rglob("*")} | {str(step)}
  before_checksums = synced[: synced.index(str(step / "checksums.json.tmp"))]
  assert written - {str(step / "checksums.json")} <= set(before_checksums)


def test_a_checkpoint_of_scalars_keys_and_bfloat16_fits_its_own_template(tmp_path):
  """The layout check compares what the checksums recorded (a scalar as [1]) with the
  template, for every kind of leaf; another shape is named."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel

  from offpolicy_ac.training.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel
  from offpolicy_ac.training.checkpoint import restore_newest  # pylint: disable=import-outside-toplevel

  tree = {"x": np.zeros(3), "step": jnp.int32(3), "key": jax.random.PRNGKey(0),
          "typed_key": jax.random.key(1), "half": jnp.ones((2,), jnp.bfloat16)}  # fmt: skip
  ckpt = Checkpointer(tmp_path, max_to_keep=1)
  ckpt.save(1, tree, {"step": 1})
  arrays, record = restore_newest(ckpt, tree, lambda record: None)
  assert record == {"step": 1} and int(arrays["step"]) == 3
  with pytest.raises(ValueError, match=r"checkpoint 1 \(x: stored <f8\[3\], this run's <f8\[4\]"):
    restore_newest(ckpt, {**tree, "x": np.zeros(4)}, lambda record: None)
  ckpt.close()
  assert [p.name for p in tmp_path.iterdir() if "unreadable" in p.name] == []


def test_a_damaged_array_name_in_the_newest_checksums_is_set_aside_with_a_warning(tmp_path):
  """A flipped byte in an array's name in checksums.json makes the checkpoint look like one
  of other arrays; with an older one of the run's arrays intact, it is damage: named and
  moved aside, not skipped in silence (and later overwritten by the resumed run)."""
  from offpolicy_ac.training.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel

  tree = {"state": np.zeros(3), "step": np.int32(0)}
  ckpt = Checkpointer(tmp_path, max_to_keep=2)
  ckpt.save(1, tree, {"step": 1})
  ckpt.save(2, {**tree, "step": np.int32(2)}, {"step": 2})
  checksums = tmp_path / "2" / "checksums.json"
  checksums.write_text(checksums.read_text().replace('"state"', '"stbte"'))
  with pytest.warns(RuntimeWarning, match=r"checkpoint 2 in .* holds arrays of other shapes"):
    step, arrays, record = ckpt.restore_latest(tree)
  ckpt.close()
  assert (step, int(arrays["step"]), record) == (1, 0, {"step": 1})
  assert [p.name.split("-")[0] for p in tmp_path.glob("2.unreadable-*")] == ["2.unreadable"]


def test_a_set_aside_checkpoint_is_deleted_once_checkpoints_as_old_are(tmp_path):
  """Set-aside copies (each a whole checkpoint) do not pile up over kills and resumes: a
  save deletes those older than the oldest checkpoint it keeps, as it deletes checkpoints."""
  from offpolicy_ac.training.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel

  tree = {"state": np.zeros(3), "step": np.int32(0)}
  ckpt = Checkpointer(tmp_path, max_to_keep=2)
  for step in (1, 2):
    ckpt.save(step, tree, {"step": step})
  (tmp_path / "2" / "checksums.json").unlink()  # killed before its checksums were written
  with pytest.warns(RuntimeWarning, match="checkpoint 2 .* moved it to 2.unreadable-"):
    assert ckpt.restore_latest(tree)[0] == 1
  aside = lambda: sorted(p.name.split("-")[0] for p in tmp_path.glob("*.unreadable-*"))
  for step in (2, 3):  # the resumed run redoes step 2: its copy is as old as a kept one
    ckpt.save(step, tree, {"step": step})
    assert aside() == ["2.unreadable"]
  ckpt.save(4, tree, {"step": 4})
  assert ckpt.steps() == [3, 4] and aside() == []
  ckpt.close()


def test_a_stop_signal_ends_a_run_of_seeds_one_after_the_other_and_resume_finishes_it(tmp_path):
  seeds = ["--num-seeds", "2", "--no-vmap-seeds"]
  straight = tmp_path / "straight"
  _run(straight, *seeds)
  run_dir = tmp_path / "run"
  proc = _start_and_wait(run_dir, lambda d: _lines(d / "seed0") >= 1, *seeds)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  assert json.loads((run_dir / "seed0" / "summary.json").read_text())["interrupted"]
  assert not (run_dir / "seed1").exists()  # the stop ended the run, not only its seed
  _run(run_dir, *seeds, "--resume")  # seed 0 goes on, seed 1 starts
  for seed in ("seed0", "seed1"):
    _same_run(run_dir / seed, straight / seed)


def test_resume_on_one_learner_of_a_run_of_several_is_refused(tmp_path):
  run_dir = tmp_path / "run"
  _run(run_dir, "--num-seeds", "2", steps=1280)
  before = (run_dir / "seed0" / "metrics.jsonl").read_text()
  proc = _run(run_dir / "seed0", "--resume", steps=1280, check=False)
  assert proc.returncode == 2
  assert f"is one learner of the run in {run_dir}: resume that run" in proc.stderr
  assert (run_dir / "seed0" / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("damage", ["cut", "garbled"])
def test_a_metrics_file_cut_short_or_damaged_is_refused_in_one_line_on_resume(tmp_path, damage):
  """The resumed run appends to the lines before its checkpoint: they must all be there,
  and whole (a flipped byte that breaks a line's JSON used to be kept)."""
  run_dir = tmp_path / "run"
  _run(run_dir, steps=2560)
  metrics = run_dir / "metrics.jsonl"
  lines = metrics.read_text().splitlines(keepends=True)
  if damage == "cut":
    metrics.write_text(lines[0])
  else:
    metrics.write_text("".join([lines[0].replace('"env_steps"', '"env_st\x01ps"', 1),
                                *lines[1:]]))  # fmt: skip

  def files():
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != ".lock"}

  before = files()
  proc = _run(run_dir, "--resume", check=False)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "could not plot" not in proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("[impala] error:") and "cut or edited" in last, last
  if damage == "garbled":
    assert "metrics.jsonl: line 1 is damaged (not a metrics line)" in last, last
  # The run is left as it was, to be restored: metrics.jsonl, no new TensorBoard events,
  # and a summary.json still of a finished run (not marked as being resumed).
  assert files() == before


def test_resume_keeps_metrics_lines_whose_env_steps_is_a_float(tmp_path):
  """A metrics line is a JSON object with numeric env_steps (as `read_metrics` reads it):
  a float is not damage."""
  from offpolicy_ac.training import RunLogger  # pylint: disable=import-outside-toplevel

  lines = ['{"env_steps": 512.0, "wall_time_s": 1.0}\n', '{"env_steps": 1024}\n',
           '{"env_steps": 1536}\n']  # fmt: skip
  (tmp_path / "metrics.jsonl").write_text("".join(lines))
  log = RunLogger(tmp_path, total_env_steps=2048, progress=False, tensorboard=False)
  log.truncate(2)
  log.close()
  assert (tmp_path / "metrics.jsonl").read_text() == "".join(lines[:2])


def test_resume_drops_bytes_that_are_not_text_after_the_checkpoints_lines(tmp_path):
  """Whatever follows the lines the checkpoint counts is dropped unread: junk that is not
  UTF-8 too (a disk's garbage after a crash)."""
  from offpolicy_ac.training import RunLogger  # pylint: disable=import-outside-toplevel

  lines = b'{"env_steps": 512}\n{"env_steps": 1024}\n'
  (tmp_path / "metrics.jsonl").write_bytes(lines + b"\x92\xff\x00\n\xfe")
  log = RunLogger(tmp_path, total_env_steps=2048, progress=False, tensorboard=False)
  log.truncate(2)
  log.close()
  assert (tmp_path / "metrics.jsonl").read_bytes() == lines


_KILLED_WHILE_SAVING_PARAMS = """
import os, signal, sys
import numpy as np
from offpolicy_ac.training import rundir

path, kill_at = sys.argv[1], int(sys.argv[2])
rundir.save_params(path, {"w": np.ones(3)})
replaced, replace = [], os.replace

def replace_or_die(src, dst):  # the second save dies before its `kill_at`-th rename
  replaced.append(dst)
  if len(replaced) == kill_at:
    os.kill(os.getpid(), signal.SIGKILL)
  replace(src, dst)

os.replace = replace_or_die
rundir.save_params(path, {"w": np.full(3, 2.0)})
"""


def test_parameters_are_saved_and_loaded_at_a_path_with_a_tilde(tmp_path, monkeypatch):
  # save_params("~/p.msgpack") failed: FileNotFoundError '~/p.msgpack.crc32.tmp'.
  monkeypatch.setenv("HOME", str(tmp_path))
  rundir.save_params("~/p.msgpack", {"w": np.full(3, 2.0)})
  assert (tmp_path / "p.msgpack").exists()
  loaded = rundir.load_params("~/p.msgpack", {"w": np.zeros(3)})
  np.testing.assert_array_equal(loaded["w"], np.full(3, 2.0))


@pytest.mark.parametrize("kill_at, value", [(1, 1.0), (2, 1.0), (3, 2.0)])
def test_a_kill_while_parameters_are_replaced_leaves_a_matching_pair(tmp_path, kill_at, value):
  path = tmp_path / "best_params.msgpack"
  proc = subprocess.run([sys.executable, "-c", _KILLED_WHILE_SAVING_PARAMS, str(path),
                         str(kill_at)], capture_output=True, text=True, timeout=300)  # fmt: skip
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
  loaded = rundir.load_params(path, {"w": np.zeros(3)})  # no DamagedCheckpointError
  np.testing.assert_array_equal(loaded["w"], np.full(3, value))


_SEEDS_STOPPED = """
import dataclasses, json, os, signal, sys
from offpolicy_ac import agents, presets
from offpolicy_ac.training import experiment, logger, make_training_rollout, run_experiment

moment, run_dir = sys.argv[1], sys.argv[2]
args = presets.impala.Args()
args = dataclasses.replace(args, run_dir=run_dir, train=args.train.replace(
    num_seeds=3, vmap_seeds=False, total_env_steps=1024, log_every=512, checkpoint_every=0))
built, rollouts = [], []

def agent_factory(spec):  # "build": the signal comes while seed 1's program is built
  built.append(spec)
  if moment == "build" and len(built) == 2:
    os.kill(os.getpid(), signal.SIGINT)
  return agents.make_impala(spec, args.agent)

def rollout_factory(act, config, seed, to_device):  # "close": as seed 0's pool closes
  rollout = make_training_rollout(act, config, seed, to_device)
  rollouts.append(rollout)
  if moment == "close" and len(rollouts) == 1:
    close = rollout.env.close
    rollout.env.close = lambda: (os.kill(os.getpid(), signal.SIGINT), close())
  return rollout

plot_runs = experiment.plot_runs
def plot_signalled(*a, **k):  # "plot": two signals as the seeds' plot is drawn
  if moment == "plot":
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
  return plot_runs(*a, **k)
experiment.plot_runs = plot_signalled

closed = []
close = logger.RunLogger.close
def close_signalled(self):  # "finish": as seed 0 writes its files
  closed.append(self)
  if moment == "finish" and len(closed) == 1:
    os.kill(os.getpid(), signal.SIGTERM)
  close(self)
logger.RunLogger.close = close_signalled

results = run_experiment("impala", args, agent_factory, rollout_factory=rollout_factory)
print(json.dumps([[r.env_steps, r.interrupted] for r in results]))
"""


@pytest.mark.parametrize("moment, expected", [("close", [[1024, False]]),
                                              ("finish", [[1024, False]]),
                                              ("plot", [[1024, False]] * 3),
                                              ("build", [[1024, False], [0, True]])])  # fmt: skip
def test_a_stop_signal_between_seeds_run_one_after_the_other_starts_no_more(tmp_path, moment,
                                                                             expected):  # fmt: skip
  """However late in a seed the signal comes (its pool closing, its files being written,
  the next seed's program being built), no further seed trains."""
  proc = subprocess.run([sys.executable, "-c", _SEEDS_STOPPED, moment, str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=600)  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected
  assert (tmp_path / "run" / "seed2").exists() == (moment == "plot")
  if moment in ("close", "finish"):
    assert "before seed 1; --resume starts it" in proc.stdout
  if moment == "plot":
    assert (tmp_path / "run" / "learning_curves.png").exists()


_ONE_SEED_SIGNALLED = """
import dataclasses, json, os, signal, sys, time
from offpolicy_ac import agents, presets
from offpolicy_ac.training import logger, run_experiment

moment, run_dir = sys.argv[1], sys.argv[2]
args = presets.impala.Args()
args = dataclasses.replace(args, run_dir=run_dir, train=args.train.replace(
    total_env_steps=1024, log_every=512, checkpoint_every=512))

def agent_factory(spec):  # "build": a Ctrl-C while the program is built
  if moment.startswith("build"):
    try:
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(1)
    except KeyboardInterrupt:
      if moment == "build-dropped":  # as a native callback drops it
        pass
      else:
        raise
  return agents.make_impala(spec, args.agent)

close = logger.RunLogger.close
def close_signalled(self):  # "finish": two signals as the run's files are written
  if moment == "finish":
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
  close(self)
logger.RunLogger.close = close_signalled

result = run_experiment("impala", args, agent_factory)
print(json.dumps([result.env_steps, result.interrupted]))
"""


@pytest.mark.parametrize("moment, expected", [("build", None), ("build-dropped", [0, True]),
                                              ("finish", [1024, False])])  # fmt: skip
def test_a_signal_while_the_run_is_built_or_its_files_written_is_not_lost_or_fatal(
    tmp_path, moment, expected
):
  """A Ctrl-C while the run is built interrupts it, and should native code drop the
  KeyboardInterrupt (it used to be lost, and the run trained on) the run stops at env
  step 0; two signals as the finished run writes its files wait for them (the second used
  to cut them short)."""
  run_dir = tmp_path / "run"
  proc = subprocess.run([sys.executable, "-c", _ONE_SEED_SIGNALLED, moment, str(run_dir)],
                        capture_output=True, text=True, timeout=600)  # fmt: skip
  if expected is None:
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists()
    return
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected
  summary = json.loads((run_dir / "summary.json").read_text())
  assert (run_dir / "final_params.msgpack").exists() and summary["env_steps"] == expected[0]
  assert summary.get("stopped_by") == ("SIGINT" if moment == "build-dropped" else None)
  if moment == "finish":
    assert proc.stdout.count("received SIGTERM: writing the run's files first") == 2


def test_a_second_signal_while_a_checkpoint_is_written_waits_for_it():
  """The first signal stops the run; a second one stops it at once, except while a
  checkpoint (the one a stop writes, in a compiled run) is being written."""
  import threading  # pylint: disable=import-outside-toplevel

  from offpolicy_ac.training import checkpoint  # pylint: disable=import-outside-toplevel
  from offpolicy_ac.training import experiment  # pylint: disable=import-outside-toplevel

  assert threading.current_thread() is threading.main_thread()  # signals reach this test
  flag = experiment._StopFlag()  # pylint: disable=protected-access
  with experiment._stop_on_signals(flag):  # pylint: disable=protected-access
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    assert flag.signal_name == "SIGINT"
    checkpoint.SAVING.set()
    try:
      os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the save goes on
      time.sleep(0.05)
    finally:
      checkpoint.SAVING.clear()
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.05)


def test_a_second_signal_whose_interrupt_python_dropped_stops_at_the_next_poll():
  """Python ignores an exception raised in a weakref callback or a __del__ ("Exception
  ignored in: <function WeakKeyDictionary.__init__.<locals>.remove>"): a second Ctrl-C
  that landed there was lost, and the run went on to its stop after the iteration, with
  exit code 0."""
  from offpolicy_ac.training import experiment  # pylint: disable=import-outside-toplevel

  flag = experiment._StopFlag()  # pylint: disable=protected-access
  with experiment._stop_on_signals(flag):  # pylint: disable=protected-access
    handler = signal.getsignal(signal.SIGINT)
    handler(signal.SIGINT, None)
    assert flag()  # the first: stop after this iteration
    try:
      handler(signal.SIGTERM, None)
    except KeyboardInterrupt:
      pass  # dropped, as in a weakref callback
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
      flag()
    seen = []  # other threads (actors) only read it
    reader = threading.Thread(target=lambda: seen.append(flag()))
    reader.start()
    reader.join()
    assert seen == [True]


_SECOND_SIGNAL = """
import os, signal, sys
from offpolicy_ac import cli
from offpolicy_ac.presets import impala
from offpolicy_ac.training import logger

signame, run_dir, *flags = sys.argv[1:]
sys.argv[0] = "impala.py"
log = logger.RunLogger.log
def log_signalled(self, record):  # two signals in the middle of the run
  log(self, record)
  if record["env_steps"] == 3840:
    os.kill(os.getpid(), signal.Signals[signame])
    os.kill(os.getpid(), signal.Signals[signame])
logger.RunLogger.log = log_signalled
parse = lambda: cli.parse_args(impala.Args, impala.PRESETS, ["--run-dir", run_dir, *flags])
cli.script_main(parse, impala.run)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_second_stop_signal_stops_at_once_in_one_line_and_resume_finishes_exactly(
    tmp_path, straight, sig
):
  """The second signal ends the run where it is (exit code 128 + the signal) with one line
  that says the checkpoints are intact, not a KeyboardInterrupt traceback."""
  run_dir = tmp_path / "run"
  flags = ["--total-env-steps", str(TOTAL), *FLAGS]
  proc = subprocess.run([sys.executable, "-c", _SECOND_SIGNAL, sig.name, str(run_dir), *flags],
                        capture_output=True, text=True, timeout=600)  # fmt: skip
  assert proc.returncode == 128 + sig.value, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      f"[impala] stopped at once by {sig.name}; the checkpoints written are intact: --resume "
      "goes on from the last one (or starts over if there is none)"
  )
  assert "Traceback" not in proc.stderr
  assert _checkpoints(run_dir)[-1] == 2560
  _run(run_dir, "--resume")
  _same_run(run_dir, straight)


_OUT_OF_MEMORY = """
import sys
import jax.numpy as jnp
from offpolicy_ac import cli
from offpolicy_ac.presets import impala
from offpolicy_ac.training import learner

run_dir, *flags = sys.argv[1:]
sys.argv[0] = "impala.py"
ingest = learner.Learner.ingest
def ingest_too_much(self, state, batch):  # the eighth unroll asks XLA for 1 PiB
  ingest_too_much.calls += 1
  if ingest_too_much.calls == 8:
    jnp.zeros(2**50, jnp.uint8).block_until_ready()
  return ingest(self, state, batch)
ingest_too_much.calls = 0
learner.Learner.ingest = ingest_too_much
parse = lambda: cli.parse_args(impala.Args, impala.PRESETS, ["--run-dir", run_dir, *flags])
cli.script_main(parse, impala.run)
"""


def test_running_out_of_memory_stops_with_one_line(tmp_path, straight):
  """XLA's out-of-memory error, raised in the learner: one line naming the sizes, exit code
  1, the checkpoints written intact: --resume repeats the uninterrupted run."""
  run_dir = tmp_path / "run"
  flags = ["--total-env-steps", str(TOTAL), *FLAGS]
  proc = subprocess.run([sys.executable, "-c", _OUT_OF_MEMORY, str(run_dir), *flags],
                        capture_output=True, text=True, timeout=600)  # fmt: skip
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
      "[impala] error: RESOURCE_EXHAUSTED: Out of memory allocating 1125899906842624 bytes "
      "(1,048,576.0 GiB); the checkpoints written are intact: smaller sizes (--num-envs, "
      "--unroll-length, --mini-batch-size, --replay-capacity, --num-seeds) ask for less; start "
      "again in a new --run-dir (--resume keeps the run's settings)"
  )
  assert _checkpoints(run_dir) == [1280]
  _run(run_dir, "--resume")
  _same_run(run_dir, straight)


_CTRL_C_WHILE_BUILT = """
import functools, os, signal, sys, time
from offpolicy_ac import cli
from offpolicy_ac.agents import make_impala
from offpolicy_ac.presets import impala
from offpolicy_ac.training import run_experiment

run_dir, *flags = sys.argv[1:]
sys.argv[0] = "impala.py"
def agent_factory(spec, config):
  os.kill(os.getpid(), signal.SIGINT)
  time.sleep(1)
  return make_impala(spec, config=config)
parse = lambda: cli.parse_args(impala.Args, impala.PRESETS, ["--run-dir", run_dir, *flags])
run = lambda a: run_experiment("impala", a, functools.partial(agent_factory, config=a.agent))
cli.script_main(parse, run)
"""


def test_a_ctrl_c_while_a_new_run_is_built_says_nothing_of_checkpoints(tmp_path):
  """Built, a new run has no checkpoints: its one line does not say they are intact."""
  proc = subprocess.run([sys.executable, "-c", _CTRL_C_WHILE_BUILT, str(tmp_path / "run"),
                         *FLAGS], capture_output=True, text=True, timeout=600)  # fmt: skip
  assert proc.returncode == 130, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1] == "[impala] stopped at once by SIGINT"
  assert _checkpoints(tmp_path / "run") == []


def test_a_stopped_run_without_checkpoints_says_it_cannot_be_resumed(tmp_path):
  run_dir = tmp_path / "run"
  proc = _start_and_wait(run_dir, lambda d: _lines(d) >= 1, "--checkpoint-every", "0",
                         steps=64_000)  # fmt: skip
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  assert "wrote no checkpoint (--checkpoint-every 0) and cannot be resumed" in out, out


def test_a_first_checkpoint_cut_short_twice_starts_over_and_a_later_one_is_refused(tmp_path):
  """`restore_newest` starts over when the only checkpoints set aside are copies of the
  run's first one without checksums (killed as it was written, each time the run started
  over); a later checkpoint without them (its record not the first's) is damage: refused,
  as is any where no `is_first` is given."""
  from offpolicy_ac.training.checkpoint import Checkpointer  # pylint: disable=import-outside-toplevel
  from offpolicy_ac.training.checkpoint import restore_newest  # pylint: disable=import-outside-toplevel

  tree = {"state": np.zeros(3)}
  is_first = lambda record: record["segment"] == 1
  ckpt = Checkpointer(tmp_path, max_to_keep=2)

  def cut_short(step, segment):  # saved, then its checksums lost as by a kill
    ckpt.save(step, tree, {"segment": segment})
    (tmp_path / str(step) / "checksums.json").unlink()

  for _ in range(2):
    cut_short(1, segment=1)
    with pytest.warns(RuntimeWarning, match=r"the save of the first one did not finish"):
      assert restore_newest(ckpt, tree, lambda record: None, is_first) is None
    time.sleep(1.0)  # copies set aside are named by the second
  assert len(checkpoint.set_aside_checkpoints(tmp_path)) == 2
  with pytest.warns(RuntimeWarning, match=r"could not be read"):  # the default: never first
    with pytest.raises(checkpoint.DamagedCheckpointError, match="no intact checkpoint"):
      cut_short(1, segment=1)
      restore_newest(ckpt, tree, lambda record: None)
  cut_short(2, segment=2)  # a second checkpoint: the first was complete once
  with pytest.warns(RuntimeWarning, match=r"could not be read"):
    with pytest.raises(checkpoint.DamagedCheckpointError, match="no intact checkpoint"):
      restore_newest(ckpt, tree, lambda record: None, is_first)
  ckpt.close()
