"""benchmarks/gpu/: the device machine's prepared Atari script, run here on the CPU.

The fast tests check the pieces (the limits on what comes back from $OUT, the raw configs,
the slimmed envpool wheel); the slow one runs atari.sh twice with a tiny budget, as a
session with the machine would run it twice: every phase, then the run resumed from the
packed checkpoint carried back.
"""

import base64
import hashlib
import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).parents[1]
GPU = ROOT / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import raw_sweep  # noqa: E402
import slim_wheel  # noqa: E402
import summarize  # noqa: E402


def test_check_out_accepts_the_layout_and_names_each_breach(tmp_path):
  for name in ("log.txt", "summary.txt", "results.json", "metrics.jsonl", "config.json",
               "plot.png", "run.tgz.0", "run.tgz.1"):  # fmt: skip
    (tmp_path / name).write_text("x")
  assert summarize.check_out(tmp_path) == []
  (tmp_path / "a" / "b" / "c").mkdir(parents=True)
  (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
  (tmp_path / "odd name.txt").write_text("x")
  with open(tmp_path / "big.bin", "wb") as f:
    f.truncate(summarize.MAX_FILE_BYTES + 1)
  problems = "\n".join(summarize.check_out(tmp_path))
  assert "a/b/c/deep.txt: more than 2 folders down" in problems
  assert "odd name.txt: a name" in problems
  assert "big.bin: 16.0 MiB, over 16 MiB" in problems
  assert "11 files, over 8" in problems


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--configs", "0x0"], "'0x0': need K >= 1"),
        (["--configs", "4x16", "--repeats", "0"], "argument --repeats: must be > 0, got 0"),
        (["--configs", "4x16", "--seconds", "-1"], "argument --seconds: must be > 0, got -1"),
        (["--configs", "4x16", "--out", "/proc/x.json"], "/proc takes no new file"),
        (["--configs", "1x4:0:0", "--task", "CartPole-v2", "--seconds", "0.1"],
         "no config could be measured"),
    ],
)  # fmt: skip
def test_raw_sweep_refuses_bad_settings_with_one_line(argv, message):
  """Each was a traceback (a config, --repeats 0: no median of nothing, --out after the
  sweep), accepted (--seconds -1), or a failed row and exit code 0 (an unknown task)."""
  if "/proc/x.json" in argv and not os.access("/proc", os.W_OK):
    pytest.skip("a user who may not write /proc is refused by its permissions")
  proc = subprocess.run([sys.executable, str(GPU / "raw_sweep.py"), *argv], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)  # fmt: skip
  assert proc.returncode in (1, 2) and message in proc.stderr, proc.stdout + proc.stderr
  assert "Traceback" not in proc.stderr


def test_raw_configs():
  assert raw_sweep.parse_config("1x64:16:32") == {
      "config": "1x64:16:32", "pools": 1, "envs_per_pool": 64, "num_threads": 16,
      "batch_size": 32,
  }  # fmt: skip
  assert raw_sweep.parse_config("4x32")["batch_size"] == 32
  for bad in ("64", "1x8:0:9", "4x32:8", "0x8"):
    with pytest.raises(ValueError):
      raw_sweep.parse_config(bad)


def _wheel(path: pathlib.Path, files: dict[str, bytes]) -> None:
  with zipfile.ZipFile(path, "w") as z:
    for name, data in files.items():
      z.writestr(name, data)
    z.writestr("envpool-1.2.5.dist-info/RECORD", "whatever\n")


def test_slim_wheel_keeps_the_families_and_rewrites_entry_and_record(tmp_path):
  entry = (
      b'"""Entry point."""\n\nimport envpool.atari.registration  # noqa: F401\n'
      b"import envpool.mujoco.dmc.registration  # noqa: F401\n"
  )
  wheel = tmp_path / "envpool-1.2.5-cp312-cp312-manylinux_2_28_x86_64.whl"
  _wheel(wheel, {
      "envpool/__init__.py": b"import envpool.entry\n",
      "envpool/entry.py": entry,
      "envpool/python/api.py": b"",
      "envpool/atari/__init__.py": b"",
      "envpool/atari/registration.py": b"",
      "envpool/atari/atari_envpool.so": b"\0" * 100,
      "envpool/mujoco/dmc/registration.py": b"",
      "envpool/mujoco/dmc/mujoco_dmc_envpool.so": b"\0" * 100,
      "envpool-1.2.5.dist-info/METADATA": b"Name: envpool\n",
  })  # fmt: skip
  out = tmp_path / "out"
  out.mkdir()
  slim_wheel.slim(wheel, out, {"atari"})
  with zipfile.ZipFile(out / wheel.name) as z:
    names = set(z.namelist())
    assert not any("mujoco" in n for n in names)
    assert "envpool/atari/atari_envpool.so" in names and "envpool/python/api.py" in names
    new_entry = z.read("envpool/entry.py")
    assert b"envpool.atari.registration" in new_entry and b"mujoco" not in new_entry
    record = z.read("envpool-1.2.5.dist-info/RECORD").decode().splitlines()
    listed = {line.split(",")[0] for line in record}
    assert listed == names
    digest = base64.urlsafe_b64encode(hashlib.sha256(new_entry).digest()).rstrip(b"=").decode()
    assert f"envpool/entry.py,sha256={digest},{len(new_entry)}" in record
  with pytest.raises(ValueError, match="no environment family"):
    slim_wheel.slim(wheel, out, {"atari", "pong"})


TRAIN_ARGS = (
    "--num-envs 4 --unroll-length 8 --actors async --num-actors 1 --max-policy-lag 8 "
    "--log-every 160 --checkpoint-every 320 --eval-every 320 --eval-episodes 1 --torso small_cnn"
)


def _run_script(out: pathlib.Path, work: pathlib.Path, ckpt: pathlib.Path, **env) -> str:
  full = {
      **os.environ,
      "OUT": str(out),
      "WORK": str(work),
      "CKPT": str(ckpt),
      "SKIP_INSTALL": "1",
      "PYTHON": sys.executable,
      "GAME": "Pong-v5",
      "TOTAL_STEPS": "1000000",
      "NUM_ENVS": "4",
      "NUM_ACTORS": "1",
      "TRAIN_ARGS": TRAIN_ARGS,
      "RAW_CONFIGS": "1x4:2:2 2x2",
      "RAW_SECONDS": "1",
      "BENCH_STEPS": "960",
      "BENCH_TORSO": "small_cnn",
      "BENCH_ARGS": "--pong-unroll 8",
      "BUDGET_S": "400",
      "RESERVE_S": "20",
      "MIN_TRAIN_S": "5",
      # the packed run (about 0.9 MB here, best parameters included) is split, as a Nature
      # CNN run's is on the device
      "PART_BYTES": "600000",
      **env,
  }
  proc = subprocess.run(
      ["bash", str(GPU / "atari.sh")], env=full, cwd=ROOT, capture_output=True, text=True,
      timeout=600,
  )  # fmt: skip
  log = proc.stdout + proc.stderr
  assert proc.returncode == 0, log[-4000:]
  return log


@pytest.mark.slow
def test_atari_script_on_the_cpu_then_resumed_from_its_packed_run(tmp_path):
  out1, out2, work, ckpt = (tmp_path / n for n in ("out1", "out2", "work", "ckpt"))
  log = _run_script(
      out1,
      work,
      ckpt,
      TRAIN_MAX_S="30",
      BENCH_LAYOUTS="1x4:2",
      PHASES="raw,noop,learner,xla_noop,xla,layouts,train",
  )  # every phase
  assert summarize.check_out(out1) == []
  files = {p.name for p in out1.iterdir()}
  assert {"log.txt", "summary.txt", "results.json", "metrics.jsonl", "config.json",
          "plot.png", "run.tgz.0", "run.tgz.1"} == files, log[-4000:]  # fmt: skip
  summary = (out1 / "summary.txt").read_text()
  for part in ("raw envpool stepping, best of 2 configs", "no-op learner", "real learner",
               "real learner, compiled rollout", "table run",
               "1 actors x 4 envs, batched by 2, async_xla",
               "protocol: Pong-v5: raw game score"):  # fmt: skip
    assert part in summary, summary
  results = json.loads((out1 / "results.json").read_text())
  assert results["raw"]["best"]["env_steps_per_s"] > 0
  medians = results["bench"]["medians"]
  assert {"async", "async_nolearn", "async_xla", "async_xla_nolearn"} <= set(medians)
  rollout = summarize.choose_rollout(work)[0]  # the faster learner's, as the run was given
  assert f"--rollout {rollout}, for at most" in log, log[-4000:]
  first = results["train"]
  assert first["interrupted"] and first["resumed_from_env_steps"] is None
  steps = first["checkpoint_env_steps"]
  assert steps and steps > 0 and first["env_steps"] >= steps

  packed = b"".join(p.read_bytes() for p in sorted(out1.glob("run.tgz.*")))
  with tarfile.open(fileobj=io.BytesIO(packed)) as tar:  # the best parameters with their steps
    assert {"./best_params.msgpack", "./best.json"} <= set(tar.getnames()), log[-3000:]

  # the next command: the returned parts carried back in CKPT, the work folder gone
  ckpt.mkdir()
  for part in out1.glob("run.tgz*"):
    (ckpt / part.name).write_bytes(part.read_bytes())
  log = _run_script(out2, work, ckpt, PHASES="train", TRAIN_MAX_S="60")
  assert f"resuming from the checkpoint at {steps} env steps" in log, log[-4000:]
  assert f"--rollout {rollout}: the resumed run's own" in log, log[-4000:]
  assert summarize.check_out(out2) == []
  second = json.loads((out2 / "results.json").read_text())["train"]
  assert second["resumed_from_env_steps"] == steps
  assert second["env_steps"] > steps, log[-4000:]
  metrics = [json.loads(line) for line in (out2 / "metrics.jsonl").read_text().splitlines()]
  env_steps = [m["env_steps"] for m in metrics]
  assert env_steps == sorted(env_steps)
  # A stopped run logs no partial interval (the resumed run logs it in full): the last
  # line is the last --log-every (160) point the run reached.
  assert env_steps[-1] == second["env_steps"] // 160 * 160
  assert any(s <= steps for s in env_steps) and any(s > steps for s in env_steps)

  # SQIL, then the layouts in the time left after training: the demonstrations are games
  # of the run packed above (DEMO_RUN, the returned folder), recorded before training
  out3, work3 = tmp_path / "out3", tmp_path / "work3"
  log = _run_script(
      out3, work3, tmp_path / "none", AGENT="sqil", DEMO_RUN=str(out1), DEMO_EPISODES="1",
      PHASES="layouts,train", TRAIN_MAX_S="75", TRAIN_ROLLOUT="compiled",
      BENCH_LAYOUTS="1x4:2", TRAIN_EXTRA_ARGS="--gamma 0.97", PART_BYTES="15728640",
  )  # fmt: skip
  assert log.index("recorded 1 episode of Pong-v5") < log.index("train: sqil on Pong-v5")
  assert log.index("train: sqil on Pong-v5") < log.index("training loop layouts")
  assert summarize.check_out(out3) == []
  summary = (out3 / "summary.txt").read_text()
  assert "demonstrations: recorded 1 episode of Pong-v5" in summary, summary
  assert "1 actors x 4 envs, batched by 2, async_xla" in summary, summary
  config = json.loads((out3 / "config.json").read_text())
  assert "--demos" in config["command"], config["command"]
  assert config["config"]["agent"]["gamma"] == 0.97

  # SQIL's run carried back: its replay buffer is in its checkpoint (orbax compresses the
  # frames), its demonstrations beside it (recorded again, the file would differ). A stop
  # while the first chunk compiles returns at once, so both SQIL runs have time to compile.
  ckpt4, out4 = tmp_path / "ckpt4", tmp_path / "out4"
  ckpt4.mkdir()
  for part in out3.glob("run.tgz*"):
    (ckpt4 / part.name).write_bytes(part.read_bytes())
  assert list(ckpt4.iterdir()), log[-3000:]
  steps = json.loads((out3 / "results.json").read_text())["train"]["checkpoint_env_steps"]
  assert steps > 0, log[-3000:]  # a checkpoint after training, not the initial one
  log = _run_script(
      out4, work3, ckpt4, AGENT="sqil", DEMO_RUN=str(out1), DEMO_EPISODES="1", PHASES="train",
      TRAIN_MAX_S="75", TRAIN_ROLLOUT="compiled", TRAIN_EXTRA_ARGS="--gamma 0.97",
  )  # fmt: skip
  assert "sqil: the demonstrations packed with the run" in log, log[-4000:]
  assert f"resuming from the checkpoint at {steps} env steps" in log, log[-4000:]
  fourth = json.loads((out4 / "results.json").read_text())["train"]
  assert fourth["resumed_from_env_steps"] == steps and fourth["env_steps"] > steps, log[-4000:]


def _refused_run(tmp_path, timeout, **env) -> subprocess.CompletedProcess:
  """atari.sh with `env` on top of a bare setting (no install), out and work in tmp_path."""
  env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
         "SKIP_INSTALL": "1", "PYTHON": sys.executable, **env}  # fmt: skip
  return subprocess.run(
      ["bash", str(GPU / "atari.sh")], env=env, cwd=ROOT, capture_output=True, text=True,
      timeout=timeout,
  )  # fmt: skip


def test_sqil_without_demonstrations_is_refused_before_any_work(tmp_path):
  proc = _refused_run(tmp_path, 60, AGENT="sqil", PHASES="raw,train",
                      DEMO_RUN=str(tmp_path / "missing"))  # fmt: skip
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert "AGENT=sqil trains from demonstrations: set DEMO_RUN" in proc.stdout
  assert "raw envpool stepping" not in proc.stdout
  assert not (tmp_path / "work").exists()


@pytest.mark.parametrize(
    "env, message",
    [
        ({"PHASES": "rwa"}, "PHASES: 'rwa' is not a phase; the phases are raw,noop,learner,"),
        ({"AGENT": "impal"}, "AGENT=impal: the agents with an atari preset are impala, acer,"),
        ({"TRAIN_ROLLOUT": "xla"}, "TRAIN_ROLLOUT=xla: give auto, host or compiled"),
        ({"PHASES": "layouts", "BENCH_LAYOUTS": "4x16 4by8"},
         "BENCH_LAYOUTS: '4by8' is not K x N[:BATCH]"),
        ({"GAME": "Pongg-v5"}, "GAME=Pongg-v5: not an envpool task"),
        ({"PHASES": "train", "BUDGET_S": "10m"}, "BUDGET_S=10m: give a whole number > 0"),
        ({"NUM_ENVS": "0"}, "NUM_ENVS=0: give a whole number > 0"),
        ({"TRAIN_MAX_S": "1h"}, "TRAIN_MAX_S=1h: give a whole number > 0"),
        ({"RESERVE_S": "-5"}, "RESERVE_S=-5: give a whole number >= 0"),
        ({"RAW_SECONDS": "2s"}, "RAW_SECONDS=2s: give a number of seconds > 0"),
        ({"RAW_CONFIGS": "1x4 2y8"}, "RAW_CONFIGS: '2y8' is not KxN[:THREADS[:BATCH]]"),
    ],
)  # fmt: skip
def test_settings_with_a_typo_are_refused_before_any_work(tmp_path, env, message):
  """Each ran nothing (or nothing useful) and ended with exit code 0: a start of the
  machine spent on nothing."""
  proc = _refused_run(tmp_path, 120, **env)
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert message in proc.stdout, proc.stdout
  assert "raw envpool stepping" not in proc.stdout and "training loop" not in proc.stdout


def test_a_failed_phase_fails_the_command_and_says_so(tmp_path):
  """A bench phase that fails (here refused: unrolls of no steps, in BENCH_ARGS, which
  the script passes on unread) was logged, and the command ended with exit code 0."""
  proc = _refused_run(tmp_path, 300, PHASES="noop", BENCH_ARGS="--pong-unroll 0")
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert "async_nolearn: exit code 2" in proc.stdout, proc.stdout
  assert "failed: async_nolearn (their errors are above)" in proc.stdout, proc.stdout
  assert (tmp_path / "out" / "summary.txt").exists()


def test_a_layout_cut_by_the_time_left_ends_the_phase_without_failing(tmp_path):
  """The layouts take the time left: the one it cuts (124) ends the phase; the command
  does not fail for it (it ended with exit code 1, "stopped at PHASE_MAX_S")."""
  proc = _refused_run(tmp_path, 300, PHASES="layouts", BENCH_LAYOUTS="1x4 1x4",
                      PHASE_MAX_S="20", BENCH_STEPS="10000000")  # fmt: skip
  assert "layout 1x4: cut by the time left" in proc.stdout, proc.stdout + proc.stderr
  assert proc.stdout.count("cut by the time left") == 1  # the second one never started
  assert "failed:" not in proc.stdout
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_refused_table_run_fails_the_command_and_says_so(tmp_path):
  """ACER's preset refuses unrolls shorter than its mini-batch length: the command ends
  with the run's exit code, its summary naming it, not 0 with an empty summary."""
  proc = _refused_run(tmp_path, 300, CKPT=str(tmp_path / "none"), AGENT="acer", PHASES="train",
                      NUM_ENVS="4", NUM_ACTORS="1", TRAIN_MAX_S="60", MIN_TRAIN_S="5")  # fmt: skip
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert "(the run was refused: its error is above)" in proc.stdout
  summary = (tmp_path / "out" / "summary.txt").read_text()
  assert "the training command ended with exit code 2" in summary, summary
  results = json.loads((tmp_path / "out" / "results.json").read_text())
  assert results["train"]["train_exit_code"] == 2


@pytest.mark.parametrize("rc, why", [
    (124, "stopped at its time limit (TRAIN_MAX_S, or the time left): more time, or a shorter "
          "start"),
    (2, "refused: its error is in log.txt"),
    (1, "failed: its error is in log.txt"),
])  # fmt: skip
def test_a_table_run_without_metrics_is_summarized_by_its_exit_code(tmp_path, rc, why):
  """A run stopped at the limit before its first metrics line (a slow start) has no error
  in log.txt: the summary says it was stopped."""
  text, results = summarize.summarize(tmp_path, "Pong-v5", "impala", 0, 40.0, rc)
  assert text.splitlines()[-1] == (f"table run: none: the training command ended with exit "
                                   f"code {rc} after 40 s, before its first metrics line ({why})")  # fmt: skip
  assert results["train"] == {"train_exit_code": rc, "train_seconds": 40.0}


def test_rollout_is_the_resumed_runs_else_the_faster_learner(tmp_path):
  assert summarize.choose_rollout(tmp_path)[0] == "host"  # nothing measured
  medians = {"async": {"env_steps_per_s": 9000.0, "used_env_steps_per_s": 8000.0},
             "async_xla": {"env_steps_per_s": 8500.0}}  # fmt: skip
  bench = {"tasks": {"Pong-v5": {"medians": medians}}}
  (tmp_path / "bench.json").write_text(json.dumps(bench))
  rollout, why = summarize.choose_rollout(tmp_path)
  assert rollout == "compiled" and "host 8,000" in why  # dropped trajectories left out
  medians["async"]["used_env_steps_per_s"] = 8600.0
  (tmp_path / "bench.json").write_text(json.dumps(bench))
  assert summarize.choose_rollout(tmp_path)[0] == "host"
  (tmp_path / "run").mkdir()
  config = {"config": {"train": {"env": {"rollout": "compiled"}}}}
  (tmp_path / "run" / "config.json").write_text(json.dumps(config))
  assert summarize.choose_rollout(tmp_path) == ("compiled", "the resumed run's own")


def _bench(actors, num_envs, batch, rates, raw):
  medians = {"raw_KxN": {"env_steps_per_s": raw}}
  medians.update({m: {"env_steps_per_s": v} for m, v in rates.items()})
  config = {"actors": actors, "num_envs": num_envs, "env_batch_size": batch}
  return {"tasks": {"Pong-v5": {"medians": medians, "config": config}}}


def test_summary_lists_each_layout_against_its_raw_and_the_best_raw(tmp_path):
  (tmp_path / "raw.json").write_text(json.dumps(
      {"best": {"config": "1x64:16:32", "env_steps_per_s": 20000.0}, "results": [{}],
       "cpu_count": 16}))  # fmt: skip
  (tmp_path / "layout_4x16_8.json").write_text(
      json.dumps(_bench(4, 16, 8, {"async_xla": 15000.0}, 18000.0))
  )
  (tmp_path / "layout_2x32_0.json").write_text(
      json.dumps(_bench(2, 32, 0, {"async_xla": 9000.0}, 18000.0))
  )
  text, results = summarize.summarize(tmp_path, "Pong-v5", "impala", 0, None, None)
  assert (
      "4 actors x 16 envs, batched by 8, async_xla: 15,000 env steps/s, 0.83 of raw 4 x 16, "
      "0.75 of the best raw" in text
  )
  assert "2 actors x 32 envs, async_xla: 9,000 env steps/s, 0.50 of raw 2 x 32" in text
  assert [lay["env_batch_size"] for lay in results["layouts"]] == [0, 8]
