"""The README's commands run as written, in order, with shortened budgets.

The walkthrough block (between the `<!-- walkthrough -->` markers) runs line by line in a
fresh directory, each command in its own process, with the training budgets divided by
`SHRINK` (or a small budget added where a command sets none); its install lines (an extra
on top of the main command's install) are checked, not run: the test environment has every
extra, and tests/test_install.py installs them from scratch. The Python example runs with
its budgets shortened the same way. The install commands are what `.ci/run` executes.
"""

import json
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
TRAINING_SCRIPTS = {"impala.py", "acer.py", "sql.py", "sqil.py"}
SHRINK = 50
DEFAULT_BUDGET = 2_000
# Shorter evaluations than the README's: the commands, flags and files are what is tested.
SHORTER = {"--episodes": "2", "--eval-episodes": "2"}


def block(marker: str, language: str) -> str:
  """The fenced code block between `<!-- marker -->` and `<!-- /marker -->`."""
  section = re.search(rf"<!-- {marker} -->(.*?)<!-- /{marker} -->", README, re.S)
  assert section, f"README.md has no <!-- {marker} --> section"
  code = re.search(rf"```{language}\n(.*?)```", section.group(1), re.S)
  assert code, f"the {marker} section has no ```{language} block"
  return code.group(1)


def python_block(title: str) -> str:
  """The first ```python block after the heading `title`."""
  section = README.split(f"## {title}\n", 1)[1]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def shortened(argv: list[str]) -> list[str]:
  """A walkthrough command with shortened budgets, run by this interpreter from the repo."""
  assert argv[0] == ".venv/bin/python" and argv[1].startswith("experiments/"), argv
  script = argv[1].removeprefix("experiments/")
  args = list(argv[2:])
  for flag, value in SHORTER.items():
    if flag in args:
      args[args.index(flag) + 1] = value
  if script in TRAINING_SCRIPTS:
    if "--total-env-steps" in args:
      i = args.index("--total-env-steps") + 1
      args[i] = str(int(args[i]) // SHRINK)
    else:
      args += ["--total-env-steps", str(DEFAULT_BUDGET)]
    args += ["--eval-every", "1000", "--eval-episodes", "2", "--log-every", "500"]
  return [sys.executable, str(ROOT / "experiments" / script), *args]


def run(argv: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
  proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, (
      f"{shlex.join(argv)} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
      f"stderr:\n{proc.stderr[-3000:]}"
  )
  return proc


def test_install_commands_are_what_ci_runs():
  main = block("main-command", "bash").strip()
  tests = block("test-command", "bash").strip()
  assert main.startswith("python3 -m venv .venv && .venv/bin/pip install -e .")
  assert main.endswith(".venv/bin/python experiments/impala.py")
  assert '.venv/bin/pip install -e ".[dev]"' in tests
  for check in ("ruff check .", "pyink --check .", "mkdocs build --strict", 'pytest -m "not slow"'):
    assert check in tests
  assert "test-command" in (ROOT / ".ci" / "run").read_text()


EXTRA_INSTALL = re.compile(r'\.venv/bin/pip install -e "\.\[([a-z0-9-]+)\]"')
"""A walkthrough line that installs an extra on top of the main command's install."""


def test_walkthrough_runs_in_order(tmp_path):
  lines = [line for line in block("walkthrough", "bash").splitlines() if line.strip()]
  assert len(lines) >= 8
  installed = set()
  for line in lines:
    if extra := EXTRA_INSTALL.fullmatch(line):
      installed.add(extra.group(1))
      continue
    # A line with a JAX environment comes after the line that installs them (a fresh
    # install has only the main command's packages).
    if "gymnax" in line or "brax" in line:
      assert "jax-envs" in installed, f"{line!r} runs before the jax-envs extra is installed"
    run(shortened(shlex.split(line)), tmp_path)
  runs = tmp_path / "runs"
  for name in ("sql-cartpole", "sqil-cartpole", "acer-pendulum"):
    assert (runs / name / "config.json").is_file(), name
    assert (runs / name / "metrics.jsonl").stat().st_size > 0, name
  for seed in range(3):
    assert (runs / "impala-cartpole" / f"seed{seed}" / "metrics.jsonl").is_file()
  for lr in ("0.001", "0.003"):  # the compiled sweep: one directory per setting and seed
    for seed in range(2):
      assert (
          runs / "impala-sweep" / f"learning_rate={lr}" / f"seed{seed}" / "metrics.jsonl"
      ).is_file()
  assert (runs / "impala-sweep" / "gymnax_CartPole-v1.png").is_file()
  assert (tmp_path / "sql.mp4").stat().st_size > 0
  assert (tmp_path / "demos.npz").stat().st_size > 0
  assert (tmp_path / "plots" / "CartPole-v1.png").stat().st_size > 0
  # The resumed ACER run went on to its larger budget.
  steps = [
      int(m)
      for m in re.findall(
          r'"env_steps": (\d+)', (runs / "acer-pendulum" / "metrics.jsonl").read_text()
      )
  ]
  assert max(steps) >= 200_000 // SHRINK


def test_python_example_runs(tmp_path):
  """The README's Python example writes the run directory the script writes, and
  load_run opens it (its best parameters)."""
  code = python_block("From Python")
  assert code.count("20_000") == 1
  code = code.replace("20_000", "10_240")  # evaluations at 5,120 and 10,240
  proc = run([sys.executable, "-c", code], tmp_path)
  env_steps, best_eval, source = proc.stdout.split()[-3:]
  assert int(env_steps) == 10_240 and float(best_eval) > 0 and source == "best"
  run_dir = tmp_path / "runs" / "from-python"
  for name in ("config.json", "metrics.jsonl", "final_params.msgpack", "best_params.msgpack",
               "summary.json"):  # fmt: skip
    assert (run_dir / name).is_file(), name
  config = json.loads((run_dir / "config.json").read_text())
  assert (
      config["algorithm"] == "impala"
      and config["config"]["train"]["transform"]["reward_scale"] == 0.1
  )  # the script's default, not TrainConfig()'s 1.0


def test_readme_links_point_at_files():
  links = re.findall(r"\]\(([^)#]+)\)", README)
  local = [link for link in links if not link.startswith(("http://", "https://"))]
  assert "docs/benchmarks.md" in local and "LICENSE" in local
  assert [link for link in local if not (ROOT / link).exists()] == []
