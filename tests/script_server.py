"""Runs experiment scripts from the command line, each in a process of its own, without
importing the library anew for each one.

A test of a script's command line (a refused flag, `--help`) checks what a user sees: the
exit code, stdout and stderr of `python experiments/<script>.py ...`. Importing JAX, flax,
optax, envpool and the presets takes about 2 s of each such process on a 2-core CPU, most
of a refused command's time. `run_script` gives the same outcome from a process forked off
a server that has made those imports once (one server per test process, started on first
use): the script runs as `__main__` with its `sys.argv`, working directory, `sys.path[0]`,
standard streams (stdin empty, stdout and stderr captured) and exit code as `python
<script>` would give them, and a crash or a kill ends its own process only. The server
forks before any JAX backend exists (a backend's threads make `fork` unsafe); each script
starts its own.

`OFFPOLICY_AC_TEST_FRESH_PROCESSES=1` runs each script as `python <script>` instead, the
reference that `tests/test_script_server.py` checks the forked runs against.
"""

import atexit
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback

FRESH = os.environ.get("OFFPOLICY_AC_TEST_FRESH_PROCESSES") == "1"
PRELOADED = ("offpolicy_ac.cli", "offpolicy_ac.presets", "offpolicy_ac.training",
             "offpolicy_ac.envs", "offpolicy_ac.demos", "envpool")  # fmt: skip


def run_script(script, args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
  """`python <script> <args...>` run in `cwd`: its exit code, stdout and stderr (text),
  from a forked process (`run_forked`), or with OFFPOLICY_AC_TEST_FRESH_PROCESSES=1 from
  `python` itself (`run_fresh`). Raises `subprocess.TimeoutExpired` (the script killed)
  after `timeout` seconds."""
  return (run_fresh if FRESH else run_forked)(script, args, cwd, timeout)


def run_fresh(script, args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
  """`run_script` by `python <script> <args...>` itself."""
  return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                        stdin=subprocess.DEVNULL, text=True, timeout=timeout, cwd=cwd)  # fmt: skip


def run_forked(script, args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
  """`run_script` in a process forked off this test process's server."""
  return _server().run([str(script), *map(str, args)], str(cwd or os.getcwd()), timeout)


class _Server:
  """The server process, spoken to in JSON lines over its stdin and stdout."""

  def __init__(self):
    server = os.path.abspath(__file__)  # run in its folder, not a test's (deleted later)
    self.process = subprocess.Popen(
        [sys.executable, server],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=os.path.dirname(server),
    )
    self._pending = b""
    self._read_line(timeout=600)  # "ready": the imports are done

  def run(self, argv, cwd, timeout):
    with tempfile.TemporaryDirectory() as tmp:
      out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
      request = {"argv": argv, "cwd": cwd, "stdout": out, "stderr": err}
      self.process.stdin.write(json.dumps(request).encode() + b"\n")
      self.process.stdin.flush()
      pid = int(self._read_line(timeout=60))
      try:
        returncode = int(self._read_line(timeout=timeout))
      except subprocess.TimeoutExpired:
        os.kill(pid, signal.SIGKILL)
        self._read_line(timeout=60)
        raise subprocess.TimeoutExpired([sys.executable, *argv], timeout) from None
      read = lambda path: pathlib.Path(path).read_text(errors="replace")
      return subprocess.CompletedProcess([sys.executable, *argv], returncode, read(out), read(err))

  def _read_line(self, timeout):
    deadline = time.monotonic() + timeout
    fd = self.process.stdout.fileno()
    while b"\n" not in self._pending:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise subprocess.TimeoutExpired("script server", timeout)
      chunk = os.read(fd, 4096)
      if not chunk:
        raise RuntimeError(f"the script server ended (exit code {self.process.wait()})")
      self._pending += chunk
    line, self._pending = self._pending.split(b"\n", 1)
    return line.decode()

  def close(self):
    self.process.stdin.close()
    self.process.wait(timeout=60)


_SERVER = []


def _server():
  if not _SERVER:
    _SERVER.append(_Server())
    atexit.register(_SERVER[0].close)
  return _SERVER[0]


def _run_forked(request):
  """In the forked process: runs the script as `python <script>` would, then ends."""
  code = 1
  try:
    os.chdir(request["cwd"])
    streams = [(os.open(os.devnull, os.O_RDONLY), 0)]
    for name, fd in (("stdout", 1), ("stderr", 2)):
      streams.append((os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd))
    for opened, fd in streams:
      os.dup2(opened, fd)
      os.close(opened)
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = _main(sys.argv[0])
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # pylint: disable=broad-except
        pass
    os._exit(code)


def _main(path):
  """Runs `path` as `__main__`: its exit code, as the interpreter gives it."""
  import runpy  # pylint: disable=import-outside-toplevel

  try:
    runpy.run_path(path, run_name="__main__")
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      return e.code or 0
    print(e.code, file=sys.stderr)
    return 1
  except BaseException as e:  # pylint: disable=broad-except
    # From the script's own frames on, as the interpreter prints it.
    frames = e.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename != path:
      frames = frames.tb_next
    traceback.print_exception(type(e), e, frames or e.__traceback__)
    if isinstance(e, KeyboardInterrupt):  # the interpreter ends by SIGINT then
      sys.stderr.flush()
      signal.signal(signal.SIGINT, signal.SIG_DFL)
      os.kill(os.getpid(), signal.SIGINT)
    return 1
  return 0


def _serve():
  import importlib  # pylint: disable=import-outside-toplevel

  for name in PRELOADED:
    importlib.import_module(name)
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel

  if xla_bridge.backends_are_initialized():  # its threads would not survive a fork
    sys.exit(f"importing {PRELOADED} started a JAX backend: the scripts cannot be forked")
  replies = os.fdopen(os.dup(1), "w", buffering=1)
  requests = os.fdopen(os.dup(0), "r")
  devnull = os.open(os.devnull, os.O_RDWR)
  os.dup2(devnull, 0)  # the forked scripts get their own; these never reach them
  os.dup2(devnull, 1)
  os.close(devnull)
  replies.write("ready\n")
  for line in requests:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      replies.close()
      requests.close()
      _run_forked(request)
    replies.write(f"{pid}\n")
    status = os.waitpid(pid, 0)[1]
    replies.write(f"{os.waitstatus_to_exitcode(status)}\n")


if __name__ == "__main__":
  _serve()
