"""Benchmark scripts refuse bad arguments before any work, naming them: in-process a
ValueError, from the command line one line and exit code 2."""

import os

import pytest
from script_server import run_script
from scripts import EXPERIMENTS
from scripts import load_script


@pytest.mark.parametrize(
    "script, fields, message",
    [
        ("bench_replay", {"repeats": 0}, "--repeats must be >= 1"),
        ("bench_losses", {"shapes": ("128",)}, "--shapes takes TxB sizes"),
        ("bench_losses", {"rounds": 0}, "--repeats, --rounds and --num-actions must be >= 1"),
        ("bench_faults", {"faults": ("nope",)}, r"unknown --faults \['nope'\]; the faults: "),
        ("bench_faults", {"tries": 0}, "--tries must be >= 1"),
        ("bench_seeds", {"num_seeds": 1}, "--num-seeds must be >= 2"),
    ],
)
def test_bench_refuses_bad_arguments(script, fields, message):
  bench = load_script(script)
  with pytest.raises(ValueError, match=message):
    bench.main(bench.Args(**fields))


def test_bench_agents_refuses_a_folder_holding_its_runs(tmp_path):
  (tmp_path / "sql-v1-seed3").mkdir()
  bench = load_script("bench_agents")
  with pytest.raises(ValueError, match="already holds sql-v1-seed3: choose another --out-dir"):
    bench.main(bench.Args(algorithms=("sql",), cases=("v1",), seeds=(3,), out_dir=str(tmp_path)))


def test_bench_seeds_checks_its_runs_before_the_first(tmp_path):
  bench = load_script("bench_seeds")
  with pytest.raises(ValueError, match=r"^impala.py --env-id CartPole-v1 --num-seeds 2 "
                     r"--total-env-steps 8 .*: one iteration takes 256 env steps"):  # fmt: skip
    bench.main(bench.Args(num_seeds=2, total_env_steps=8, repeats=1))


_NOT_AS_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="as root the full disk runs")

# (script, flags, a fragment of the one error line); `{file}` is a file (not a directory).
COMMAND_LINES = [
    ("bench_seeds", ["--num-seeds", "1"], "--num-seeds must be >= 2"),
    ("bench_seeds", ["--out", "{file}/seeds.txt"], "is a file, not a directory"),
    # A file of another kind given by mistake was replaced by the report.
    ("bench_seeds", ["--out", "README.md"], "--out README.md: the file is written as text: "
                                            "give a path ending in .txt"),
    ("bench_replay", ["--repeats", "0"], "--repeats must be >= 1"),
    ("bench_sql_update", ["--num-q-networks"], "--num-q-networks needs at least one"),
    ("bench_sql_update", ["--num-q-networks", "0"], "--num-q-networks must be an int >= 1"),
    ("bench_sql_update", ["--hidden-sizes", "0"], "--hidden-sizes must be positive ints"),
    ("bench_sql_update", ["--windows", "0"], "windows must be at least 1"),
    ("bench_conv", ["--loop-length", "0"], "--loop-length must be at least 1, got 0"),
    ("bench_conv", ["--frames", "8", "--acting-envs", "9"], "--acting-envs (9) must be at most"),
    ("bench_conv", ["--torso", "mlp"], "--torso must be one of nature_cnn, small_cnn, impala"),
    ("bench_mujoco", ["--tasks", "Hopper-v4", "Humanoid-v4"], "no preset for Humanoid-v4"),
    ("bench_mujoco", ["--repeats", "0"], "--repeats must be >= 1"),
    ("bench_mujoco", ["--raw-seconds", "-1"], "--raw-seconds must be > 0"),
    ("bench_mujoco", ["--env-steps", "100"], "impala on HalfCheetah-v4, 100 env steps: one"),
    ("bench_defaults", ["--episodes", "0"], "--episodes must be >= 1"),
    ("bench_defaults", ["--num-seeds", "0"], "--num-seeds must be >= 1"),
    ("bench_defaults", ["--total-env-steps", "0"], "--total-env-steps must be >= 1"),
    ("bench_defaults", ["--cases", "impala", "acer", "impala"], "names ['impala'] twice"),
    ("bench_defaults", ["--out-dir", "{file}"], "is a file, not a directory"),
    ("bench_defaults", ["--cases", "sql", "impala-minatar-spaceinvaders", "--total-env-steps",
                        "300"], "one iteration takes 1,024 env steps"),
    ("bench_agents", ["--seeds"], "--seeds needs at least one value, each once"),
    ("bench_agents", ["--seeds", "1", "1"], "--seeds needs at least one value, each once"),
    ("bench_agents", ["--max-steps-v0", "0"], "--max-steps-v0 must be >= 1"),
    ("bench_agents", ["--out-dir", "{file}/agents"], "is a file, not a directory"),
    ("bench_agents", ["--algorithms", "impala", "--max-steps-v0", "10"],
     "impala.py --env-id CartPole-v0 --eval-episodes 5 --eval-every 500 --target-return 195 "
     "--total-env-steps 10: one iteration takes 256 env steps"),
    ("bench_agents", ["--cases", "v1", "--expert-steps", "10"],
     "sql.py --env-id CartPole-v1 --total-env-steps 10: one iteration takes 32 env steps"),
    ("bench_seeds", ["--total-env-steps", "8"], "one iteration takes 256 env steps"),
    ("bench_launch", ["--flags=--nope=1"], "--nope=1: Unrecognized options: --nope=1"),
    ("bench_launch", ["--flags=--total-env-steps=10"], "one iteration takes 256 env steps"),
    ("bench_anakin", ["--steps-per-measurement", "-5"], "--steps-per-measurement must be >= 1"),
    ("bench_anakin", ["--repeats", "0"], "--repeats must be >= 1"),
    ("bench_anakin", ["--seeds"], "--seeds must be positive counts"),
    ("bench_anakin", ["--env-id", "CartPole-v1"], "--env-id must name a JAX environment"),
    ("bench_anakin", ["--out", "{file}/anakin.json"], "is a file, not a directory"),
    ("bench_anakin", ["--out", "pyproject.toml"], "--out pyproject.toml: the file is written as "
                                                  "JSON: give a path ending in .json"),
    ("bench_envs", ["--repeats", "0"], "--repeats must be >= 1"),
    ("bench_envs", ["--cartpole-seconds", "-1"], "--cartpole-seconds must be > 0"),
    ("bench_envs", ["--unroll-length", "0"], "--unroll-length must be >= 1"),
    # Its "batched" row stepped a batch of 1 of 1 environment: the sync mode, mislabelled.
    ("bench_envs", ["--cartpole-envs", "1"], "--cartpole-envs 1: batched stepping steps half"),
    ("bench_losses", ["--num-actions", "0"], "--num-actions must be >= 1"),
    ("bench_losses", ["--json-out", "{file}/losses.json"], "is a file, not a directory"),
    ("bench_losses", ["--json-out", "README.md"], "--json-out README.md: the file is written as "
                                                  "JSON: give a path ending in .json"),
    # No names typed ran the whole campaign, all its faults (about half an hour).
    ("bench_faults", ["--faults"], "--faults needs at least one name (leave the flag out for all)"),
    ("bench_async", ["--raw-seconds", "-1"], "--raw-seconds must be > 0"),
    ("bench_async", ["--probe-seconds", "-1"], "--probe-seconds must be > 0"),
    ("bench_async", ["--cartpole-steps", "100"], "CartPole-v1, sync: one iteration takes 256"),
    ("bench_async", ["--env-batch-size", "40"], "--env-batch-size (40) exceeds num_envs (16)"),
    ("bench_async", ["--cartpole-steps", "768"], "not 3 iterations of 512"),
    ("bench_async", ["--out", "{file}/async"], "is a file, not a directory"),
    ("bench_async", ["--tasks", "Pong-v5", "--pong-torso", "foo"], "Pong-v5: unknown torso 'foo'"),
    (
        "bench_mujoco",
        ["--agents", "impala", "--tasks", "Hopper-v4", "--env-steps", "1000"],
        "1,000 env steps are 2 iteration(s) of its preset (512 env steps each), short of the 3",
    ),
    ("demo_targets", ["--alpha", "0"], "--alpha must be a finite number > 0, got 0.0"),
    ("demo_targets", ["--gamma", "1.5"], "--gamma must lie in [0, 1], got 1.5"),
    ("bench_launch", ["--timeout-s", "-1"], "--timeout-s must be > 0"),
    ("bench_launch", ["--out-dir", "{file}/launch"], "is a file, not a directory"),
    ("bench_faults", ["--tries", "0"], "--tries must be >= 1"),
    ("bench_faults", ["--out", "{file}/campaign"], "is a file, not a directory"),
    pytest.param("bench_faults", ["--faults", "a full disk (tmpfs)"], "needs root",
                 marks=_NOT_AS_ROOT),  # fmt: skip
]


@pytest.mark.parametrize("script, flags, fragment", COMMAND_LINES, ids=lambda c: str(c)[:40])
def test_a_bad_bench_command_line_gets_one_line_and_exit_code_2(tmp_path, script, flags,
                                                                fragment):  # fmt: skip
  """Refused before any work: nothing is written (default output folders are relative to
  the working directory, here `tmp_path`)."""
  (tmp_path / "file").write_text("")
  flags = [f.format(file=tmp_path / "file") for f in flags]
  proc = run_script(EXPERIMENTS / f"{script}.py", flags, cwd=tmp_path)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert lines[-1].startswith(f"[{script}] error: ") and fragment in lines[-1], lines[-1]
  assert [p.name for p in tmp_path.iterdir()] == ["file"]
