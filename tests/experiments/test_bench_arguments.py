"""Benchmark scripts refuse bad arguments before any work, naming them."""

import pytest
from scripts import load_script


@pytest.mark.parametrize(
    "script, fields, message",
    [
        ("bench_replay", {"repeats": 0}, "--repeats must be >= 1"),
        ("bench_losses", {"shapes": ("128",)}, "--shapes takes TxB sizes"),
        ("bench_losses", {"rounds": 0}, "--repeats and --rounds must be >= 1"),
        ("bench_faults", {"faults": ("nope",)}, r"unknown --faults \['nope'\]; the faults: "),
        ("bench_faults", {"tries": 0}, "--tries must be >= 1"),
    ],
)
def test_bench_refuses_bad_arguments(script, fields, message):
  bench = load_script(script)
  with pytest.raises(SystemExit, match=message):
    bench.main(bench.Args(**fields))
