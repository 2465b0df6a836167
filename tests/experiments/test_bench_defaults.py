"""experiments/bench_defaults.py scores each seed's final and best parameters after training."""

import json

import numpy as np
import pytest
from scripts import load_script

from offpolicy_ac.training import evaluate
from offpolicy_ac.training import load_run


def test_bench_scores_final_and_best_parameters_of_every_seed(tmp_path):
  bench = load_script("bench_defaults")
  args = lambda *cases: bench.Args(cases=cases, num_seeds=2, episodes=3, out_dir=str(tmp_path),
                                   total_env_steps=1024)  # fmt: skip  # noqa: E731
  bench.main(args("impala", "sql"))
  # SQIL after SQL, into the same folder: the table keeps the cases run before.
  results = bench.main(args("sqil"))
  assert [r["case"] for r in results] == ["impala", "sql", "sqil"]
  assert (tmp_path / "demos-sql.npz").exists()  # SQIL imitated SQL's seed 0
  for r in results:
    assert len(r["seeds"]) == 2 and r["bar"] == bench.CASES[r["case"]].bar
    finals = [s["final"]["mean"] for s in r["seeds"]]
    assert r["final_passed"] == sum(f >= r["bar"] for f in finals)
    for s in r["seeds"]:
      # The best parameters scored best in training, and the final policy's end-of-budget
      # score is one of those evaluations.
      assert s["summary_best_eval"] >= s["summary_last_eval"]
  # A seed's score is load_run's policy on the bench's evaluation environments.
  lane = tmp_path / "impala" / "seed1"
  run = load_run(lane, best=True)
  with run.make_env(3, 10_000) as env:
    mean = float(np.mean(evaluate(env, run.greedy, run.acting, 3)))
  assert results[0]["seeds"][1]["best"]["mean"] == pytest.approx(mean)
  assert json.loads((tmp_path / "results.json").read_text()) == results
  table = (tmp_path / "results.md").read_text()
  assert "`sqil.py --total-env-steps 1024`" in table and table.count("\n| `") == 3
  # Run again into the same folder, the bench refuses before training anything.
  with pytest.raises(ValueError, match=r"already holds impala, sql: choose another --out-dir"):
    bench.main(bench.Args(cases=("impala", "sql"), out_dir=str(tmp_path)))
  with pytest.raises(ValueError, match=r"holds results scored on --episodes 3; its table"):
    bench.main(bench.Args(cases=("acer",), episodes=5, out_dir=str(tmp_path)))


@pytest.mark.parametrize(
    "cases, message",
    [
        (("ppo",), r"unknown --cases \['ppo'\]"),
        (("sqil", "sql"), "sqil learns from sql's demonstrations: run sql before it"),
    ],
)
def test_bench_refuses_bad_cases(tmp_path, cases, message):
  bench = load_script("bench_defaults")
  with pytest.raises(ValueError, match=message):
    bench.main(bench.Args(cases=cases, out_dir=str(tmp_path)))
