"""Runs researchers can trust: exact resume, kills, corrupt checkpoints, NaN guard (stop
signals, two processes and flipped bytes: test_faults.py).

Each test drives experiments/impala.py (or sql.py) in a subprocess, as a user would.
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

from old_runs import as_written_by_0_2
import pytest

from offpolicy_ac.training import RunLogger

ROOT = pathlib.Path(__file__).parents[2]
WALL_CLOCK = ("wall_time_s", "env_steps_per_s")
# 256 env steps per iteration (16 envs x 16 steps); checkpoints every 10 iterations.
FLAGS = [
    "--checkpoint-every",
    "2560",
    "--log-every",
    "1280",
    "--eval-every",
    "2560",
    "--eval-episodes",
    "2",
]


def _command(script, run_dir, steps, *extra):
  return [
      sys.executable,
      str(ROOT / "experiments" / f"{script}.py"),
      "--run-dir",
      str(run_dir),
      "--total-env-steps",
      str(steps),
      *FLAGS,
      *extra,
  ]


def _run(script, run_dir, steps, *extra, check=True, **kwargs):
  cmd = _command(script, run_dir, steps, *extra)
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)
  if check and proc.returncode != 0:
    raise AssertionError(f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return proc


def _metrics(run_dir):
  lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  return [{k: v for k, v in l.items() if k not in WALL_CLOCK} for l in lines]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
  run_dir = tmp_path_factory.mktemp("straight") / "run"
  _run("impala", run_dir, 7680)
  return run_dir


def test_stop_and_resume_logs_exactly_the_straight_run(tmp_path, straight_run):
  _run("impala", tmp_path / "run", 5120)
  proc = _run("impala", tmp_path / "run", 7680, "--resume")
  assert _metrics(tmp_path / "run") == _metrics(straight_run)  # --eval-every is explicit
  assert "the budget grows from 5,120 to 7,680 env steps" in proc.stdout
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["env_steps"] == 7680


def test_resuming_a_finished_run_changes_nothing(tmp_path, straight_run):
  shutil.copytree(straight_run, tmp_path / "run")
  before = json.loads((tmp_path / "run" / "summary.json").read_text())
  _run("impala", tmp_path / "run", 7680, "--resume")
  after = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert _metrics(tmp_path / "run") == _metrics(straight_run)
  assert after["wall_time_s"] <= before["wall_time_s"]  # no time added: the checkpoint's
  del before["wall_time_s"], after["wall_time_s"], before["run_dir"], after["run_dir"]
  assert after == before
  for name in ("final_params.msgpack", "best_params.msgpack"):
    assert (tmp_path / "run" / name).read_bytes() == (straight_run / name).read_bytes()


def test_a_console_closed_while_the_run_trains_stops_nothing(tmp_path, straight_run):
  """`impala.py | head -1`: the output goes, the run goes on (it died of BrokenPipeError)."""
  with open(tmp_path / "stderr", "w+") as stderr:
    proc = subprocess.Popen(_command("impala", tmp_path / "run", 7680), stdout=subprocess.PIPE,
                            stderr=stderr, text=True)  # fmt: skip
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=600) == 0, (tmp_path / "stderr").read_text()
  assert _metrics(tmp_path / "run") == _metrics(straight_run)
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == 7680


@pytest.mark.parametrize("console", ["closed", "full", "ascii"])
def test_a_console_that_cannot_be_written_stops_nothing(tmp_path, straight_run, console):
  """stdout closed at start (`>&-`), on a full disk (`>/dev/full`), or an ASCII console
  given a run directory's non-ASCII name: the run trains to its end all the same."""
  run = tmp_path / ("run \u00fc" if console == "ascii" else "run")
  command = shlex.join(_command("impala", run, 7680))
  redirect = {"closed": ">&-", "full": ">/dev/full", "ascii": ">/dev/null"}[console]
  env = {**os.environ, "PYTHONIOENCODING": "ascii"} if console == "ascii" else None
  proc = subprocess.run(["bash", "-c", f"{command} {redirect}"], capture_output=True,
                        text=True, timeout=600, env=env)  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert _metrics(run) == _metrics(straight_run)
  assert json.loads((run / "summary.json").read_text())["env_steps"] == 7680


def test_a_refused_resume_does_not_announce_a_new_budget(tmp_path, straight_run):
  shutil.copytree(straight_run, tmp_path / "run")
  proc = _run("impala", tmp_path / "run", 10240, "--resume", "--num-envs", "8", check=False)
  assert proc.returncode == 2 and "differs from the run's" in proc.stderr, proc.stderr
  assert "budget grows" not in proc.stdout


def test_xla_rollout_stops_resumes_and_logs_exactly_the_host_loop_run(tmp_path, straight_run):
  # The compiled loop (envpool's XLA interface) steps the same environments with the same
  # keys as the host loop: every logged number matches, across checkpoint segments,
  # evaluations and a resume.
  _run("impala", tmp_path / "run", 5120, "--rollout", "compiled")
  _run("impala", tmp_path / "run", 7680, "--rollout", "compiled", "--resume")
  assert _metrics(tmp_path / "run") == _metrics(straight_run)
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  assert config["config"]["train"]["env"]["rollout"] == "compiled"


def _tensorboard_steps(run_dir):
  """The steps of the episode_return points in the TensorBoard event files, as written."""
  from tensorboardX.proto import event_pb2

  steps = []
  for path in sorted((run_dir / "tensorboard").iterdir()):
    data, at = path.read_bytes(), 0
    while at + 12 <= len(data):
      length = int.from_bytes(data[at : at + 8], "little")
      event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
      at += 12 + length + 4
      steps += [event.step for v in event.summary.value if v.tag == "episode_return"]
  return steps


def test_a_resume_writes_tensorboard_anew_from_metrics_jsonl(tmp_path):
  """A killed run's event files may hold points past its checkpoint, or (written by an
  older version, whose tensorboardX thread flushed every two minutes) lack some before it;
  a resume logs only the points after its checkpoint, so it writes the kept lines' points
  anew. Closed twice, a logger closes once."""
  logger = RunLogger(tmp_path, total_env_steps=100, tensorboard=True, progress=False)
  for step in (10, 20, 30):
    logger.log({"env_steps": step, "wall_time_s": 0.1, "episode_return": 1.0})
  logger.close()
  for path in (tmp_path / "tensorboard").iterdir():  # as a kill -9 leaves them
    path.write_bytes(b"")
  resumed = RunLogger(tmp_path, total_env_steps=100, tensorboard=True, progress=False)
  resumed.truncate(2)  # the checkpoint's lines
  resumed.log({"env_steps": 30, "wall_time_s": 0.2, "episode_return": 2.0})
  assert _tensorboard_steps(tmp_path) == [10, 20, 30]  # on the disk line by line
  resumed.close()
  resumed.close()
  assert _tensorboard_steps(tmp_path) == [10, 20, 30]


def test_resume_drops_a_final_partial_line(tmp_path, straight_run):
  # 5120 + 256 is not a log point: the run ends with a "final" partial line.
  _run("impala", tmp_path / "run", 5120 + 256)
  assert _metrics(tmp_path / "run")[-1].get("final") is True
  shutil.rmtree(tmp_path / "run" / "checkpoints" / "5376")  # back to the 5120 point
  _run("impala", tmp_path / "run", 7680, "--resume")
  assert _metrics(tmp_path / "run") == _metrics(straight_run)
  # TensorBoard's points are the kept lines' and the resumed run's (5376 dropped too).
  assert _tensorboard_steps(tmp_path / "run") == [m["env_steps"] for m in _metrics(straight_run)]


def test_a_budget_between_iterations_is_announced_and_rounded_up(tmp_path):
  proc = _run("impala", tmp_path / "run", 5120 + 100)
  assert ("[impala] the budget, 5,220 env steps, is not a whole number of iterations (256 env "
          "steps each): the run trains 5,376") in proc.stdout  # fmt: skip
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["env_steps"] == 5376
  assert "whole number" not in _run("impala", tmp_path / "whole", 5120).stdout


def test_kill_9_during_training_then_resume(tmp_path, straight_run):
  run_dir = tmp_path / "run"
  cmd = [
      sys.executable,
      str(ROOT / "experiments" / "impala.py"),
      "--run-dir",
      str(run_dir),
      "--total-env-steps",
      "7680",
      *FLAGS,
  ]
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  ckpts = run_dir / "checkpoints"
  deadline = time.time() + 300
  while time.time() < deadline and not (
      ckpts.exists() and any(p.name.isdigit() for p in ckpts.iterdir())
  ):
    time.sleep(0.05)
  time.sleep(0.3)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL
  _run("impala", run_dir, 7680, "--resume")
  lines = _metrics(run_dir)
  assert [l["env_steps"] for l in lines] == [l["env_steps"] for l in _metrics(straight_run)]


def test_resume_before_the_first_checkpoint_starts_over(tmp_path, straight_run):
  run_dir = tmp_path / "run"
  _run("impala", run_dir, 1280)  # ends with a checkpoint at 1280; drop it, as if
  shutil.rmtree(run_dir / "checkpoints")  # killed before any checkpoint was written
  (run_dir / "summary.json").unlink()  # (and so before its summary)
  proc = _run("impala", run_dir, 7680, "--resume")
  assert "starts again from the beginning" in proc.stderr
  assert _metrics(run_dir) == _metrics(straight_run)


def test_a_run_whose_summary_names_a_lost_checkpoint_is_not_started_over(tmp_path, straight_run):
  """A finished run copied or cleaned without checkpoints/: --resume refuses, in one line,
  and leaves its metrics, parameters and config.json as they were."""
  run_dir = tmp_path / "run"
  shutil.copytree(straight_run, run_dir)
  shutil.rmtree(run_dir / "checkpoints")
  names = ("metrics.jsonl", "final_params.msgpack", "config.json", "summary.json")
  kept = {name: (run_dir / name).read_bytes() for name in names}
  # With nothing left, and with the folders a save killed as it began leaves.
  for left in ([], ["7680.orbax-checkpoint-tmp", "8960"]):
    for name in left:
      (run_dir / "checkpoints" / name).mkdir(parents=True)
    proc = _run("impala", run_dir, 10240, "--resume", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"[impala] error: --resume: {run_dir / 'summary.json'} names a checkpoint at env step "
        f"7,680, and {run_dir / 'checkpoints'} holds none written whole: put the run's "
        "checkpoints back, or start it over in another --run-dir"
    )
    assert {name: (run_dir / name).read_bytes() for name in kept} == kept


def test_a_resume_that_cannot_write_its_files_is_refused_before_training(tmp_path, straight_run):
  run_dir = tmp_path / "run"
  shutil.copytree(straight_run, run_dir)
  shutil.rmtree(run_dir / "checkpoints")
  (run_dir / "checkpoints").write_text("not a folder")
  proc = _run("impala", run_dir, 10240, "--resume", check=False)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
      f"[impala] error: --resume: {run_dir / 'checkpoints'} is a file, not the run's "
      "checkpoints folder"
  )
  if os.geteuid() == 0:  # root writes whatever the modes say
    return
  (run_dir / "checkpoints").unlink()
  shutil.copytree(straight_run / "checkpoints", run_dir / "checkpoints")
  (run_dir / "checkpoints").chmod(0o555)
  try:
    proc = _run("impala", run_dir, 10240, "--resume", check=False)
  finally:
    (run_dir / "checkpoints").chmod(0o755)
  assert proc.returncode == 2 and "checkpoints is not writable" in proc.stderr, proc.stderr


def test_a_resume_keeps_what_started_the_run_in_config_json(tmp_path, straight_run):
  run_dir = tmp_path / "run"
  shutil.copytree(straight_run, run_dir)
  before = json.loads((run_dir / "config.json").read_text())
  _run("impala", run_dir, 8960, "--resume")
  _run("impala", run_dir, 10240, "--resume")
  after = json.loads((run_dir / "config.json").read_text())
  for field in ("created", "command", "git_revision", "versions"):
    assert after[field] == before[field]
  assert [r["command"][r["command"].index("--total-env-steps") + 1] for r in after["resumed"]] == [
      "8960", "10240"
  ]  # fmt: skip
  assert after["config"]["train"]["budget"]["total_env_steps"] == 10240


def test_corrupt_latest_checkpoint_falls_back_with_a_warning(tmp_path, straight_run):
  run_dir = tmp_path / "run"
  _run("impala", run_dir, 5120)
  latest = run_dir / "checkpoints" / "5120"
  data = max((latest / "arrays").glob("ocdbt.process_0/d/*"), key=lambda p: p.stat().st_size)
  data.write_bytes(data.read_bytes()[:100])  # cut short, as by a crash mid-write
  proc = _run("impala", run_dir, 7680, "--resume")
  line = next(l for l in proc.stderr.splitlines() if "could not be read" in l)
  assert "falling back" in line and len(line) < 800, line  # not tensorstore's 40-line spec
  summary = json.loads((run_dir / "summary.json").read_text())
  assert summary["env_steps"] == 7680


def test_a_run_whose_checkpoints_are_all_damaged_is_refused_in_a_line_each(tmp_path,
                                                                           straight_run):  # fmt: skip
  """A damaged data file fails several of a checkpoint's array reads: orbax's coroutines
  left pending printed theirs as unraisable exceptions, some 260 lines of tracebacks and
  tensorstore specs around the warnings and the refusal."""
  run_dir = tmp_path / "run"
  shutil.copytree(straight_run, run_dir)
  checkpoints = sorted((run_dir / "checkpoints").iterdir())
  for data in run_dir.glob("checkpoints/*/arrays/ocdbt.process_0/d/*"):
    size = data.stat().st_size
    if size > 1000:
      data.write_bytes(data.read_bytes()[: size // 2])  # cut short, as by a crash mid-write
  proc = _run("impala", run_dir, 7680, "--resume", check=False)
  assert proc.returncode == 2 and "no intact checkpoint" in proc.stderr
  assert "Exception ignored" not in proc.stderr
  assert len(proc.stderr.splitlines()) == len(checkpoints) + 1, proc.stderr[:3000]


def test_resume_refuses_a_different_config(tmp_path):
  run_dir = tmp_path / "run"
  _run("impala", run_dir, 2560)
  proc = _run("impala", run_dir, 5120, "--resume", "--learning-rate", "0.1", check=False)
  assert proc.returncode != 0
  started = shlex.join(_command("impala", run_dir, 2560)[1:])  # the script and its flags
  assert proc.stderr.endswith(
      "[impala] error: --resume: the config differs from the run's in --learning-rate (the "
      "run's 0.003, given 0.1); only the step budget (--total-env-steps), the tracking flags, "
      "--import-modules and a job's --coordinator-address may change; the run last ran as "
      f"`python {started}`: "
      "repeat it with --resume\n"
  )
  # A resume that ran names its own command, which has --resume.
  _run("impala", run_dir, 5120, "--resume")
  proc = _run("impala", run_dir, 7680, "--resume", "--learning-rate", "0.1", check=False)
  resumed = shlex.join(_command("impala", run_dir, 5120, "--resume")[1:])
  assert proc.stderr.endswith(f"the run last ran as `python {resumed}`: repeat that command\n")
  proc = _run("impala", run_dir, 5120, check=False)
  assert proc.returncode != 0 and "--resume" in proc.stderr  # never overwrites a run


def test_a_run_written_before_a_field_existed_resumes_with_its_default(tmp_path):
  run_dir = tmp_path / "run"
  _run("impala", run_dir, 2560)
  path = run_dir / "config.json"
  written = json.loads(path.read_text())
  del written["config"]["agent"]["optimizer_eps"]  # as a version without the field wrote
  path.write_text(json.dumps(written))
  proc = _run("impala", run_dir, 5120, "--resume", "--optimizer-eps", "0.001", check=False)
  assert proc.returncode == 2 and ("--optimizer-eps (the run's config.json predates it: the "
                                   "default, 1e-05; given 0.001)") in proc.stderr  # fmt: skip
  _run("impala", run_dir, 5120, "--resume")  # the field's default: the old behaviour
  assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 5120


def test_non_finite_loss_stops_with_a_clear_message(tmp_path):
  run_dir = tmp_path / "run"
  # A huge learning rate makes the network's outputs (and the loss) overflow.
  proc = _run(
      "impala", run_dir, 100_000, "--learning-rate", "1e30", "--max-grad-norm", "1e30", check=False
  )
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
  assert re.fullmatch(
      r"\[impala\] error: non-finite \w+ = (nan|inf) at env step \d+ \(update \d+\); stopping\. "
      r"(No checkpoint was written before it|The last good checkpoint, at env step [\d,]+, is "
      r"kept in .*checkpoints)\. A --learning-rate or --reward-scale too large makes the "
      r"updates diverge \(so does a loss with a bug\)\.", last)  # fmt: skip


def test_exit_process_flushes_runs_atexit_handlers_and_keeps_the_exit_code(tmp_path):
  """The scripts end with exit_process(): buffered output and atexit handlers must
  survive it, and the exit code must be the one asked for."""
  marker = tmp_path / "atexit.txt"
  code = (
      "import atexit, pathlib, sys\n"
      "from offpolicy_ac.cli import exit_process\n"
      f"atexit.register(lambda: pathlib.Path({str(marker)!r}).write_text('ran'))\n"
      "sys.stdout.write('buffered out')\n"
      "sys.stderr.write('buffered err')\n"
      "exit_process(3)\n"
      "print('never')\n"
  )
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 3
  assert proc.stdout == "buffered out" and "buffered err" in proc.stderr
  assert marker.read_text() == "ran"


def test_normalized_observations_stop_and_resume_exactly(tmp_path):
  # The observation statistics are learner state: checkpointed, restored, and what the
  # policy acts with, so a resumed run repeats the straight one exactly.
  flags = ("--normalize-observations", "--reward-clip", "-0.5", "0.5")
  _run("impala", tmp_path / "straight", 7680, *flags)
  _run("impala", tmp_path / "run", 5120, *flags)
  _run("impala", tmp_path / "run", 7680, "--resume", *flags)
  straight = _metrics(tmp_path / "straight")
  assert _metrics(tmp_path / "run") == straight
  assert straight[:2] != _metrics_without(tmp_path)  # the transformers change the run
  assert (tmp_path / "run" / "final_transform.msgpack").exists()


def _metrics_without(tmp_path):
  _run("impala", tmp_path / "plain", 2560)
  return _metrics(tmp_path / "plain")


def test_a_run_of_the_previous_format_is_refused_on_resume(tmp_path, straight_run):
  run_dir = tmp_path / "run"
  shutil.copytree(straight_run, run_dir)
  config = json.loads((run_dir / "config.json").read_text())
  config["config"]["loop"] = config["config"].pop("train")  # offpolicy_ac 0.1's layout
  (run_dir / "config.json").write_text(json.dumps(config))
  proc = _run("impala", run_dir, 10240, "--resume", check=False)
  assert proc.returncode != 0
  assert "written by offpolicy_ac 0.1" in proc.stderr and "format 3" in proc.stderr


def test_runs_started_in_the_same_second_get_their_own_default_directories(tmp_path,
                                                                           monkeypatch):  # fmt: skip
  from offpolicy_ac.training import TrainConfig  # pylint: disable=import-outside-toplevel
  from offpolicy_ac.training.rundir import default_run_dir  # pylint: disable=import-outside-toplevel

  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(time, "strftime", lambda fmt: "20261129-120000")
  config = TrainConfig.of(env_id="gymnax:CartPole-v1")
  dirs = [default_run_dir("impala", config) for _ in range(3)]
  assert dirs == [f"runs/impala-gymnax-CartPole-v1-seed0-20261129-120000{s}"
                  for s in ("", "-2", "-3")]  # fmt: skip
  assert all((tmp_path / d).is_dir() for d in dirs)


def test_a_0_2_run_is_refused_on_resume_by_its_checkpoint_format(tmp_path, straight_run):
  """Not as a changed config (0.2 wrote `whole_replay_buffer_training`, removed since), and
  config.json is left as it was."""
  run_dir = tmp_path / "run"
  shutil.copytree(straight_run, run_dir)
  as_written_by_0_2(run_dir)
  config = (run_dir / "config.json").read_text()
  proc = _run("impala", run_dir, 10240, "--resume", check=False)
  assert proc.returncode == 2, proc.stderr
  assert "has record format 2" in proc.stderr and "resume with offpolicy_ac 0.2" in proc.stderr
  assert (run_dir / "config.json").read_text() == config
  assert "budget grows" not in proc.stdout  # refused before a larger budget is announced


def test_a_vmapped_seed_of_offpolicy_ac_0_2_is_refused_on_resume(tmp_path):
  """0.2 recorded its root as `vmapped_seeds_of`: resumed alone, the seed started over and
  overwrote its final parameters and metrics."""
  root = tmp_path / "run"
  _run("impala", root, 512, "--num-seeds", "2", "--checkpoint-every", "256")
  as_written_by_0_2(root)
  final = (root / "seed0" / "final_params.msgpack").read_bytes()
  proc = _run("impala", root / "seed0", 1024, "--checkpoint-every", "256", "--resume",
              check=False)  # fmt: skip
  assert proc.returncode == 2 and "is one learner of the run in" in proc.stderr, proc.stderr
  assert (root / "seed0" / "final_params.msgpack").read_bytes() == final
