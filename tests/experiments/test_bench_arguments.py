"""Benchmark scripts refuse bad arguments before any work, naming them."""

import pytest
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


def test_bench_seeds_reports_its_childs_error(tmp_path):
  bench = load_script("bench_seeds")
  with pytest.raises(
      RuntimeError, match=r"failed:\n\[impala\] error: one iteration takes 256 env steps"
  ):
    bench.main(bench.Args(num_seeds=2, total_env_steps=8, repeats=1))
