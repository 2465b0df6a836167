r"""Soft Q-learning on an envpool task or a JAX environment (discrete or continuous actions).

    python experiments/sql.py --env-id CartPole-v1 --seed 0 \
        --total-env-steps 500000 --run-dir runs/sql-cartpole
    python experiments/sql.py --preset cartpole-v0 --seed 0  # DI-engine's v0 protocol
    python experiments/sql.py --preset pendulum              # continuous: SVGD sampler
    python experiments/sql.py --preset pendulum --env-id gymnax:Pendulum-v1   # compiled
    python experiments/sql.py --env-id HalfCheetah-v4 --num-seeds 3   # halfcheetah preset
    python experiments/sql.py --env-id gymnax:Breakout-MinAtar --num-seeds 5   # minatar

Discrete or continuous SQL is picked from the task's action space.
The presets, and what each one chose, are in `offpolicy_ac.presets.sql`; the runs behind
them in docs/benchmarks.md and results/notes/.
"""

from offpolicy_ac.cli import parse_args
from offpolicy_ac.cli import script_main
from offpolicy_ac.presets import sql


def parse(argv=None) -> sql.Args:
  """The command line (sys.argv's, or `argv`) as this script reads it, without training;
  -h/--help and --help-all print the help and exit."""
  return parse_args(
      sql.Args, sql.PRESETS, argv=argv, description=__doc__, env_presets=sql.ENV_PRESETS
  )


if __name__ == "__main__":
  # One line and exit code 2 for a refused run; exit_process skips the slow teardown.
  script_main(parse, sql.run)
