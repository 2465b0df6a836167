"""experiments/bench_launch.py times launch to target with a cold and a warm cache."""

import json

import pytest
from scripts import load_script

pytest.importorskip("gymnax")


def test_bench_times_a_cold_and_a_warm_launch_to_the_target(tmp_path):
  bench = load_script("bench_launch")
  flags = ("--total-env-steps", "1024", "--num-envs", "4", "--unroll-length", "8",
           "--log-every", "512", "--eval-every", "512", "--eval-episodes", "2")  # fmt: skip
  report = bench.main(bench.Args(target=-1.0, seeds=(0,), flags=flags, out_dir=str(tmp_path)))
  for case in ("cold", "warm"):
    (run,) = report["runs"][case]
    assert run["target_env_steps"] == 512  # the first evaluation returns more than -1
    assert 0 < run["target_s"] <= run["exit_s"]
    assert report["summary"][case]["reached"] == 1
  caches = [p for p in tmp_path.iterdir() if p.name.startswith("cache-")]
  assert len(caches) == 1 and any(p.is_file() for p in caches[0].rglob("*"))
  (written,) = tmp_path.glob("launch-*.json")  # a second run into tmp_path writes its own
  assert json.loads(written.read_text())["summary"] == report["summary"]


def test_bench_reports_a_target_never_reached(tmp_path):
  bench = load_script("bench_launch")
  flags = ("--total-env-steps", "512", "--num-envs", "4", "--unroll-length", "8",
           "--log-every", "512", "--eval-every", "512", "--eval-episodes", "2")  # fmt: skip
  report = bench.main(bench.Args(target=1e9, seeds=(0,), flags=flags, out_dir=str(tmp_path)))
  assert report["summary"]["cold"]["reached"] == 0
  assert report["summary"]["cold"]["median_target_s"] is None


@pytest.mark.parametrize(
    "fields, message", [({"agent": "ppo"}, "--agent"), ({"seeds": ()}, "seed")]
)
def test_bench_refuses_bad_arguments(fields, message):
  bench = load_script("bench_launch")
  with pytest.raises(ValueError, match=message):
    bench.main(bench.Args(**fields))


def test_bench_stops_a_run_past_its_timeout(tmp_path):
  bench = load_script("bench_launch")
  flags = ("--total-env-steps", "100000", "--num-envs", "4", "--unroll-length", "8")
  with pytest.raises(RuntimeError, match="ran past --timeout-s 2 s"):
    bench.main(bench.Args(seeds=(0,), flags=flags, out_dir=str(tmp_path), timeout_s=2.0))


def test_bench_takes_several_flags_for_its_runs():
  import tyro  # pylint: disable=import-outside-toplevel

  bench = load_script("bench_launch")
  argv = ["--flags=--compile-for=speed", "--flags=--total-env-steps=1000"]
  assert tyro.cli(bench.Args, args=argv).flags == ("--compile-for=speed", "--total-env-steps=1000")


@pytest.mark.parametrize("script", ["bench_launch", "bench_agents"])
def test_medians_count_a_seed_that_never_reached_the_target_as_infinitely_slow(script):
  """The median of the seeds that reached the target alone flattered: 1 of 2 reached read
  as that seed's time."""
  median = load_script(script)._median
  if script == "bench_launch":  # over rows of results
    median = lambda xs, m=median: m([{"t": x} for x in xs], "t")
  assert median([5.0, None]) is None and median([1.0, None, None]) is None
  assert median([2.0, 1.0, None]) == 2.0 and median([3.0, 1.0, 2.0]) == 2.0
