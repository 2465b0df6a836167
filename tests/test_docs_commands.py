"""Every command written in the documentation parses with its script's own parser.

The commands are the lines that run `experiments/<script>.py` (or `python -m offpolicy_ac...`)
in README.md and docs/**/*.md (shell code blocks, and inline code that starts with such a
command) and in the examples of the scripts' docstrings (their --help). Nothing trains: a
training script's `parse(argv)` (what its main runs) reads the command line and the run's
settings are validated as a run would before it starts; the other scripts' parser
(`cli.parse_plain`) reads theirs. Line continuations (`\\`), `&&`, `;`, `&` and comments are
handled as a shell would; placeholders such as `<task>` or `$seed` get a value from
`PLACEHOLDERS`, which must stay small and in use.
"""

import ast
import contextlib
import dataclasses
import functools
import io
import pathlib
import re
import shlex

import pytest
from scripts import load_script

from offpolicy_ac import cli

ROOT = pathlib.Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SCRIPTS = sorted((ROOT / "experiments").glob("*.py"))
TRAINING_SCRIPTS = ("impala", "acer", "sql", "sqil")
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console", "text")

PLACEHOLDERS = {
    "<task>": "HalfCheetah-v4",
    "<k>": "1",
    "<algo>": "impala",
    "<file>": "demos.npz",
    "<run>": "runs/example",
    "$seed": "0",
    "N": "100000",  # a whole word only
    "DIR": "runs/example",  # a whole word only
    "FILE": "demos.npz",  # a whole word only
}
"""A value for each placeholder the documentation writes; `...` (an elision) is dropped."""

SCRIPT = re.compile(r"(?:^|/)experiments/(\w+)\.py$")
SEPARATORS = {"&&", "||", ";", "&", "|"}


@dataclasses.dataclass(frozen=True)
class Command:
  where: str  # file:line
  text: str  # as written, continuation lines joined
  script: str  # the script's name (experiments/<script>.py) or the module after -m
  argv: tuple[str, ...]
  placeholders: tuple[str, ...]  # the placeholders it uses
  error: str = ""  # why the line cannot be read as a shell command
  partial: bool = False  # prose naming a script's flags (`experiments/evaluate.py --best`)


def _substitute(text: str) -> tuple[str, list[str]]:
  used = []
  for name, value in PLACEHOLDERS.items():
    pattern = rf"(?<![\w-]){re.escape(name)}(?![\w-])" if name.isalnum() else re.escape(name)
    text, n = re.subn(pattern, value, text)
    if n:
      used.append(name)
  return text, used


def commands_in(text: str, where: str, partial: bool = False) -> list[Command]:
  """The script commands of one shell line (continuations already joined); `partial`: the
  line names flags of a script rather than a whole command."""
  text = text.strip().removeprefix("$ ")
  substituted, used = _substitute(text)
  if not re.search(r"experiments/\w+\.py|-m offpolicy_ac", substituted):
    return []
  substituted = re.sub(r"\[(--[^\]]*)\]", r"\1", substituted)  # [--optional flags]
  lexer = shlex.shlex(substituted, posix=True, punctuation_chars=";&|")
  lexer.whitespace_split = True
  try:
    tokens = [t for t in lexer if t != "..."]
  except ValueError as e:  # an unclosed quote
    return [Command(where, text, "", (), tuple(used), f"not a shell command: {e}")]
  found, segment = [], []
  for token in [*tokens, ";"]:
    if token not in SEPARATORS:
      segment.append(token)
      continue
    for i, word in enumerate(segment):
      script = SCRIPT.search(word)
      if script:
        argv = tuple(segment[i + 1 :])
        found.append(Command(where, text, script.group(1), argv, tuple(used), "", partial))
        break
      if word == "-m" and i + 1 < len(segment) and segment[i + 1].startswith("offpolicy_ac"):
        found.append(Command(where, text, segment[i + 1], tuple(segment[i + 2 :]), tuple(used)))
        break
    segment = []
  return found


def _shell_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
  """(first line number, line) with `\\` continuations joined."""
  joined, start, parts = [], None, []
  for number, line in lines:
    start = number if start is None else start
    if line.rstrip().endswith("\\"):
      parts.append(line.rstrip()[:-1])
      continue
    joined.append((start, " ".join([*parts, line])))
    start, parts = None, []
  if parts:
    joined.append((start, " ".join(parts)))
  return joined


def markdown_commands(path: pathlib.Path) -> list[Command]:
  """The commands of a markdown file's shell code blocks and of its inline code."""
  name = path.relative_to(ROOT).as_posix()
  found, block, fence, prose = [], None, None, []
  for number, line in enumerate(path.read_text().splitlines(), 1):
    opening = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", line)
    if fence is None and opening:
      fence, language, block = opening.group(1), opening.group(2), []
      prose.append("")
      continue
    if fence is not None:
      if line.strip().startswith(fence):
        if language in SHELL_BLOCKS:
          for start, text in _shell_lines(block):
            found += commands_in(text, f"{name}:{start}")
        fence = None
      else:
        block.append((number, line))
      prose.append("")
      continue
    prose.append(line)
  text = "\n".join(prose)
  for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
    code = " ".join(span.group(1).split())
    run = re.match(r"^(timeout .*?)?\S*python3? (\S*/)?experiments/\w+\.py( |$)", code)
    named = re.match(r"^experiments/\w+\.py \S", code)
    if run or named:
      where = f"{name}:{text.count(chr(10), 0, span.start()) + 1}"
      found += commands_in(code, where, partial=not run)
  return found


def docstring_commands(path: pathlib.Path) -> list[Command]:
  """The example commands of a script's docstring (what its --help shows)."""
  source = path.read_text()
  doc = ast.get_docstring(ast.parse(source), clean=False) or ""
  source_lines = source.splitlines()
  lines = []
  for line in doc.splitlines():
    if line.strip().startswith("python ") or lines and lines[-1][1].rstrip().endswith("\\"):
      head = line.strip()[:40]
      number = next((i for i, s in enumerate(source_lines, 1) if head in s), 1)
      lines.append((number, line.strip()))
  name = path.relative_to(ROOT).as_posix()
  return [c for start, text in _shell_lines(lines) for c in commands_in(text, f"{name}:{start}")]


@functools.cache
def all_commands() -> tuple[Command, ...]:
  found = [c for path in DOCS for c in markdown_commands(path)]
  found += [c for path in SCRIPTS for c in docstring_commands(path)]
  return tuple(found)


@functools.cache
def _script(name: str):
  return load_script(name)


def parse(command: Command) -> None:
  """Parses the command with its script's parser; raises what the script would print."""
  if command.error:
    raise ValueError(command.error)
  if command.script.startswith("offpolicy_ac"):
    raise ValueError(f"no parser known for `python -m {command.script}`: add it to this test")
  if not (ROOT / "experiments" / f"{command.script}.py").exists():
    raise ValueError(f"experiments/{command.script}.py does not exist")
  module = _script(command.script)
  argv = list(command.argv)
  if command.partial:
    unknown = [a.split("=")[0] for a in argv if a.startswith("--")]
    unknown = [flag for flag in unknown if flag not in _flags(command.script)]
    if unknown:
      raise ValueError(f"experiments/{command.script}.py has no flag {', '.join(unknown)}")
    return
  if command.script in TRAINING_SCRIPTS:
    args = module.parse(argv)
    args.train.validate()
    return
  source = (ROOT / "experiments" / f"{command.script}.py").read_text()
  assert re.search(r"\bparse_plain\(\s*Args\b", source), (
      f"experiments/{command.script}.py no longer parses with cli.parse_plain(Args, ...): "
      "teach this test its parser"
  )
  cli.parse_plain(module.Args, "", argv)


@functools.cache
def _flags(name: str) -> frozenset[str]:
  """Every flag of a script, as its full help lists them."""
  module, out = _script(name), io.StringIO()
  with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
    if name in TRAINING_SCRIPTS:
      module.parse(["--help-all"])
    else:
      cli.parse_plain(module.Args, "", ["--help"])
  return frozenset(re.findall(r"--[\w-]+", out.getvalue()))


def _error(command: Command) -> str:
  """'' if the command parses, else the error as the script would print it."""
  out, err = io.StringIO(), io.StringIO()
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      parse(command)
  except SystemExit as e:
    if e.code not in (0, None):
      lines = [line.strip(" │╭╮╰╯─") for line in err.getvalue().splitlines()]
      said = [line for line in lines if line.strip("-") and not line.startswith("For full help")]
      return " ".join(said) or f"exit code {e.code}"
  except Exception as e:  # pylint: disable=broad-except
    return f"{type(e).__name__}: {e}"
  return ""


def test_every_documented_command_parses():
  commands = all_commands()
  assert len(commands) >= 60, f"only {len(commands)} commands found: is the extraction broken?"
  failures = [f"{c.where}: `{c.text}`\n    {_error(c)}" for c in commands if _error(c)]
  assert not failures, "documented commands that do not parse:\n" + "\n".join(failures)


def test_placeholders_stay_few_and_in_use():
  used = {p for c in all_commands() for p in c.placeholders}
  assert len(PLACEHOLDERS) <= 10
  assert set(PLACEHOLDERS) == used, f"unused placeholders: {sorted(set(PLACEHOLDERS) - used)}"


def test_every_script_and_kind_of_source_is_covered():
  commands = all_commands()
  scripts = {c.script for c in commands}
  assert set(TRAINING_SCRIPTS) | {"evaluate", "plot", "record_demos"} <= scripts
  files = {c.where.split(":")[0] for c in commands}
  assert {"README.md", "docs/getting_started.md", "experiments/impala.py"} <= files


@pytest.mark.parametrize(
    "line, expected",
    [
        ("python experiments/impala.py --seed 1   # a comment", [("impala", ["--seed", "1"])]),
        ("python3 -m venv .venv && .venv/bin/python experiments/sql.py --num-seeds 2 &",
         [("sql", ["--num-seeds", "2"])]),
        ("python experiments/acer.py --env-id <task>; python experiments/plot.py runs/ --out-dir p",
         [("acer", ["--env-id", "HalfCheetah-v4"]), ("plot", ["runs/", "--out-dir", "p"])]),
        ("timeout -s INT 3500 python experiments/impala.py ... [--track]",
         [("impala", ["--track"])]),
        ("python -m offpolicy_ac.tool --x 1", [("offpolicy_ac.tool", ["--x", "1"])]),
        (".venv/bin/pip install -e .", []),
    ],
)  # fmt: skip
def test_commands_are_read_as_a_shell_reads_them(line, expected):
  found = [(c.script, list(c.argv)) for c in commands_in(line, "here:1")]
  assert found == expected


def test_a_bad_command_names_its_file_line_and_error():
  (command,) = commands_in("python experiments/impala.py --no-such-flag 1", "docs/x.md:7")
  assert "--no-such-flag" in _error(command) and command.where == "docs/x.md:7"
  (command,) = commands_in("python experiments/impala.py --num-envs 0", "docs/x.md:8")
  assert "num_envs must be a positive int" in _error(command)
  (command,) = commands_in("python -m offpolicy_ac.tool", "docs/x.md:9")
  assert "no parser known" in _error(command)
