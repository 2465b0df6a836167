r"""IMPALA (V-trace actor-critic) on an envpool task or a JAX environment.

    python experiments/impala.py --env-id CartPole-v1 --seed 0 \
        --total-env-steps 500000 --run-dir runs/impala-cartpole
    python experiments/impala.py --preset pendulum      # Gaussian policy
    python experiments/impala.py --preset atari --env-id Pong-v5
    python experiments/impala.py --preset gymnax-cartpole      # one compiled program
    python experiments/impala.py --preset minatar --env-id gymnax:Asterix-MinAtar --num-seeds 5

Defaults learn CartPole-v1 on a 2-core CPU. The presets are in `offpolicy_ac.presets.impala`.
"""

from offpolicy_ac.cli import parse_args
from offpolicy_ac.cli import script_main
from offpolicy_ac.presets import impala


def parse(argv=None) -> impala.Args:
  """The command line (sys.argv's, or `argv`) as this script reads it, without training;
  -h/--help and --help-all print the help and exit."""
  return parse_args(
      impala.Args, impala.PRESETS, argv=argv, description=__doc__, env_presets=impala.ENV_PRESETS
  )


if __name__ == "__main__":
  # One line and exit code 2 for a refused run; exit_process skips the slow teardown.
  script_main(parse, impala.run)
