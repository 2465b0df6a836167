"""The forked runs of `script_server` give what `python <script>` gives: exit code, stdout
and stderr, for refusals, help, crashes, exits, signals and what a script sees of its
process (its name, argv, working directory, import path and empty stdin)."""

import subprocess

import pytest
from script_server import run_forked
from script_server import run_fresh
from scripts import EXPERIMENTS

SEES = """
import os, sys
print(__name__, sys.argv[1:], os.getcwd(), sys.path[0], repr(sys.stdin.read()))
print("to stderr", end="", file=sys.stderr)
"""
ENDINGS = {
    "raises": "def f():\n  raise ValueError('bad value')\nf()\n",
    "exits_with_a_message": "import sys\nprint('out')\nsys.exit('a message')\n",
    "exits_3": "import sys\nsys.exit(3)\n",
    "is_killed": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "is_interrupted": "raise KeyboardInterrupt\n",
}


def _same(script, args, cwd):
  fresh, forked = run_fresh(script, args, cwd), run_forked(script, args, cwd)
  assert (forked.returncode, forked.stdout, forked.stderr) == (
      fresh.returncode,
      fresh.stdout,
      fresh.stderr,
  )
  return forked


@pytest.mark.parametrize("script, args, returncode", [
    ("impala", ["--num-envs", "0"], 2),
    ("sql", ["--env-id", "Asterix-MinAtar"], 2),
    ("impala", ["--help"], 0),
    ("bench_replay", ["--repeats", "0"], 2),
])  # fmt: skip
def test_an_experiment_script_gives_what_python_gives(tmp_path, script, args, returncode):
  assert _same(EXPERIMENTS / f"{script}.py", args, tmp_path).returncode == returncode


def test_a_script_sees_the_process_python_gives_it(tmp_path):
  (tmp_path / "code").mkdir()
  (tmp_path / "code" / "sees.py").write_text(SEES)
  forked = _same(tmp_path / "code" / "sees.py", ["a", "--b"], tmp_path)
  assert forked.stdout.startswith(f"__main__ ['a', '--b'] {tmp_path} {tmp_path / 'code'} ''")


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_script_ends_as_python_ends_it(tmp_path, ending):
  (tmp_path / f"{ending}.py").write_text(ENDINGS[ending])
  forked = _same(tmp_path / f"{ending}.py", [], tmp_path)
  assert forked.returncode != 0


def test_a_script_past_its_time_is_killed_and_the_next_one_runs(tmp_path):
  (tmp_path / "sleeps.py").write_text("import time\ntime.sleep(60)\n")
  with pytest.raises(subprocess.TimeoutExpired):
    run_forked(tmp_path / "sleeps.py", [], tmp_path, timeout=1)
  _same(EXPERIMENTS / "impala.py", ["--num-envs", "0"], tmp_path)
