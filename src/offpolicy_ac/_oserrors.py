"""Errors of writes that name the file they were writing."""

from __future__ import annotations

import contextlib
import os


@contextlib.contextmanager
def naming(path: str | os.PathLike):
  """An OSError raised in the context that names no file (a write to an open file: a full
  disk) names `path`, so that the scripts' one line says where (`cli.script_main`). One
  without an errno keeps its text as it is."""
  try:
    yield
  except OSError as e:
    if e.filename is None and e.errno is not None:
      e.filename = os.fspath(path)
    raise
