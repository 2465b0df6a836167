"""A fault campaign: faults and bad inputs against CartPole runs, and whether each held.

    python experiments/bench_faults.py                     # every fault, the default tries
    python experiments/bench_faults.py --tries 3 --out results/faults/campaign

Each try runs experiments/impala.py in subprocesses as a user would (CartPole-v1, 6,400
env steps, a checkpoint every 1,280) and injects one fault. It *held* when the outcome is
the promised one:

* kill -9 (at a random moment, or while a checkpoint is being written), SIGTERM, SIGINT,
  a flipped byte in the newest checkpoint, a full disk (a small tmpfs: as root only,
  skipped otherwise): after
  `--resume` the run's metrics.jsonl (all but the wall-clock fields) and final parameters
  equal the uninterrupted run's, byte for byte;
* a second process on the run directory, or a `--resume` while the run goes on: refused
  with exit code 2 naming the holder, and the first run ends as the uninterrupted one;
* a flipped byte in final_params.msgpack: `evaluate.py` never plays it: it warns and
  evaluates the newest intact checkpoint instead (the same parameters at the end of a run);
* a NaN reward from the environment: the run stops naming it, no checkpoint holds it, and
  the resumed run (without the NaN) equals the uninterrupted one;
* a bad command line (10 of the cases of tests/experiments/test_bad_inputs.py): exit
  code 2, one line, no traceback.

Prints `fault | tries | held` (a fault skipped here says why); `--out PATH` also writes
PATH.txt and PATH.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable
from typing import Optional

from offpolicy_ac.cli import check_output_file
from offpolicy_ac.cli import parse_plain
from offpolicy_ac.cli import script_main
from offpolicy_ac.training import refusals

ROOT = pathlib.Path(__file__).parents[1]
FLAGS = ["--checkpoint-every", "1280", "--log-every", "640", "--eval-every", "1280",
         "--eval-episodes", "2", "--total-env-steps", "6400"]  # fmt: skip
WALL_CLOCK = ("wall_time_s", "env_steps_per_s")
FULL_DISK = "a full disk (tmpfs)"
"""The fault that needs root (it mounts a tmpfs): skipped without."""


@dataclasses.dataclass(frozen=True)
class Args:
  tries: int = 5
  """Tries of each fault (kill -9 at a random moment: twice as many)."""
  seed: int = 0
  """Seeds the random moments and bytes."""
  faults: Optional[tuple[str, ...]] = None
  """Only these faults (names as printed); default: all."""
  out: Optional[str] = None
  """Also write the table to OUT.txt and every try to OUT.json."""


def _cmd(run_dir: pathlib.Path, *extra: str) -> list[str]:
  return [sys.executable, str(ROOT / "experiments" / "impala.py"), "--run-dir", str(run_dir),
          *FLAGS, *extra]  # fmt: skip


def _run(run_dir: pathlib.Path, *extra: str) -> subprocess.CompletedProcess:
  return subprocess.run(_cmd(run_dir, *extra), capture_output=True, text=True, timeout=600)


def _start(run_dir: pathlib.Path, ready: Callable[[pathlib.Path], bool], *extra: str):
  proc = subprocess.Popen(_cmd(run_dir, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)  # fmt: skip
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None and not ready(run_dir):
    time.sleep(0.001)
  return proc


def _lines(run_dir: pathlib.Path) -> int:
  path = run_dir / "metrics.jsonl"
  return path.read_text().count("\n") if path.exists() else 0


def _writing(run_dir: pathlib.Path) -> bool:
  ckpts = run_dir / "checkpoints"
  return ckpts.exists() and any("tmp" in p.name for p in ckpts.iterdir())


def _outcome(run_dir: pathlib.Path) -> tuple:
  lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
  metrics = [{k: v for k, v in l.items() if k not in WALL_CLOCK} for l in lines]
  return metrics, (run_dir / "final_params.msgpack").read_bytes()


def _resumed_equals(run_dir: pathlib.Path, straight: tuple) -> bool:
  proc = _run(run_dir, "--resume")
  return proc.returncode == 0 and _outcome(run_dir) == straight


def _signal(sig: int, rng: random.Random, work: pathlib.Path, straight: tuple) -> bool:
  proc = _start(work, lambda d: _lines(d) >= 1)
  time.sleep(rng.uniform(0.0, 0.8))
  proc.send_signal(sig)
  proc.communicate()
  clean = proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 0)
  return clean and _resumed_equals(work, straight)


def _mid_checkpoint(rng, work, straight) -> bool:
  del rng
  proc = _start(work, _writing)
  proc.kill()
  proc.communicate()
  return _resumed_equals(work, straight)


def _second_process(resume: bool):
  def fault(rng, work, straight) -> bool:
    del rng
    first = _start(work, lambda d: _lines(d) >= 1)
    second = _run(work, *(["--resume"] if resume else []))
    first.communicate()
    refused = second.returncode == 2 and f'"pid": {first.pid}' in second.stderr
    return refused and first.returncode == 0 and _outcome(work) == straight

  return fault


def _flipped_checkpoint(rng, work, straight) -> bool:
  _run(work, "--total-env-steps", "3840")
  newest = work / "checkpoints" / "3840"
  files = sorted(p for p in newest.rglob("*") if p.is_file() and p.stat().st_size > 0)
  _flip(rng.choice(files), rng)
  return _resumed_equals(work, straight)


def _flipped_params(rng, work, straight) -> bool:
  del straight
  _run(work, "--total-env-steps", "1280")
  _flip(work / "final_params.msgpack", rng)
  proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "evaluate.py"), "--run-dir",
                         str(work)], capture_output=True, text=True, timeout=300)  # fmt: skip
  if proc.returncode != 0 or "does not match its checksum" not in proc.stderr:
    return False
  # The newest intact parameters, the checkpoint's at 1,280, in that checkpoint's file.
  result = json.loads((work / "evaluation_checkpoint1280.json").read_text())
  return (result["parameters"], result["env_steps"]) == ("checkpoint", 1280)


def _flip(path: pathlib.Path, rng: random.Random) -> None:
  data = bytearray(path.read_bytes())
  data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
  path.write_bytes(bytes(data))


def _full_disk(rng, work, straight) -> bool:
  if os.geteuid() != 0:
    raise RuntimeError("needs root to mount a tmpfs")
  work.mkdir(parents=True)
  size = rng.choice([200, 300, 400])  # KiB: full before the run's end
  subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}k", "tmpfs", str(work)], check=True)
  try:
    proc = _run(work / "run")
    last = [l for l in proc.stderr.splitlines() if l.strip()][-1:]
    clear = proc.returncode == 1 and bool(last) and "no space left on device" in last[0]
    subprocess.run(["mount", "-o", "remount,size=64m", str(work)], check=True)
    return clear and _resumed_equals(work / "run", straight)
  finally:
    subprocess.run(["umount", str(work)], check=False)


def _nan_reward(rng, work, straight) -> bool:
  del rng, straight
  code = f"""
import dataclasses, numpy as np
from offpolicy_ac.presets import impala
from offpolicy_ac.training import make_training_rollout
from offpolicy_ac.training.driver import NonFiniteError
calls = [0]
def factory(act, config, seed, to_device):
  rollout = make_training_rollout(act, config, seed, to_device)
  unroll = rollout.unroll
  class Poisoned:
    env, init = rollout.env, staticmethod(rollout.init)
    def unroll(self, acting, state):
      state, traj, stats = unroll(acting, state)
      calls[0] += 1
      if calls[0] == 10:
        traj = traj._replace(reward=np.where(np.arange(traj.reward.shape[0])[:, None] == 3,
                                             np.nan, np.asarray(traj.reward)))
      return state, traj, stats
  return Poisoned()
args = impala.Args()
train = args.train.replace(total_env_steps=6400, checkpoint_every=1280, log_every=640,
                           eval_every=1280, eval_episodes=2)
args = dataclasses.replace(args, train=train, run_dir={str(work)!r})
try:
  impala.run(args, rollout_factory=factory)
except NonFiniteError as e:
  print("STOPPED", e)
"""
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
  stopped = "STOPPED non-finite reward from environment" in proc.stdout
  steps = sorted(int(p.name) for p in (work / "checkpoints").iterdir() if p.name.isdigit())
  return stopped and steps == [1280]


def _bad_inputs() -> list[tuple[str, list[str]]]:
  return [
      ("impala", ["--num-envs", "100000", "--total-env-steps", "2048"]),
      ("impala", ["--hidden-sizes", "0"]),
      ("impala", ["--learning-rate", "nan"]),
      ("impala", ["--env-id", "CartPol-v1"]),
      ("impala", ["--preset", "nope"]),
      ("acer", ["--preset", "pendulum", "--env-id", "CartPole-v1"]),
      ("sql", ["--env-id", "Hopper-v4", "--preset", "cartpole"]),
      ("sql", ["--replay-capacity", "1", "--min-replay-size", "0"]),
      ("sqil", ["--demos", "/nonexistent.npz"]),
      ("evaluate", ["--run-dir", "/nonexistent"]),
  ]


def _bad_input(case):
  def fault(rng, work, straight) -> bool:
    del rng, straight
    script, flags = case
    extra = ["--run-dir", str(work)] if script not in ("evaluate",) else []
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / f"{script}.py"), *extra,
                           *flags], capture_output=True, text=True, timeout=300)  # fmt: skip
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    one_line = bool(lines) and lines[-1].startswith(f"[{script}] error: ")
    return proc.returncode == 2 and one_line and "Traceback" not in proc.stderr

  return fault


def main(args: Args) -> dict:
  rng = random.Random(args.seed)
  faults = {
      "kill -9 at a random moment": (lambda r, w, s: _signal(signal.SIGKILL, r, w, s), 2),
      "kill -9 during a checkpoint write": (_mid_checkpoint, 1),
      "SIGTERM at a random moment": (lambda r, w, s: _signal(signal.SIGTERM, r, w, s), 1),
      "SIGINT at a random moment": (lambda r, w, s: _signal(signal.SIGINT, r, w, s), 1),
      "a second process on the run directory": (_second_process(False), 1),
      "--resume while the run goes on": (_second_process(True), 1),
      "a flipped byte in the newest checkpoint": (_flipped_checkpoint, 1),
      "a flipped byte in final_params.msgpack": (_flipped_params, 1),
      FULL_DISK: (_full_disk, 1),
      "a NaN reward from the environment": (_nan_reward, 1),
  }
  for script, flags in _bad_inputs():
    faults[f"bad input: {script} {' '.join(flags)}"] = (_bad_input((script, flags)), 0)
  root = os.geteuid() == 0
  with refusals():  # bad arguments: one line and exit code 2 (script_main), before any run
    if args.faults is not None and not args.faults:
      raise ValueError(f"--faults needs at least one name (leave the flag out for all); the "
                       f"faults: {list(faults)}")  # fmt: skip
    unknown = [name for name in args.faults or () if name not in faults]
    if unknown:
      raise ValueError(f"unknown --faults {unknown}; the faults: {list(faults)}")
    if args.tries < 1:
      raise ValueError(f"--tries must be >= 1, got {args.tries}")
    if FULL_DISK in (args.faults or ()) and not root:
      raise ValueError(f"--faults {FULL_DISK!r} needs root: it mounts a tmpfs")
    out = pathlib.Path(args.out).expanduser() if args.out else None
    for suffix in (".txt", ".json") if out else ():
      check_output_file("--out", out.with_suffix(suffix))
  skipped = [] if root or args.faults else [FULL_DISK]
  chosen = {k: v for k, v in faults.items() if k in (args.faults or faults) and k not in skipped}
  with tempfile.TemporaryDirectory() as tmp:
    straight_dir = pathlib.Path(tmp) / "straight"
    if _run(straight_dir).returncode != 0:
      raise RuntimeError("the uninterrupted run failed")
    straight = _outcome(straight_dir)
    results = {}
    for name, (fault, weight) in chosen.items():
      tries = max(1, args.tries * weight) if weight else 1
      held = []
      for k in range(tries):
        work = pathlib.Path(tmp) / f"{len(results)}-{k}"
        try:
          held.append(bool(fault(rng, work, straight)))
        except Exception as e:  # pylint: disable=broad-except
          print(f"{name}, try {k}: {type(e).__name__}: {e}", flush=True)
          held.append(False)
      results[name] = held
      print(f"{name:<70} {len(held):>5} {sum(held):>5}", flush=True)
  table = "\n".join(["| fault | tries | held |", "|---|---|---|"] + [
      f"| {name} | {len(h)} | {sum(h)} |" for name, h in results.items()
  ] + [f"| {name} | 0 | skipped: needs root |" for name in skipped])  # fmt: skip
  print(table)
  if out is not None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(table + "\n")
    out.with_suffix(".json").write_text(json.dumps(results, indent=2))
  return results


if __name__ == "__main__":
  script_main(lambda: parse_plain(Args, __doc__), main)
