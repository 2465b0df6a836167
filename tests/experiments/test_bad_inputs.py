"""Bad command lines get one clear line and exit code 2, before anything runs, from every
script: no traceback, no run directory left holding a run.

Each case runs the script in a process of its own, as a user would (forked from a server
that has imported the library: `tests/script_server.py`), and checks the exact outcome.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from script_server import run_script
from scripts import EXPERIMENTS

from offpolicy_ac import demos as demos_lib
from offpolicy_ac import envs

IMPALA = EXPERIMENTS / "impala.py"

# (script, flags, a fragment of the one error line). `{demos}` is a directory of
# demonstration files (see the `demos` fixture); `{run}` the run directory.
CASES = [
    ("impala", ["--num-envs", "100000", "--total-env-steps", "2048"], "more than the whole budget"),
    ("impala", ["--num-envs", "0"], "--num-envs must be a positive int"),
    ("impala", ["--preset"], "error: argument --preset: expected one argument"),
    ("sql", ["--env-id"], "error: argument --env-id/--env_id: expected one argument"),
    # A learning-rate schedule counts the run's updates: the config is checked first.
    ("impala", ["--anneal-learning-rate", "--unroll-length", "0"], "--unroll-length must be a"),
    ("impala", ["--env-id", "gymnax:CartPole-v1", "--num-envs", "0"], "--num-envs must be a"),
    ("sql", ["--num-envs", "0"], "--num-envs must be a positive int"),
    ("impala", ["--total-env-steps", "-5"], "--total-env-steps must be a positive int"),
    ("impala", ["--seed", "-1"], "error: --seed must be an int >= 0"),
    ("impala", ["--seed", str(2**32)], "error: --seed must be below 2**32, got 4294967296: JAX's"),
    ("impala", ["--seed", str(2**32 - 1), "--num-seeds", "2"], "(the last seed, seed + --num-"),
    ("impala", ["--hidden-sizes", "0"], "--hidden-sizes must be positive ints"),
    ("impala", ["--learning-rate", "nan"], "--learning-rate must be > 0"),
    ("impala", ["--learning-rate", "inf"], "--learning-rate must be finite"),
    ("impala", ["--entropy-weight", "inf"], "--entropy-weight must be finite"),
    ("impala", ["--preset", "pendulum", "--init-log-std", "nan"], "--init-log-std must be finite"),
    ("impala", ["--sweep", "learning_rate=inf,1e-3"], "--learning-rate must be finite"),
    ("impala", ["--resume", "--run-dir", "{run}/missing"], "is not a run directory"),
    ("impala", ["--run-dir", "{demos}/good.npz"], "is a file, not a directory"),
    ("impala", ["--run-dir", ""], "--run-dir is empty: name a directory"),
    (
        "impala",
        ["--resume", "--run-dir", "{demos}", "--checkpoint-every", "0"],
        "--resume needs checkpoints",
    ),
    ("acer", ["--value-weight", "inf"], "--value-weight must be finite"),
    ("acer", ["--replay-ratio", "2147483648"], "--replay-ratio must be below 2**31"),
    ("sql", ["--alpha", "inf"], "alpha must be finite"),
    # Values float32, which the program computes in, would hold as 0 or inf.
    ("sql", ["--alpha", "1e-50"], "--alpha must be at least 1.4013e-45, float32's smallest"),
    ("sql", ["--alpha", "1e39"], "--alpha must be at most 3.40282e+38 in size, float32's"),
    ("acer", ["--preset", "pendulum", "--init-log-std", "50"], "must lie in [-20.0, 20.0]"),
    # An agent's flag is named as such, not as a sweep's setting ("the setting {} is invalid"),
    # even beside a sweep of another field; a swept value at fault is named with its setting.
    ("impala", ["--gamma", "1.5"], "error: --gamma must lie in [0.0, 1.0], got 1.5"),
    ("sql", ["--alpha", "0"], "error: --alpha must be > 0, got 0.0"),
    (
        "impala",
        ["--sweep", "learning_rate=1e-3,3e-3", "--gamma", "1.5"],
        "error: --gamma must lie in [0.0, 1.0], got 1.5",
    ),
    ("impala", ["--sweep", "gamma=0.9,1.5"], "error: the setting {'gamma': 1.5} is invalid: gamma"),
    ("sql", ["--learning-rate-cooldown", "2"], "--learning-rate-cooldown must lie in [0, 1]"),
    ("sqil", ["--demos", "{demos}/good.npz", "--learning-rate-cooldown", "nan"], "must lie in"),
    ("impala", ["--reward-scale", "inf"], "--reward-scale must be finite"),
    ("impala", ["--target-return", "nan"], "--target-return must be finite"),
    ("impala", ["--env-id", "CartPol-v1"], "unknown task id 'CartPol-v1'; did you mean"),
    ("impala", ["--env-id", "gymnax:CartPol-v1"], "did you mean ['CartPole-v1']"),
    ("sql", ["--env-id", "Asterix-MinAtar"], "the JAX environment is 'gymnax:Asterix-MinAtar'"),
    ("impala", ["--preset", "nope"], "--preset nope: choose one of"),
    ("impala", ["--sweep", "no_such_field=1,2"], "no_such_field"),
    ("impala", ["--sweep", "gamma=0.99,0.9999999,1.0"], "would share the directory 'gamma=1'"),
    ("impala", ["--actor-queue-size", "3"], "--actor-queue-size applies to --actors async"),
    (
        "impala",
        ["--actors", "async", "--num-actors", "2", "--grace-period-s", "3"],
        "--grace-period-s applies to --actors pools with --min-pools",
    ),
    ("acer", ["--preset", "pendulum", "--env-id", "CartPole-v1"], "--preset pendulum is made for"),
    ("sql", ["--env-id", "Hopper-v4", "--preset", "cartpole"], "use --preset hopper"),
    ("sql", ["--replay-capacity", "1", "--min-replay-size", "0"], "--replay-capacity (1) holds"),
    ("sql", ["--mini-batch-length", "40"], "longer than"),
    ("sql", ["--gamma", "1.5"], "gamma"),
    ("sqil", ["--demos", "{demos}/missing.npz"], "no demonstration file"),
    ("sqil", ["--demos", "{demos}/array.npy"], "is not a readable demonstration file (an .npz"),
    ("sqil", ["--demos", "{demos}/text.npz"], "is not a readable demonstration file (an .npz"),
    ("sqil", ["--demos", "{demos}/corrupt.npz"], "is not a readable demonstration file"),
    ("sqil", ["--demos", "{demos}/action7.npz"], "actions must lie in [0, 2) for CartPole-v1"),
    ("sqil", ["--demos", "{demos}/obs3.npz"], "observations of shape (3,)"),
    ("sqil", ["--demos", "{demos}/good.npz", "--env-id", "Acrobot-v1"], "--env-id is Acrobot"),
    # An unknown task is refused as such, not as the demonstrations' other task.
    ("sqil", ["--demos", "{demos}/good.npz", "--env-id", "gymnax:Nope-v1"], "unknown task 'Nope"),
    (
        "sqil",
        ["--demos", "{demos}/good.npz", "--unroll-length", "64", "--mini-batch-length", "40",
         "--cut-mode", "drop"],
        "no sequence of 41 steps could be cut with mode 'drop': the longest episode has",
    ),  # fmt: skip
    ("evaluate", ["--run-dir", "{demos}/no-run"], "is not a directory"),
    (
        "evaluate",
        ["--run-dir", "{demos}", "--episodes", "0"],
        "--episodes must be in [1, 1,048,576], got 0",
    ),
    ("evaluate", ["--run-dir", "{demos}"], "is not a run directory (no config.json)"),
    (
        "evaluate",
        ["--run-dir", "{demos}/impala-run/best_at_checkpoint"],
        "is not a run directory (no config.json); it is inside the run in",
    ),
    ("evaluate", ["--run-dir", "{demos}", "--max-steps", "0"], "--max-steps must be >= 1"),
    ("evaluate", ["--run-dir", "{demos}", "--fps", "0"], "--fps must be a number from 0.001"),
    ("evaluate", ["--run-dir", "{demos}", "--fps", "3e9"], "to 1,000,000, got 3000000000.0"),
    ("evaluate", ["--run-dir", "{demos}", "--best", "--checkpoint", "8"], "--best and --checkp"),
    ("record_demos", ["--run-dir", "{demos}", "--out", "x.npz", "--seed", "-1"], "--seed must"),
    ("evaluate", ["--run-dir", "{demos}", "--fps", "60"], "--fps sets the video's frame rate"),
    ("record_demos", ["--run-dir", "{demos}/no-run", "--out", "{demos}/x.npz"], "not a directory"),
    (
        "record_demos",
        ["--run-dir", "{demos}", "--out", "{demos}"],
        "is a directory: give a file path",
    ),
    ("record_demos", ["--run-dir", "{demos}", "--out", "{demos}/good.npz/x.npz"], "is a file"),
    # A folder's path, not yet made: a file of the folder's name was written.
    ("record_demos", ["--run-dir", "{demos}", "--out", "{demos}/new/"], "/new/ names a folder"),
    # A file of another kind given by mistake (it was replaced by the archive, the JSON).
    (
        "record_demos",
        ["--run-dir", "{demos}", "--out", "{demos}/notes.txt"],
        "notes.txt: the file is written as a NumPy .npz archive: give a path ending in .npz",
    ),
    (
        "evaluate",
        ["--run-dir", "{demos}", "--out", "{demos}/notes.txt"],
        "notes.txt: the file is written as JSON: give a path ending in .json",
    ),
    ("evaluate", ["--run-dir", "{demos}", "--out", "{demos}/new/"], "/new/ names a folder"),
    ("evaluate", ["--run-dir", "{demos}", "--video", "{demos}/new/."], "/new/. names a folder"),
    ("record_demos", ["--run-dir", "{demos}", "--out", "x.npz", "--episodes", "0"], "--episodes"),
    (
        "record_demos",
        ["--run-dir", "{demos}", "--out", "x.npz", "--action-box-fraction", "2"],
        "--action-box-fraction must lie in (0, 1]",
    ),
    ("evaluate", ["--run-dir", "{demos}", "--out", "{demos}/good.npz/e.json"], "--out"),
    ("evaluate", ["--run-dir", "{demos}", "--video", "{demos}"], "--video"),
    ("evaluate", ["--run-dir", "{demos}", "--video", "{demos}/v.txt"], "a path ending in .mp4"),
    ("plot", ["{demos}/no-run"], "no-run"),
    ("plot", ["{demos}", ""], "a run directory given is empty: give a path"),
    ("plot", ["{demos}", "--out-dir", " "], "--out-dir is empty: give a path"),
    ("record_demos", ["--run-dir", "", "--out", "x.npz"], "--run-dir is empty: give a path"),
    ("record_demos", ["--run-dir", "{demos}", "--out", ""], "--out is empty: give a path"),
    ("plot", ["{demos}", "--seed", "-1"], "--seed in [0, 2**32)"),
    ("plot", ["{demos}", "--max-points", "1"], "--max-points >= 2"),
    ("plot", ["{demos}", "--reps", "1000000000000"], "--reps in [40, 100,000]"),  # (7 TiB)
    ("plot", ["{demos}", "--out-dir", "{demos}/good.npz/p"], "good.npz is a file, not a direc"),
    (
        "plot",
        ["{demos}", "--out-dir", "{demos}/impala-run/best_at_checkpoint/p"],
        "best_at_checkpoint/p is in a folder of the run in ",
    ),
    ("plot", ["{demos}/damaged"], "config.json is damaged (not valid JSON"),
    ("evaluate", ["--run-dir", "{demos}/damaged"], "config.json is damaged (not valid JSON"),
    ("evaluate", ["--run-dir", "{demos}/binary"], "binary/config.json is damaged (not valid JSON"),
    (
        "impala",
        ["--preset", "gymnax-cartpole", "--env-id", "CartPole-v1"],
        "--preset gymnax-cartpole is made for gymnax:CartPole-v1",
    ),
    ("impala", ["--run-dir", "{demos}/foreign"], "foreign/config.json is not a run's config"),
    ("impala", ["--run-dir", "{demos}/foreign", "--resume"], "is not a run's config.json"),
    ("sql", ["--run-dir", "{demos}/impala-run", "--resume"], "is a run of impala, not of sql"),
    (
        "acer",
        ["--run-dir", "{demos}/impala-seeds", "--resume", "--num-seeds", "2"],
        "is a run of impala, not of acer: resume it with experiments/impala.py",
    ),
    ("impala", ["--preset", "atari", "--env-id", "CartPole-v1"], "made for Atari tasks"),
    ("impala", ["--atari"], "--atari applies to Atari tasks"),
    (
        "acer",
        [
            "--env-id",
            "gymnax:CartPole-v1",
            "--no-use-trust-region",
            "--sweep",
            "trust_region_delta=0.5,1",
        ],
        "--sweep trust_region_delta: the trust region's size",
    ),
    ("sql", ["--env-id", "CarRacing-v2"], "(96, 96, 3) look like [H, W, C]"),
    ("impala", ["--env-id", "Hopper-v4", "--rollout", "compiled"], "use the host backend"),
    (
        "sql",
        ["--total-env-steps", "1024", "--min-replay-size", "1000"],
        "the run would make no update: --total-env-steps 1,024 ends before the replay holds "
        "--min-replay-size (1000) sequences; give at least 8,000 env steps",
    ),
    (
        "sql",
        ["--env-id", "gymnax:CartPole-v1", "--total-env-steps", "512", "--min-replay-size", "999"],
        "the run would make no update",
    ),
    ("sql", ["--env-id", "Hopper-v4", "--rollout", "compiled"], "takes float64 actions"),
    (
        "impala",
        ["--preset", "minatar", "--env-id", "Pong-v5"],
        "not for Pong-v5 (an Atari task); use --preset atari",
    ),
    (
        "impala",
        ["--anneal-learning-rate", "--learning-rate-decay-updates", "100"],
        "--anneal-learning-rate sets --learning-rate-decay-updates from the budget",
    ),
    ("impala", ["--wandb-mode", "offline"], "apply to --track"),
    ("impala", ["--obs-clip", "10"], "--obs-clip 10.0 has no effect in this run: it applies with"),
    ("impala", ["--gamma", "0.5", "--sweep", "gamma=0.9,0.99"], "--gamma 0.5 sets a field --sweep"),
    (
        "impala",
        ["--learning-rate", "0.1", "--sweep", "learning-rate=1e-3,3e-3"],
        "--learning-rate 0.1 sets a field --sweep sweeps",
    ),
    (  # the default's value, given: the sweep replaced it silently
        "impala",
        ["--gamma=0.99", "--sweep", "gamma=0.9,0.99"],
        "--gamma 0.99 sets a field --sweep sweeps: drop --gamma",
    ),
    ("impala", ["--coordinator-address", "localhost:1234"], "applies to a multi-process job"),
    (
        "impala",
        ["--mini-batch-size", "7", "--num-updates-per-train-iter", "5"],
        "--num-updates-per-train-iter, --mini-batch-size: replay settings, and this agent learns "
        "on-policy, with no replay (IMPALA replays with --use-replay)",
    ),
    (
        "sql",
        ["--num-particles", "64"],
        "--num-particles: settings of the continuous agent's sampler",
    ),
    ("sql", ["--lambda", "0.9", "--n-step", "7"], "--n-step 7 has no effect in this run: --lambda"),
    # Typed at the preset's value: refused too (the user believes it applies).
    ("sql", ["--lambda", "0.9", "--n-step", "3"], "--n-step 3 has no effect in this run: --lambda"),
    ("acer", ["--no-use-trust-region", "--avg-decay", "0.99"], "--avg-decay 0.99 has no effect"),
    # A schedule derived from the budget is refused by the flags the user gave.
    (
        "sql",
        ["--total-env-steps", "100000000000000"],
        "100,000,000,000,000: --learning-rate-cooldown",
    ),
    (
        "impala",
        ["--preset", "gymnax-cartpole", "--total-env-steps", "600000000000"],
        "--total-env-steps 600,000,000,000: --anneal-learning-rate anneals the step size over",
    ),
    ("sql", ["--n-step", "50"], "--n-step (50) exceeds --mini-batch-length (4)"),
    ("sqil", ["--demos", "{demos}/good.npz", "--n-step", "50"], "--n-step (50) exceeds"),
    # The flag's own message, not the demonstrations' cut of a window of 1 step.
    (
        "sqil",
        ["--demos", "{demos}/good.npz", "--mini-batch-length", "0"],
        "--mini-batch-length must be a positive int, got 0",
    ),
    ("sql", ["--preset", "pendulum", "--lambda", "0.5", "--n-step", "2"], "--n-step 2 has no"),
    # Off the preset's value (pendulum's n_step is 1, sqil.py's 3), though the config class's
    # default (3 with --lambda is allowed there), and then without effect.
    (
        "sql",
        ["--preset", "pendulum", "--lambda", "0.5", "--n-step", "3"],
        "--n-step 3 has no effect in this run: --lambda > 0 selects the soft lambda-returns",
    ),
    (
        "sqil",
        ["--demos", "{demos}/good.npz", "--lambda", "0.5", "--n-step", "1"],
        "--n-step 1 has no effect in this run: --lambda > 0 selects the soft lambda-returns",
    ),
    (
        "acer",
        ["--no-use-trust-region", "--avg-decay", "0.9"],
        "--avg-decay 0.9 has no effect in this run: the trust region's average network",
    ),
    (
        "impala",
        ["--surrogate-clip", "0.2", "--clip-pg-rho-threshold", "2"],
        "--clip-pg-rho-threshold 2.0 has no effect in this run: the policy gradient's rho clip",
    ),
    # Settings of continuous actions on a discrete task: given, and then without effect.
    ("impala", ["--init-log-std", "-1"], "--init-log-std: settings of continuous actions"),
    ("acer", ["--sdn-samples", "3"], "--sdn-samples: settings of continuous actions, which ACER"),
    ("acer", ["--num-updates-per-train-iter", "1"], "--num-updates-per-train-iter: ACER sets"),
]
TRAINS = ("impala", "acer", "sql", "sqil")


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
  root = tmp_path_factory.mktemp("demos")
  env = envs.make("CartPole-v1", 2, 0)
  recorded = demos_lib.record_episodes(env, lambda obs: np.zeros(len(obs), np.int32), 2)
  env.close()
  save = lambda name, **fields: demos_lib.save_demos(
      root / name, {**recorded, **fields}, env_id="CartPole-v1"
  )
  save("good.npz")
  save("action7.npz", action=np.full_like(recorded["action"], 7))
  save("obs3.npz", observation=recorded["observation"][:, :3])
  (root / "corrupt.npz").write_bytes(b"PK\x03\x04 not a zip file")
  np.save(root / "array.npy", np.zeros(3))
  (root / "damaged").mkdir()
  (root / "damaged" / "config.json").write_text('{"config": {\n')
  (root / "damaged" / "metrics.jsonl").write_text('{"env_steps": 1, "episode_return": 1.0}\n')
  (root / "binary").mkdir()
  (root / "binary" / "config.json").write_bytes(b"\x92\xff\x00{")  # not even UTF-8
  (root / "text.npz").write_text("observation, action\n")
  (root / "foreign").mkdir()  # a project's own files, not a run's
  (root / "foreign" / "config.json").write_text('{"my": "settings"}')
  (root / "impala-run").mkdir()
  (root / "impala-run" / "config.json").write_text('{"algorithm": "impala", "config": {}}')
  (root / "impala-run" / "best_at_checkpoint").mkdir()
  (root / "impala-seeds" / "seed0").mkdir(parents=True)  # seeds run one after the other
  (root / "impala-seeds" / "seed0" / "config.json").write_text(
      '{"algorithm": "impala", "config": {}}'
  )
  return root


@pytest.mark.parametrize("script, flags, fragment", CASES, ids=lambda c: str(c)[:40])
def test_a_bad_command_line_gets_one_line_and_exit_code_2(tmp_path, demos, script, flags,
                                                           fragment):  # fmt: skip
  run_dir = tmp_path / "run"
  flags = [f.format(demos=demos, run=run_dir) for f in flags]
  extra = ["--run-dir", str(run_dir)] if script in TRAINS else []
  proc = run_script(EXPERIMENTS / f"{script}.py", [*extra, *flags])
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert lines[-1].startswith(f"[{script}] error: ") and fragment in lines[-1], lines[-1]
  assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()


def test_resume_with_a_smaller_budget_is_refused_and_leaves_the_config(tmp_path):
  run_dir = tmp_path / "run"
  flags = ["--run-dir", run_dir, "--checkpoint-every", "512", "--log-every", "512"]
  assert run_script(IMPALA, [*flags, "--total-env-steps", "1024"]).returncode == 0
  config = (run_dir / "config.json").read_text()
  proc = run_script(IMPALA, [*flags, "--total-env-steps", "512", "--resume"])
  assert proc.returncode == 2 and "Traceback" not in proc.stderr
  assert "[impala] error: --resume: --total-env-steps 512 is smaller" in proc.stderr
  assert (run_dir / "config.json").read_text() == config
  proc = run_script(IMPALA, [*flags, "--total-env-steps", "1024"])
  assert proc.returncode == 2 and "already holds a run: pass --resume" in proc.stderr
  # Without --total-env-steps, the run's budget (it took the default's, 500,000, and trained).
  proc = run_script(IMPALA, [*flags, "--resume"])
  assert proc.returncode == 0 and "budget grows" not in proc.stdout, proc.stdout
  assert "already used its budget of 1,024 env steps" in proc.stdout
  assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 1024


def test_resume_without_a_run_directory_is_refused_and_creates_nothing(tmp_path):
  proc = run_script(IMPALA, ["--resume"], cwd=tmp_path)
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      "[impala] error: --resume needs --run-dir: the run directory to continue"
  )
  assert list(tmp_path.iterdir()) == []


def test_a_refused_run_leaves_no_default_run_directory(tmp_path):
  """Refused after its default directory was made (the agent's settings are checked as
  the program is built): the empty directory goes again."""
  proc = run_script(IMPALA, ["--learning-rate", "inf"], cwd=tmp_path)
  assert proc.returncode == 2 and "--learning-rate must be finite" in proc.stderr, proc.stderr
  assert list((tmp_path / "runs").iterdir()) == []
  (tmp_path / "runs").rmdir()
  (tmp_path / "runs").write_text("")  # ./runs is a file: no default run directory
  proc = run_script(IMPALA, [], cwd=tmp_path)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "the default run directory cannot be made in ./runs" in proc.stderr


def test_track_without_wandb_installed_is_one_line(tmp_path):
  """Run by `python` itself (as the cases above are with OFFPOLICY_AC_TEST_FRESH_PROCESSES=1):
  wandb's stand-in must be on the path before anything is imported."""
  shim = tmp_path / "shim" / "wandb"  # wandb as it imports where it is not installed
  shim.mkdir(parents=True)
  (shim / "__init__.py").write_text('raise ModuleNotFoundError("No module named wandb")\n')
  proc = subprocess.run([sys.executable, str(IMPALA), "--track", "--run-dir",
                         str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                        env={**os.environ, "PYTHONPATH": str(shim.parent)})  # fmt: skip
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert (
      proc.stderr.strip()
      .splitlines()[-1]
      .startswith("[impala] error: --track (Weights & Biases logging) needs wandb")
  )


def test_a_run_directory_checkpoints_cannot_be_written_in_is_refused_at_once(tmp_path):
  """A name that is not UTF-8 (a Latin-1 folder) or a path too long for the run's files:
  orbax would fail only at the first checkpoint, after training."""
  from script_server import run_fresh

  latin1 = os.fsdecode(b"caf\xe9")
  proc = run_fresh(IMPALA, ["--run-dir", latin1], cwd=tmp_path)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "is not valid UTF-8 text in this locale" in proc.stderr.splitlines()[-1]
  deep = "/".join(["d" * 200] * 20)  # 4,019 bytes, under PATH_MAX itself
  proc = run_fresh(IMPALA, ["--run-dir", deep], cwd=tmp_path)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert "choose a shorter path" in proc.stderr.splitlines()[-1]
  assert list(tmp_path.iterdir()) == []
  # A link to a folder not made yet (storage not mounted), given or above the run directory.
  (tmp_path / "link").symlink_to(tmp_path / "storage" / "runs")
  for run_dir in ("link", "link/run"):
    proc = run_fresh(IMPALA, ["--run-dir", run_dir], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == (
        f"[impala] error: --run-dir {run_dir}: {tmp_path / 'link'} is a link to "
        f"{tmp_path / 'storage' / 'runs'}, which does not exist: make that directory, or "
        "choose another --run-dir"
    )
  assert [p.name for p in tmp_path.iterdir()] == ["link"]


@pytest.mark.parametrize("platforms", ["cuda", "nope"])
def test_a_backend_jax_cannot_start_is_one_line(tmp_path, platforms):
  proc = subprocess.run([sys.executable, str(IMPALA), "--run-dir", str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=300,
                        env={**os.environ, "JAX_PLATFORMS": platforms})  # fmt: skip
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert (
      proc.stderr.strip()
      .splitlines()[-1]
      .startswith(f"[impala] error: JAX cannot start the backend '{platforms}' (JAX_PLATFORMS)")
  )
  assert not (tmp_path / "run").exists()


def test_resume_under_another_jax_enable_x64_is_refused(tmp_path):
  """float64 intermediates give other numbers: the resumed run would not be the run."""
  run_dir = tmp_path / "run"
  flags = [str(IMPALA), "--run-dir", str(run_dir), "--checkpoint-every", "512",
           "--log-every", "512"]  # fmt: skip

  def run(steps, x64, *extra):
    env = {**os.environ, "JAX_ENABLE_X64": x64}
    return subprocess.run([sys.executable, *flags, "--total-env-steps", steps, *extra],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip

  assert run("1024", "1").returncode == 0
  assert json.loads((run_dir / "config.json").read_text())["jax_enable_x64"] is True
  proc = run("2048", "0", "--resume")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      "[impala] error: --resume: the run was made with jax_enable_x64 True (JAX_ENABLE_X64), "
      "and this process has it False: the resumed run would not continue as the run would "
      "have; resume with the run's setting"
  )
  assert run("2048", "1", "--resume").returncode == 0
