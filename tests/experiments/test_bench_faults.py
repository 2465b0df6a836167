"""bench_faults.py's faults hold on today's code, on a reduced campaign (one try each of the
faults that need no signal timing; the campaign in results/faults runs them all)."""

from scripts import load_script


def test_a_flipped_byte_in_the_final_parameters_holds():
  """evaluate.py warns and evaluates the newest intact checkpoint, into its own file (the
  campaign read evaluation.json, and counted the fault as failing when the file moved)."""
  module = load_script("bench_faults")
  faults = ("a flipped byte in final_params.msgpack", "a flipped byte in the newest checkpoint")
  results = module.main(module.Args(tries=1, faults=faults))
  assert results == {name: [True] for name in faults}
