"""atari.sh's summary of one device command, and the check of what comes back from $OUT.

    python benchmarks/gpu/summarize.py summary --work W --out OUT --game Pong-v5 --agent impala ...
    python benchmarks/gpu/summarize.py check OUT     # exit 1 if OUT breaks the device's limits
    python benchmarks/gpu/summarize.py rollout --work W  # prints host or compiled

`summary` reads what the phases left in the work folder (raw.json from raw_sweep.py,
bench.json from experiments/bench_async.py, the run directory) and writes OUT/summary.txt
(also printed) and OUT/results.json: raw stepping at its best configuration, the training
loop's throughput with a no-op and with the real learner against raw stepping of the same
layout, and the table run's env steps, env steps/s (this command's logged intervals, the
first left out), their ratio to raw stepping, the last and best evaluation, the Atari
protocol (`envs.atari_protocol`) and, for SQIL, record_demos.py's line on its demonstrations.

`rollout` prints the `--rollout` of the table run: a resumed run's own (its config.json),
else the faster (in env steps the learner trained on) of the bench's real-learner runs on
the host loop (`async`) and on the compiled rollout (`async_xla`), else `host`.

`check` lists what breaks the limits on files coming back from the device machine: at most
8 files of at most 16 MiB, no more than 2 folders down, names of letters, digits, '.', '_'
and '-'.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys
from typing import Any
from typing import Optional

MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_DEPTH = 2  # folders below OUT
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")

# DI-engine's best mean reward over 5 seeds within 10M env steps (the seed documents'
# tables; issue 47).
DI_ENGINE = {
    ("impala", "Pong-v5"): 20,
    ("impala", "Qbert-v5"): 13_175,
    ("impala", "SpaceInvaders-v5"): 977,
    ("acer", "Pong-v5"): 20,
    ("acer", "Qbert-v5"): 4_000,
    ("acer", "SpaceInvaders-v5"): 1_100,
    ("sqil", "Pong-v5"): 20,
    ("sqil", "Qbert-v5"): 14_941,
    ("sqil", "SpaceInvaders-v5"): 1_002,
}


def check_out(out: pathlib.Path) -> list[str]:
  """What in `out` breaks the limits on files that come back (empty: nothing)."""
  problems = []
  files = []
  for path in sorted(out.rglob("*")):
    rel = path.relative_to(out)
    if not _NAME.match(path.name):
      problems.append(f"{rel}: a name of other characters than letters, digits, '.', '_', '-'")
    if path.is_symlink():
      problems.append(f"{rel}: a link")
    elif path.is_file():
      files.append(rel)
      if len(rel.parts) - 1 > MAX_DEPTH:
        problems.append(f"{rel}: more than {MAX_DEPTH} folders down")
      size = path.stat().st_size
      if size > MAX_FILE_BYTES:
        problems.append(f"{rel}: {size / 2**20:.1f} MiB, over 16 MiB")
    elif not path.is_dir():
      problems.append(f"{rel}: not a plain file")
  if len(files) > MAX_FILES:
    problems.append(f"{len(files)} files, over {MAX_FILES}: {', '.join(map(str, files))}")
  return problems


def _load(path: pathlib.Path) -> Optional[Any]:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def _metrics(run: pathlib.Path) -> list[dict]:
  try:
    lines = (run / "metrics.jsonl").read_text().splitlines()
  except OSError:
    return []
  return [json.loads(line) for line in lines if line.strip()]


def _protocol(game: str, fallback: Optional[str]) -> Optional[str]:
  try:
    from offpolicy_ac import envs

    return envs.atari_protocol(game).describe()
  except Exception:  # pylint: disable=broad-except
    return fallback


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return a / b if a is not None and b else None


def _fmt(x: Optional[float], spec: str = ",.0f") -> str:
  return "-" if x is None else format(x, spec)


def _against_raw(sps: float, raw_kxn: Optional[float], k: int, n: int,
                 best_raw: Optional[float]) -> str:  # fmt: skip
  """ "S env steps/s, R of raw K x N, B of the best raw": a training loop's rate."""
  return (f"{sps:,.0f} env steps/s, {_fmt(_ratio(sps, raw_kxn), '.2f')} of raw {k} x {n}, "
          f"{_fmt(_ratio(sps, best_raw), '.2f')} of the best raw")  # fmt: skip


def _layouts(work: pathlib.Path, game: str, best_raw: Optional[float]) -> list[dict]:
  """The layouts phase's runs (layout_KxN_B.json), in the order of their names."""
  found = []
  for path in sorted(work.glob("layout_*.json")):
    bench = _load(path)
    tasks = (bench or {}).get("tasks") or {}
    task = tasks.get(game) or next(iter(tasks.values()), None)
    if not task:
      continue
    med, cfg = task["medians"], task["config"]
    raw_kxn = med.get("raw_KxN", {}).get("env_steps_per_s")
    rates = {m: v["env_steps_per_s"] for m, v in med.items() if not m.startswith("raw")}
    found.append({
        "actors": cfg["actors"], "num_envs": cfg["num_envs"],
        "env_batch_size": cfg.get("env_batch_size", 0), "raw_KxN": raw_kxn,
        "env_steps_per_s": rates,
        "vs_raw_KxN": {m: _ratio(v, raw_kxn) for m, v in rates.items()},
        "vs_best_raw": {m: _ratio(v, best_raw) for m, v in rates.items()},
    })  # fmt: skip
  return found


# Why a table run ended before its first metrics line, by its exit code (as atari.sh says).
_ENDED_WITHOUT_METRICS = {
    124: "stopped at its time limit (TRAIN_MAX_S, or the time left): more time, or a shorter "
    "start",
    2: "refused: its error is in log.txt",
}


def summarize(work: pathlib.Path, game: str, agent: str, start_env_steps: int,
              train_seconds: Optional[float], train_rc: Optional[int]) -> tuple[str, dict]:  # fmt: skip
  """The summary text and the results' JSON of one command."""
  raw = _load(work / "raw.json")
  bench = _load(work / "bench.json")
  run = work / "run"
  run_summary = _load(run / "summary.json")
  config = _load(run / "config.json")
  lines = [f"{agent} on {game}"]
  results: dict[str, Any] = {"game": game, "agent": agent, "raw": raw, "bench": None, "train": None}
  best_raw = raw["best"]["env_steps_per_s"] if raw and raw.get("best") else None
  if raw and raw.get("best"):
    b = raw["best"]
    lines.append(
        f"raw envpool stepping, best of {len(raw['results'])} configs: {b['config']} "
        f"(K x N[:threads[:batch]]) at {b['env_steps_per_s']:,.0f} env steps/s "
        f"({raw['cpu_count']} CPU cores)"
    )
  elif raw:
    lines.append("raw envpool stepping: every config failed")
  raw_kxn = None
  if bench:
    task = bench["tasks"].get(game) or next(iter(bench["tasks"].values()))
    med, ratios = task["medians"], task["ratios"]
    raw_kxn = med["raw_KxN"]["env_steps_per_s"]
    cfg = task["config"]
    k, n = cfg["actors"], cfg["num_envs"]
    results["bench"] = {"config": cfg, "medians": med, "ratios": ratios, "probe": task["probe"]}
    lines.append(
        f"training loop (bench_async, IMPALA {cfg['network']}, {k} async actors x {n} envs, "
        f"{cfg['total_env_steps']:,} env steps per run): raw {k} pools x {n} "
        f"{raw_kxn:,.0f} env steps/s"
    )
    for mode, label in (("async_nolearn", "no-op learner"), ("async", "real learner"),
                        ("async_xla_nolearn", "no-op learner, compiled rollout"),
                        ("async_xla", "real learner, compiled rollout")):  # fmt: skip
      if mode in med:
        sps = med[mode]["env_steps_per_s"]
        lines.append(
            f"  {label}: {_against_raw(sps, raw_kxn, k, n, best_raw)}; "
            f"{_fmt(med[mode].get('updates_per_s'), '.1f')} updates/s"
        )
  layouts = _layouts(work, game, best_raw)
  if layouts:
    results["layouts"] = layouts
    lines.append("training loop layouts (bench_async, the layouts phase):")
    for lay in layouts:
      batch = f", batched by {lay['env_batch_size']}" if lay["env_batch_size"] else ""
      for mode, sps in lay["env_steps_per_s"].items():
        k, n = lay["actors"], lay["num_envs"]
        lines.append(f"  {k} actors x {n} envs{batch}, {mode}: "
                     f"{_against_raw(sps, lay['raw_KxN'], k, n, best_raw)}")  # fmt: skip
  metrics = _metrics(run)
  if run_summary or metrics:
    mine = [m for m in metrics if m["env_steps"] > start_env_steps]
    rates = [m["env_steps_per_s"] for m in mine[1:] if m.get("env_steps_per_s")]
    sps = statistics.median(rates) if rates else None
    evals = [m for m in metrics if m.get("eval_return") is not None]
    episodes = [m for m in mine if m.get("episode_return") is not None]
    end = (run_summary or {}).get("env_steps", metrics[-1]["env_steps"] if metrics else 0)
    train = {
        "env_steps": end,
        "env_steps_this_command": end - start_env_steps,
        "resumed_from_env_steps": start_env_steps or None,
        "train_seconds": train_seconds,
        "train_exit_code": train_rc,
        "env_steps_per_s_median": sps,
        "vs_best_raw": _ratio(sps, best_raw),
        "vs_raw_KxN": _ratio(sps, raw_kxn),
        "last_episode_return": episodes[-1]["episode_return"] if episodes else None,
        "last_eval_return": evals[-1]["eval_return"] if evals else None,
        "best_eval_return": (run_summary or {}).get("best_eval_return"),
        "best_env_steps": (run_summary or {}).get("best_env_steps"),
        "checkpoint_env_steps": (run_summary or {}).get("checkpoint_env_steps"),
        "interrupted": (run_summary or {}).get("interrupted"),
        "protocol": _protocol(game, (run_summary or {}).get("evaluation_protocol")),
        "di_engine_best_mean_reward": DI_ENGINE.get((agent, game)),
        "command": (config or {}).get("command"),
    }
    results["train"] = train
    frm = f" (resumed at {start_env_steps:,})" if start_env_steps else ""
    lines += [
        f"table run: {end:,} env steps{frm}, {train['env_steps_this_command']:,} in this "
        f"command ({_fmt(train_seconds, '.0f')} s, exit code {train_rc}); "
        f"{_fmt(sps)} env steps/s (median of the logged intervals), "
        f"{_fmt(train['vs_best_raw'], '.2f')} of the best raw, "
        f"{_fmt(train['vs_raw_KxN'], '.2f')} of raw at the bench's layout",
        f"  training episode return (last interval): {_fmt(train['last_episode_return'], '.1f')}; "
        f"evaluation: last {_fmt(train['last_eval_return'], '.1f')}, best "
        f"{_fmt(train['best_eval_return'], '.1f')} at {_fmt(train['best_env_steps'])} env steps; "
        f"DI-engine's best mean reward: {_fmt(train['di_engine_best_mean_reward'])}",
        f"  checkpoint at {_fmt(train['checkpoint_env_steps'])} env steps (--resume continues "
        "there)",
        f"  protocol: {train['protocol']}",
    ]
    demos = _demos_line(work)
    if demos:
      train["demonstrations"] = demos
      lines.append(f"  demonstrations: {demos}")
  elif train_rc is not None:  # refused or failed before its first metrics line
    results["train"] = {"train_exit_code": train_rc, "train_seconds": train_seconds}
    why = _ENDED_WITHOUT_METRICS.get(train_rc, "failed: its error is in log.txt")
    lines.append(
        f"table run: none: the training command ended with exit code {train_rc} "
        f"after {_fmt(train_seconds, '.0f')} s, before its first metrics line ({why})"
    )
  return "\n".join(lines), results


def _demos_line(work: pathlib.Path) -> Optional[str]:
  """record_demos.py's line for SQIL's demonstrations (demos.txt), if it recorded them."""
  path = work / "demos.txt"
  if not path.is_file():
    return None
  lines = [line for line in path.read_text().splitlines() if line.startswith("recorded ")]
  return lines[-1] if lines else None


def choose_rollout(work: pathlib.Path) -> tuple[str, str]:
  """(the table run's --rollout, why)."""
  config = _load(work / "run" / "config.json")
  if config:
    try:
      return config["config"]["train"]["env"]["rollout"], "the resumed run's own"
    except (KeyError, TypeError):
      pass
  bench = _load(work / "bench.json")
  rates = {}
  for task in (bench or {}).get("tasks", {}).values():
    for mode, rollout in (("async", "host"), ("async_xla", "compiled")):
      m = task["medians"].get(mode) or {}
      sps = m.get("used_env_steps_per_s", m.get("env_steps_per_s"))  # what the learner used
      if sps:
        rates[rollout] = sps
  if not rates:
    return "host", "no bench of the real learner"
  best = max(rates, key=rates.get)
  return best, ", ".join(f"{r} {sps:,.0f} env steps/s" for r, sps in rates.items())


def main(argv: Optional[list[str]] = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  s = sub.add_parser("summary")
  s.add_argument("--work", type=pathlib.Path, required=True)
  s.add_argument("--out", type=pathlib.Path, required=True)
  s.add_argument("--game", default="Pong-v5")
  s.add_argument("--agent", default="impala")
  s.add_argument("--start-env-steps", type=int, default=0)
  s.add_argument("--train-seconds", type=float, default=None)
  s.add_argument("--train-rc", type=int, default=None)
  c = sub.add_parser("check")
  c.add_argument("out", type=pathlib.Path)
  r = sub.add_parser("rollout")
  r.add_argument("--work", type=pathlib.Path, required=True)
  args = parser.parse_args(argv)
  if args.command == "rollout":
    rollout, why = choose_rollout(args.work)
    print(f"--rollout {rollout}: {why}", file=sys.stderr)
    print(rollout)
    return 0
  if args.command == "check":
    problems = check_out(args.out)
    for p in problems:
      print(f"OUT limit: {p}")
    return 1 if problems else 0
  text, results = summarize(args.work, args.game, args.agent, args.start_env_steps,
                            args.train_seconds, args.train_rc)  # fmt: skip
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / "summary.txt").write_text(text + "\n")
  (args.out / "results.json").write_text(json.dumps(results, indent=1))
  print(text, flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
