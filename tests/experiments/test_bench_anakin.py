"""experiments/bench_anakin.py measures compiled training beside the environment's bound."""

import pytest
from scripts import load_script

pytest.importorskip("gymnax")


def test_bench_reports_train_and_bound_for_each_seed_count(tmp_path):
  bench = load_script("bench_anakin")
  out = tmp_path / "bench.json"
  rows = bench.main(bench.Args(agent="sql", num_envs=4, seeds=(1, 2),
                               steps_per_measurement=512, repeats=1, out=str(out)))  # fmt: skip
  assert [r["seeds"] for r in rows] == [1, 2]
  for r in rows:
    assert r["train_sps"] > 0 and r["bound_sps"] > 0
    assert r["ratio"] == pytest.approx(r["train_sps"] / r["bound_sps"])
    assert r["steps_per_call"] % (r["seeds"] * 4) == 0
  assert out.exists()


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"env_id": "CartPole-v1"}, "JAX environment"),
        ({"agent": "ppo"}, "--agent"),
        ({"num_envs": 0}, "--num-envs must be >= 1"),
        ({"preset": "nope"}, r"--preset nope: impala's presets are \["),
    ],
)
def test_bench_refuses_bad_arguments(fields, message):
  bench = load_script("bench_anakin")
  with pytest.raises(ValueError, match=message):
    bench.main(bench.Args(**fields))
