"""Wall-clock time since the process was launched (imports included)."""

from __future__ import annotations

import os
import time

_IMPORT_TIME = time.perf_counter()


def _process_age_at_import() -> float:
  """Seconds between process launch and this module's import (Linux /proc)."""
  try:
    with open("/proc/self/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # field 22 overall: starttime in clock ticks
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    return max(0.0, age - (time.perf_counter() - _IMPORT_TIME))
  except (OSError, ValueError, IndexError):
    return 0.0


_AGE_AT_IMPORT = _process_age_at_import()


def seconds_since_launch() -> float:
  """Wall-clock seconds since the process started (falls back to since import)."""
  return _AGE_AT_IMPORT + time.perf_counter() - _IMPORT_TIME
