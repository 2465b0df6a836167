"""Smoke test of experiments/bench_replay.py (a benchmark script, not a timed test)."""

from scripts import load_script


def test_bench_replay_times_both_variants_on_every_case():
  bench = load_script("bench_replay")
  rows = bench.main(bench.Args(repeats=1))
  assert [row["case"] for row in rows] == [case[0] for case in bench.CASES]
  assert rows[0]["buffer_gb"] > 1.0  # the Atari preset's buffer: 1.5 GB of frames
  for row in rows:
    assert row["copied"] > 0 and row["donated"] > 0
    assert row["ratio"] == row["copied"] / row["donated"]
