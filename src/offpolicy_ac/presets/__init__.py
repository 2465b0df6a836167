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

`common` holds the task settings IMPALA's and ACER's presets share; `check_command`
checks a script's command line without training.
"""

import contextlib
import io
import itertools
from typing import Any
from typing import Sequence

from offpolicy_ac.agents.base import check_config
from offpolicy_ac.cli import parse_args
from offpolicy_ac.presets import acer
from offpolicy_ac.presets import common
from offpolicy_ac.presets import impala
from offpolicy_ac.presets import sqil
from offpolicy_ac.presets import sql
from offpolicy_ac.training.sources import task_spec

__all__ = ["acer", "check_command", "common", "impala", "sql", "sqil"]

_ALGORITHMS = {"impala": impala, "acer": acer, "sql": sql, "sqil": sqil}


def check_command(algo: str, argv: Sequence[str]) -> Any:
  """Reads `argv` as `experiments/<algo>.py` reads its command line (`cli.parse_args` with
  the algorithm's `Args`, `PRESETS` and `ENV_PRESETS`, printing nothing) and checks the
  training config it would run (`TrainConfig.validate`; a JAX environment's task id by
  building its spec) and its agent config (the factory's `agents.base.check_config`),
  without training; returns its
  `Args`. A benchmark that launches runs checks them all with it before the first.

  Raises:
    ValueError: an unknown `algo`; or, naming the command line, an unknown `--preset`, a
      preset for another task, or a training config `TrainConfig.validate` refuses (e.g. a
      budget below one iteration), or an agent config its factory refuses (e.g. --gamma 2).
      Flags tyro cannot parse are a ValueError too, with tyro's message.
    SystemExit: -h/--help (code 0; the help is not printed).
  """
  if isinstance(argv, str):
    raise TypeError(f"argv is a sequence of arguments (e.g. shlex.split), got the str {argv!r}")
  if algo not in _ALGORITHMS:
    raise ValueError(f"unknown algorithm {algo!r}; known: {sorted(_ALGORITHMS)}")
  module = _ALGORITHMS[algo]
  command = f"{algo}.py {' '.join(argv)}"
  errors = io.StringIO()  # tyro's parse errors
  try:  # (stdout: the preset an --env-id selects)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
      args = parse_args(module.Args, module.PRESETS, argv=argv,
                        env_presets=module.ENV_PRESETS, prog=algo)  # fmt: skip
    train = getattr(args, "resolved_train", args.train)  # ACER: its replay ratio's updates
    train.validate()  # (an envpool task id too)
    if train.compiled:  # a JAX environment's id, which only building its spec resolves
      task_spec(train)
    check_config(args.agent, type(args.agent), f"{algo}.py")  # what its factory refuses
  except ValueError as e:
    raise ValueError(f"{command}: {e}") from None
  except SystemExit as e:
    if e.code:  # tyro's box (a title, a rule, the message, a rule, ...), or one line
      lines = [line.strip(" │╭╮╰╯|+") for line in errors.getvalue().splitlines()]
      lines = [line for line in lines if line]
      body = list(itertools.takewhile(lambda line: line.strip("-─"), lines[2:]))
      said = e.code if isinstance(e.code, str) else " ".join(body)  # SystemExit(message)
      raise ValueError(f"{command}: {said or 'cannot parse'}") from None
    raise
  return args
