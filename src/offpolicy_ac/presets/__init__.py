"""The experiment scripts' settings, importable: one module per algorithm, each with the
script's command-line dataclass `Args`, its named `PRESETS`, the `ENV_PRESETS` an `--env-id`
selects, and `run(args, **run_kwargs)`, which composes the agent and calls
`training.run_experiment`. `experiments/<name>.py` parses its command line into these
(`cli.parse_args`) and calls `run`; tests, benchmarks and notebooks start from the
same values.

    import dataclasses
    from offpolicy_ac.presets import impala

    args = impala.PRESETS["pendulum"]
    args = dataclasses.replace(args, train=args.train.replace(seed=1), run_dir="runs/p1")
    impala.run(args)    # = python experiments/impala.py --preset pendulum --seed 1 ...

`common` holds the task settings IMPALA's and ACER's presets share.
"""

from offpolicy_ac.presets import acer
from offpolicy_ac.presets import common
from offpolicy_ac.presets import impala
from offpolicy_ac.presets import sqil
from offpolicy_ac.presets import sql

__all__ = ["acer", "common", "impala", "sql", "sqil"]
