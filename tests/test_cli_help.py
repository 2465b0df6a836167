"""The training scripts' help: a short `--help` (the common flags of each group, with the
defaults of the selected preset, under 80 lines) and `--help-all` (tyro's listing of every
flag), both free of the library's internal names."""

import dataclasses
from pathlib import Path
import re
import shlex

import pytest
from scripts import load_script

from offpolicy_ac import cli
from offpolicy_ac import presets
from offpolicy_ac.cli import parse_args
from offpolicy_ac.training.config import AUTO_EVALUATIONS

SCRIPTS = ("impala", "acer", "sql", "sqil")
BASE = {"sqil": ["--demos", "demos.npz"]}  # the flags a script requires
GROUPS = [title for title, _ in cli.HELP_GROUPS]
# Names of the library's internals, other frameworks and constants, which a user cannot act on.
JARGON = ("ALF's", "MARO's", "AUTO_EVALUATIONS", "TrainConfig.", "vmap_unsupported_reason",
          "eval_interval", "training.make_train", "agents.hyperparams", "FIELD_FLAGS")  # fmt: skip


@pytest.fixture(scope="module", params=SCRIPTS)
def script(request):
  return request.param, load_script(request.param)


def _help(module, argv, capsys, columns=100, monkeypatch=None):
  if monkeypatch is not None:
    monkeypatch.setenv("COLUMNS", str(columns))
  with pytest.raises(SystemExit) as exit_info:
    module.parse(argv)
  assert exit_info.value.code in (0, None)
  return capsys.readouterr().out


def _plain(text):
  """Help text without tyro's box drawing, on one line."""
  return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def _entries(short):
  """{flag: its text, continuation lines joined} of the short help's flag lines."""
  entries, current = {}, None
  for line in short.splitlines():
    if line.startswith("  --"):
      current = line.split()[0]
      entries[current] = line
    elif line.startswith("    ") and current and not line.lstrip().startswith("python "):
      entries[current] += " " + line.strip()
    else:
      current = None
  return {flag: " ".join(text.split()) for flag, text in entries.items()}


def _normal(args):
  """A parsed value's fields as a dict, sequences as tuples (tyro gives lists)."""

  def tuples(value):
    if isinstance(value, dict):
      return {k: tuples(v) for k, v in value.items()}
    return tuple(tuples(v) for v in value) if isinstance(value, (list, tuple)) else value

  return tuples(dataclasses.asdict(args))


def _leaves(value):
  """(field name, value) of every leaf field of a dataclass value."""
  for f in dataclasses.fields(value):
    current = getattr(value, f.name)
    if dataclasses.is_dataclass(current):
      yield from _leaves(current)
    else:
      yield f.name, current


@pytest.mark.parametrize("columns", [80, 100])
def test_short_help_is_short_names_its_groups_and_the_full_listing(script, columns, capsys,
                                                                   monkeypatch):  # fmt: skip
  name, module = script
  monkeypatch.setattr(cli.sys, "argv", [f"experiments/{name}.py"])
  short = _help(module, ["--help"], capsys, columns, monkeypatch)
  lines = short.splitlines()
  assert len(lines) < 80, f"{name}.py --help is {len(lines)} lines:\n{short}"
  for title in GROUPS:
    assert f"\n{title}:\n" in short
  assert lines[0] == f"usage: experiments/{name}.py [--preset NAME] [FLAGS]"
  assert lines[-1] == f"Every flag, with what it does: experiments/{name}.py --help-all"
  flags_from = lines.index(f"{GROUPS[0]}:")
  too_wide = [line for line in lines[flags_from:] if len(line) > columns]
  assert not too_wide
  entries = _entries(short)
  assert {"--env-id", "--total-env-steps", "--seed", "--learning-rate", "--preset",
          "--run-dir", "--[no-]resume", "--eval-every", "--actors"} <= set(entries)  # fmt: skip
  assert all(len(text) > len(flag) + 12 for flag, text in entries.items()), entries  # described


def test_every_short_help_name_is_a_field_of_some_script():
  fields = {cli.PRESET}
  for name in SCRIPTS:
    fields |= {f for f, _ in _leaves(next(iter(getattr(presets, name).PRESETS.values())))}
  unknown = {n for _, names in cli.HELP_GROUPS for n in names} - fields
  assert not unknown, f"HELP_GROUPS names fields no script has: {sorted(unknown)}"


def _preset_cases():
  return [(name, preset) for name in SCRIPTS for preset in
          [None, *getattr(presets, name).PRESETS]]  # fmt: skip


@pytest.mark.parametrize("name, preset", _preset_cases())
def test_short_help_shows_the_selected_presets_defaults(name, preset, capsys):
  """Every default the short help shows, passed back as a flag, changes nothing: the flags
  are the parser's and the defaults the preset's."""
  module = load_script(name)
  chosen = ["--preset", preset] if preset else []
  base = [*chosen, *BASE.get(name, [])]
  entries = _entries(_help(module, [*chosen, "--help"], capsys))
  expected = module.parse(base)
  values = dict(_leaves(expected))
  argv = list(base)
  for flag, text in entries.items():
    found = re.search(r"\(default: (.*?)\)(?: |$)", text)
    if flag == "--preset":
      assert found and found.group(1) == (preset or "none"), text
      continue
    field = flag.removeprefix("--").removeprefix("[no-]").replace("-", "_")
    field = "lambda_" if field == "lambda" else field
    assert field in values, f"{flag}: no field {field}"
    if values[field] is None and (found is None or found.group(1) != "None"):
      assert "default" in text, f"{flag} shows no default: {text}"  # said in its words
      continue
    if values[field] == () or flag in base:
      continue
    assert found, f"{flag} shows no default: {text}"
    shown = found.group(1)
    if flag.startswith("--[no-]"):
      argv.append(f"--{'' if shown == 'True' else 'no-'}{flag.removeprefix('--[no-]')}")
    else:
      argv += [flag, *shlex.split(shown)]
  assert len(argv) > len(base) + 20
  capsys.readouterr()
  assert _normal(module.parse(argv)) == _normal(expected), f"{shlex.join(argv)} changed them"


@pytest.mark.parametrize("name", ["impala", "acer", "sql", "sqil"])
def test_the_short_help_of_a_pixel_preset_leaves_out_the_mlp_sizes(name, capsys):
  """The atari preset's CNN torso has no layers --hidden-sizes sizes (the flag is refused
  with it): its help listed the flag with the mlp's default."""
  base = BASE.get(name, [])
  assert "--hidden-sizes" in _entries(_help(load_script(name), [*base, "--help"], capsys))
  atari = _entries(_help(load_script(name), [*base, "--preset", "atari", "--help"], capsys))
  assert "--hidden-sizes" not in atari and "--env-id" in atari


@pytest.mark.parametrize("preset", [None, *presets.sqil.PRESETS])
def test_sqils_demos_are_required_under_every_preset(preset, capsys):
  """A preset leaves --demos empty for the command line to fill: the help said nothing."""
  chosen = ["--preset", preset] if preset else []
  entries = _entries(_help(load_script("sqil"), [*chosen, "--help"], capsys))
  assert entries["--demos"].endswith("(required)"), entries["--demos"]


def test_short_help_of_a_preset_an_env_id_selects_shows_that_env_id(capsys):
  entries = _entries(_help(load_script("impala"), ["--env-id", "gymnax:Asterix-MinAtar", "--help"],
                           capsys))  # fmt: skip
  assert "(default: gymnax:Asterix-MinAtar)" in entries["--env-id"]


def test_help_all_lists_every_flag_and_the_short_help_lists_only_real_ones(script, capsys):
  name, module = script
  full = _plain(_help(module, ["--help-all"], capsys))
  short = _help(module, ["--help"], capsys)
  default = next(iter(getattr(presets, name).PRESETS.values()))
  derived = getattr(getattr(presets, name).Args, "DERIVED_FLAGS", {})
  for field, value in _leaves(default):
    flag = "--" + field.replace("_", "-").rstrip("-")
    if flag in derived:  # the script sets it, and refuses the flag: not listed
      assert not re.search(rf"{re.escape(flag)}[ ,]", full), f"--help-all lists {flag}"
      continue
    assert re.search(rf"{re.escape(flag)}[ ,]", full), f"--help-all lacks {flag}"
    if isinstance(value, bool):
      assert f"--no-{flag[2:]}" in full
  assert "--preset {" in full and "show this help message" in full
  for flag in _entries(short):
    bare = flag.replace("[no-]", "")
    assert re.search(rf"{re.escape(bare)}[ ,]", full), f"{flag} is not a flag of {name}.py"


def test_help_speaks_in_users_words(script, capsys):
  name, module = script
  for argv in (["--help"], ["--help-all"], ["--preset", "atari", "--help"]):
    text = _plain(_help(module, argv, capsys))
    used = [word for word in JARGON if word in text]
    assert not used, f"{shlex.join(argv)} speaks of {used}"
  full = _plain(_help(module, ["--help-all"], capsys))
  assert f"about {AUTO_EVALUATIONS} over the run" in full  # the docstring's number is the code's
  # The short help names settings by their flags, not as Python spells them (lambda_).
  short = _plain(_help(module, ["--help"], capsys))
  fields = {field for field, _ in _leaves(module.parse(BASE.get(name, [])))}
  assert not [w for w in re.findall(r"[\w-]+", short) if w in fields and "_" in w], short


def test_help_without_presets_and_after_a_double_dash(capsys):
  @dataclasses.dataclass(frozen=True)
  class Args:
    env_id: str = "CartPole-v1"
    """The task."""
    learning_rate: float = 1e-3

  with pytest.raises(SystemExit):
    parse_args(Args, argv=["-h"])
  short = capsys.readouterr().out
  assert "  --env-id STR" in short and "The task (default: CartPole-v1)" in short
  assert "--learning-rate FLOAT" in short and "(default: 0.001)" in short
  assert "--preset" not in short and short.rstrip().endswith("--help-all")
  assert cli._help_request(["--", "--help"]) is None
  assert cli._help_request(["--help", "--help-all"]) == "--help-all"


def test_summary_is_the_first_sentence_or_clause_outside_brackets():
  assert cli.summary("Discount factor.") == "Discount factor."
  assert cli.summary("Seeds (a, b; c). More.") == "Seeds (a, b; c)."
  assert cli.summary("Sweep FIELD=V1,V2,...; repeat it") == "Sweep FIELD=V1,V2,..."
  assert cli.summary("About 0.7 s, or\n  more. Then") == "About 0.7 s, or more."


def test_batched_stepping_says_its_runs_do_not_resume_exactly(capsys):
  """--env-batch-size lets thread timing pick the environments of each step: its runs are not
  reproducible, which the flag and the pages that promise an exact resume must say."""
  full = _plain(_help(load_script("impala"), ["--help-all"], capsys))
  flag = full[full.index("--env-batch-size INT") :][:400]
  assert "not reproducible" in flag and "resumed run" in flag
  root = Path(__file__).resolve().parent.parent
  for page in ("docs/concepts/resume.md", "docs/concepts/workflows.md", "docs/getting_started.md"):
    text = " ".join((root / page).read_text().split())
    exact = text.index("exact")
    assert "`--env-batch-size`" in text[exact : exact + 600], f"{page} promises exactness"


@pytest.mark.parametrize("script", ["evaluate", "plot", "record_demos"])
def test_the_utility_scripts_take_help_all_as_their_help(script):
  """Their --help lists every flag; --help-all, the training scripts' full listing, was
  refused as unrecognized."""
  import pathlib
  import subprocess
  import sys

  path = pathlib.Path(__file__).parents[1] / "experiments" / f"{script}.py"
  runs = [subprocess.run([sys.executable, str(path), flag], capture_output=True, text=True,
                         timeout=120) for flag in ("--help", "--help-all")]  # fmt: skip
  assert [r.returncode for r in runs] == [0, 0], runs[1].stderr[-2000:]
  assert runs[0].stdout == runs[1].stdout and runs[0].stdout.startswith("usage:")


def test_one_line_paragraphs_joins_a_docstrings_lines_but_not_its_lists_or_commands():
  text = """First line
  goes on (here).

  - an item
  - another,
    continued
      python run.py --flag
  Last `word`."""
  assert cli._one_line_paragraphs(text) == (
      "First line goes on (here).\n\n- an item\n- another,\n  continued\n    python run.py "
      "--flag\nLast `word`."
  )


def test_full_help_keeps_each_fields_sentences_whole(capsys, monkeypatch):
  """tyro kept each line of a field's docstring (the string under it) a line of the help,
  where the next started with its indentation: sentences were cut mid-line."""
  module = load_script("impala")
  monkeypatch.setenv("COLUMNS", "400")  # room for each sentence on one line
  full = _help(module, ["--help-all"], capsys)
  assert ("Environments stepped together. With actor threads (--actors pools or async), each "
          "actor steps this many. (default: 16)") in full  # fmt: skip
  evaluate = load_script("evaluate")
  with pytest.raises(SystemExit):
    cli.parse_plain(evaluate.Args, evaluate.__doc__, ["--help"])
  plain = capsys.readouterr().out
  assert ("Evaluate the best-evaluated parameters (best_params.msgpack) instead of the final "
          "ones. (default: False)") in plain  # fmt: skip
  assert ("as the in-training evaluation does (`training/evaluation.py`); prints each "
          "episode's return") in plain  # the script's description too  # fmt: skip
