r"""SQIL on an envpool task or a JAX environment, from recorded demonstrations.

    python experiments/record_demos.py --run-dir runs/sql-cartpole --episodes 10 --out demos.npz
    python experiments/sqil.py --demos demos.npz --env-id CartPole-v1 --run-dir runs/sqil
    python experiments/sqil.py --preset cartpole-v0 --demos demos-v0.npz  # DI-engine's v0
    python experiments/sql.py --preset pendulum --run-dir runs/sql-pendulum
    python experiments/record_demos.py --run-dir runs/sql-pendulum --out pendulum.npz
    python experiments/sqil.py --preset pendulum --demos pendulum.npz   # continuous actions

The demonstrations must be of the run's task (`--env-id`): record them from a run on it.
On a JAX environment the run is one compiled program:

    python experiments/sqil.py --preset cartpole-v0 --env-id gymnax:CartPole-v1 \
        --demos gymnax-demos.npz   # demos of a gymnax:CartPole-v1 run

HalfCheetah-v4, from IMPALA's best seed of three (some stop near 1,000, others pass 3,000):

    python experiments/impala.py --env-id HalfCheetah-v4 --preset mujoco-pg --num-seeds 3 \
        --run-dir runs/impala-hc
    python experiments/record_demos.py --run-dir runs/impala-hc/seed1 --out hc.npz \
        --action-box-fraction 0.9
    python experiments/sqil.py --env-id HalfCheetah-v4 --demos hc.npz   # the halfcheetah preset

From a stronger HalfCheetah demonstrator (SQL's,
results/mujoco_sqil/mujoco_halfcheetah_sql_demos.npz, return 6,392) weigh the agent's data
less and learn faster: `--mini-batch-size 16 --demo-batch-size 48 --alpha 0.025
--learning-rate 8e-4`. The presets, and what each one chose, are in
`offpolicy_ac.presets.sqil`; the runs behind them in docs/benchmarks.md and results/notes/.
"""

from offpolicy_ac.cli import parse_args
from offpolicy_ac.cli import script_main
from offpolicy_ac.presets import sqil


def parse(argv=None) -> sqil.Args:
  """The command line (sys.argv's, or `argv`) as this script reads it, without training;
  -h/--help and --help-all print the help and exit."""
  return parse_args(
      sqil.Args, sqil.PRESETS, argv=argv, description=__doc__, env_presets=sqil.ENV_PRESETS
  )


if __name__ == "__main__":
  # One line and exit code 2 for a refused run; exit_process skips the slow teardown.
  script_main(parse, sqil.run)
