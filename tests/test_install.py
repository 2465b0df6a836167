"""Every install path works on a fresh machine: each extra installed alone.

Each case copies the working tree (the files a clone holds) to a fresh directory, makes a
fresh virtual environment there (`python -m venv .venv`, no system site-packages), installs
the package with one extra alone (`.venv/bin/pip install -e ".[extra]"`, plain pip with its
cache) and runs one thing the extra is for with that environment's Python:

* `.` (no extra): the README's main command, shortened; the README's gymnax sweep fails
  naming `pip install 'offpolicy_ac[jax-envs]'`; the testing kit's checks name
  `pip install 'offpolicy_ac[testing]'`, and that command, run as given, makes them work.
* `testing`, installed by that command on top of `.` (what `pip install -e ".[testing]"`
  installs): chex checks of `offpolicy_ac.testing` on the library's V-trace, and on a
  hypothesis-drawn trajectory.
* `jax-envs`: the README walkthrough's last line (the compiled gymnax sweep), shortened as
  tests/test_readme.py shortens it, and a brax environment.
* `track`: a short run with `--track` in W&B's offline mode.
* `docs`: `mkdocs build --strict`.
* `cuda`, `cuda13`: `pip install --dry-run` resolves (no GPU needed, nothing installed).

All are marked `install` (`pytest -m install` runs them all; a case takes 1 to 3 minutes
on 2 CPU cores, most of it pip's); the ones CI leaves out (track, docs, cuda) are also
marked `slow`, so the README's test command (`-m "not slow"`) runs `.` with `testing`, and
`jax-envs`.
"""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from test_readme import block
from test_readme import shortened

ROOT = pathlib.Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
PYTHON = ".venv/bin/python"
INSTALL_TIMEOUT_S = 1200


def _env(**extra: str) -> dict[str, str]:
  """This process's environment without what points at its own virtual environment."""
  env = {
      k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
  }
  return {**env, **extra}


def _run(argv, cwd, *, ok=True, timeout=600, env=None) -> subprocess.CompletedProcess:
  start = time.monotonic()
  proc = subprocess.run(
      argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env or _env()
  )
  print(f"{time.monotonic() - start:6.1f} s  {shlex.join(map(str, argv))[:120]}")  # with -s
  if ok:
    assert proc.returncode == 0, (
        f"{shlex.join(map(str, argv))} exited {proc.returncode}\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )
  return proc


def _clone(dest: pathlib.Path) -> pathlib.Path:
  """The working tree's files that git tracks or would track (new files it does not
  ignore), copied to `dest`: what a fresh clone holds, with this tree's changes."""
  listed = _run(["git", "ls-files", "-z", "-co", "--exclude-standard"], ROOT).stdout
  for name in filter(None, listed.split("\0")):
    src = ROOT / name
    if src.is_file() or src.is_symlink():  # a tracked file deleted here is skipped
      (dest / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dest / name, follow_symlinks=False)
  return dest


def _fresh_install(tmp_path: pathlib.Path, *pip_args: str) -> pathlib.Path:
  """A clone with `.venv` made by `python -m venv` and `.venv/bin/pip install *pip_args`."""
  repo = _clone(tmp_path / "offpolicy_ac")
  _run([sys.executable, "-m", "venv", ".venv"], repo)
  _run([".venv/bin/pip", "install", *pip_args], repo, timeout=INSTALL_TIMEOUT_S)
  return repo


def _python(repo: pathlib.Path, code: str, **kwargs) -> subprocess.CompletedProcess:
  return _run([PYTHON, "-c", textwrap.dedent(code)], repo, **kwargs)


def _walkthrough_line(repo: pathlib.Path, line: str, **kwargs) -> subprocess.CompletedProcess:
  """A README walkthrough line run in the clone by its `.venv`, budgets shortened as in
  tests/test_readme.py."""
  argv = shlex.split(line)
  return _run([PYTHON, argv[1], *shortened(argv)[2:]], repo, **kwargs)


def _gymnax_sweep() -> str:
  line = block("walkthrough", "bash").strip().splitlines()[-1]
  assert "--preset gymnax-cartpole" in line and "--sweep" in line, line
  return line


# The chex checks on the library's V-trace, on one of the default examples (T=9, no batch
# axes: every segment shape compiles once per variant); then the same check on a target
# that ignores the mask, which must fail (the checks really compare). That target is
# jitted: called eagerly, V-trace itself refuses the garbage discounts of the masked steps
# once no mask says they are not real.
TESTING_CHECKS = """
    import jax
    import jax.numpy as jnp
    from offpolicy_ac import losses, testing

    def vtrace(tr, masked=True):
      return losses.vtrace(tr.v_tm1, tr.v_t, tr.r_t, tr.discount_t, jnp.exp(tr.log_rho_tm1),
                           mask=tr.mask if masked else None)

    example = testing.default_examples()[:1]
    testing.assert_junction_split_invariant(vtrace, example)
    testing.assert_masked_steps_ignored(vtrace, example)
    try:
      unmasked = jax.jit(lambda tr: vtrace(tr, masked=False))
      testing.assert_junction_split_invariant(unmasked, example)
    except AssertionError:
      print("checks ok")
"""

# The same check on trajectories hypothesis draws (`offpolicy_ac.testing.strategies`).
TESTING_STRATEGIES = """
    from hypothesis import given, settings
    from offpolicy_ac.testing import strategies

    @settings(max_examples=3, deadline=None, database=None)
    @given(strategies.trajectories(batch_shape=()))
    def check(traj):
      testing.assert_junction_split_invariant(vtrace, traj, variants=("without_jit",))

    check()
    print("strategies ok")
"""


def _readme_has(command: str) -> None:
  assert command in README, f"the README does not give {command!r}"


@pytest.mark.install
def test_base_install_runs_and_names_the_extras(tmp_path):
  main = block("main-command", "bash").strip()
  install, train = main.rsplit(" && ", 1)
  assert install == "python3 -m venv .venv && .venv/bin/pip install -e .", main
  repo = _fresh_install(tmp_path, "-e", ".")
  _walkthrough_line(repo, train)
  (run_dir,) = (repo / "runs").glob("impala-CartPole-v1-seed0-*")
  assert (run_dir / "metrics.jsonl").stat().st_size > 0
  # Without jax-envs, the README's gymnax sweep stops naming the command that installs it.
  proc = _walkthrough_line(repo, _gymnax_sweep(), ok=False)
  assert proc.returncode == 2  # one line, as any refusal before the run
  assert proc.stderr.strip().splitlines()[-1] == (
      "[impala] error: gymnax:CartPole-v1 needs gymnax, which is not installed: "
      "pip install 'offpolicy_ac[jax-envs]'"
  ), proc.stderr[-3000:]
  # Without testing, the checks name its command; that command, run as given, fixes it.
  proc = _python(repo, TESTING_CHECKS, ok=False)
  fix = re.search(r"needs chex, which is not installed: (pip install .*)$", proc.stderr, re.M)
  assert proc.returncode != 0 and fix, proc.stderr[-3000:]
  pip, *args = shlex.split(fix.group(1))
  assert pip == "pip" and args == ["install", "offpolicy_ac[testing]"], fix.group(1)
  _readme_has('pip install -e ".[testing]"')
  _run([".venv/bin/pip", *args], repo, timeout=INSTALL_TIMEOUT_S)
  out = _python(repo, textwrap.dedent(TESTING_CHECKS) + textwrap.dedent(TESTING_STRATEGIES))
  assert out.stdout.split() == ["checks", "ok", "strategies", "ok"], out.stdout


@pytest.mark.install
def test_jax_envs_alone_runs_the_readme_gymnax_sweep_and_brax(tmp_path):
  # The walkthrough installs the extra before its gymnax sweep, with this command.
  assert '.venv/bin/pip install -e ".[jax-envs]"' in block("walkthrough", "bash")
  repo = _fresh_install(tmp_path, "-e", ".[jax-envs]")
  _walkthrough_line(repo, _gymnax_sweep())
  sweep = repo / "runs" / "impala-sweep"
  for lr in ("0.001", "0.003"):
    for seed in range(2):
      assert (sweep / f"learning_rate={lr}" / f"seed{seed}" / "metrics.jsonl").is_file()
  assert (sweep / "gymnax_CartPole-v1.png").is_file()
  out = _python(
      repo,
      """
      import jax
      from offpolicy_ac import envs
      env = envs.make_functional("brax:inverted_pendulum")
      state, ts = jax.jit(env.reset)(jax.random.PRNGKey(0))
      print(ts.observation.shape)
      """,
  )
  assert out.stdout.strip().splitlines()[-1] == "(4,)", out.stdout  # brax prints above it


@pytest.mark.install
@pytest.mark.slow
def test_track_alone_logs_a_run_offline(tmp_path):
  repo = _fresh_install(tmp_path, "-e", ".[track]")
  wandb_dir = tmp_path / "wandb-files"
  wandb_dir.mkdir()
  env = _env(WANDB_MODE="offline", WANDB_DIR=str(wandb_dir), WANDB_SILENT="true")
  line = (
      ".venv/bin/python experiments/impala.py --track --wandb-mode offline --run-dir runs/tracked"
  )
  _walkthrough_line(repo, line, env=env)
  assert (repo / "runs" / "tracked" / "wandb.json").is_file()
  assert list(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))


@pytest.mark.install
@pytest.mark.slow
def test_docs_alone_builds_the_site_strictly(tmp_path):
  repo = _fresh_install(tmp_path, "-e", ".[docs]")
  _run([".venv/bin/mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")], repo)
  assert (tmp_path / "site" / "index.html").is_file()


@pytest.mark.install
@pytest.mark.slow
@pytest.mark.parametrize("extra, plugin", [("cuda", "jax-cuda12-plugin"),
                                           ("cuda13", "jax-cuda13-plugin")])  # fmt: skip
def test_gpu_extra_resolves(tmp_path, extra, plugin):
  """The extra resolves, with jax's CUDA plugin in what pip would install. The venv's pip
  is upgraded first: a current pip resolves from the wheels' metadata alone (PEP 658),
  where the pip `venv` bundles with Python 3.11 downloads the CUDA wheels (about 3 GB)."""
  _readme_has(f'".[{extra}]"')
  repo = _clone(tmp_path / "offpolicy_ac")
  _run([sys.executable, "-m", "venv", ".venv"], repo)
  _run([".venv/bin/pip", "install", "-U", "pip"], repo, timeout=INSTALL_TIMEOUT_S)
  proc = _run(
      [".venv/bin/pip", "install", "--dry-run", "-e", f".[{extra}]"],
      repo,
      timeout=INSTALL_TIMEOUT_S,
  )
  (would,) = [line for line in proc.stdout.splitlines() if line.startswith("Would install")]
  assert plugin in would, would
