r"""ACER (Retrace + truncated IS with bias correction + trust region) on an envpool task or a
JAX environment.

    python experiments/acer.py --env-id CartPole-v1 --seed 0 \
        --total-env-steps 500000 --run-dir runs/acer-cartpole
    python experiments/acer.py --preset pendulum        # SDN + Gaussian policy
    python experiments/acer.py --env-id Hopper-v4          # selects the mujoco preset
    python experiments/acer.py --env-id gymnax:Asterix-MinAtar --num-seeds 5   # minatar
    python experiments/acer.py --preset atari --env-id Pong-v5

Discrete or continuous ACER is picked from the task's action space. The defaults learn
CartPole-v1 (trailing return 500 after about 50k env steps) and, with only the env id
changed, Pendulum-v1 (about -150 after about 100k) on a 2-core CPU. `--replay-ratio`
sets the replayed updates after each on-policy update (the loop's
`--num-updates-per-train-iter`, which this script refuses). The presets are in
`offpolicy_ac.presets.acer`.
"""

from offpolicy_ac.cli import parse_args
from offpolicy_ac.cli import script_main
from offpolicy_ac.presets import acer


def parse(argv=None) -> acer.Args:
  """The command line (sys.argv's, or `argv`) as this script reads it, without training;
  -h/--help and --help-all print the help and exit."""
  return parse_args(
      acer.Args, acer.PRESETS, argv=argv, description=__doc__, env_presets=acer.ENV_PRESETS
  )


if __name__ == "__main__":
  # One line and exit code 2 for a refused run; exit_process skips the slow teardown.
  script_main(parse, acer.run)
