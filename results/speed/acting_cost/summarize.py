"""Before/after table of the acting-cost rounds: medians over every repeat of every round.

    python results/speed/acting_cost/summarize.py        # reads base_round*.json, new_round*.json

For each task and version: median env steps/s and steps per CPU-second of raw stepping
(K pools of N envs in K threads) and of the async no-op-learner runs (host loop and compiled
rollout), and the median over repeats of each repeat's ratio to its own raw measurement.
"""

import glob
import json
import pathlib
import statistics

HERE = pathlib.Path(__file__).parent
MODES = (("raw_KxN", "raw, 2 pools x N"), ("async_nolearn", "async no-op learner, host loop"),
         ("async_xla_nolearn", "async no-op learner, compiled"))  # fmt: skip


def rows(version: str) -> dict:
  out: dict = {}
  for path in sorted(glob.glob(str(HERE / f"{version}_round*.json"))):
    for task, summary in json.load(open(path))["tasks"].items():
      reps = summary["repeats"]
      for i, raw in enumerate(reps["raw_KxN"]):
        for mode, _ in MODES:
          r = reps[mode][i]
          d = out.setdefault(task, {}).setdefault(mode, {"sps": [], "cpu": [], "r": [], "rc": []})
          d["sps"].append(r["env_steps_per_s"])
          d["cpu"].append(r["steps_per_cpu_s"])
          d["r"].append(r["env_steps_per_s"] / raw["env_steps_per_s"])
          d["rc"].append(r["steps_per_cpu_s"] / raw["steps_per_cpu_s"])
  return out


def main() -> None:
  med = statistics.median
  data = {v: rows(v) for v in ("base", "new")}
  print("| task | mode | version | n | env steps/s | / raw | steps/CPU-s | / raw (CPU) |")
  print("|---|---|---|---|---|---|---|---|")
  for task in data["base"]:
    for mode, label in MODES:
      for v in ("base", "new"):
        d = data[v].get(task, {}).get(mode)
        if not d:
          continue
        ratio = "" if mode == "raw_KxN" else f"{med(d['r']):.2f}"
        ratio_cpu = "" if mode == "raw_KxN" else f"{med(d['rc']):.2f}"
        print(f"| {task} | {label} | {v} | {len(d['sps'])} | {med(d['sps']):,.0f} | {ratio} | "
              f"{med(d['cpu']):,.0f} | {ratio_cpu} |")  # fmt: skip


if __name__ == "__main__":
  main()
