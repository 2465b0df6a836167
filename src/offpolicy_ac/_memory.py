"""Memory free for new arrays, for refusing sizes that cannot fit before they are
allocated (an allocation error, or the kernel's out-of-memory kill, ends a process with
no word of which setting asked for too much)."""

from __future__ import annotations

from typing import Any
from typing import Optional

import jax


def free_memory_bytes(device: Optional[jax.Device] = None) -> Optional[int]:
  """Bytes free for new arrays on `device` (default: the first local device): its
  allocator's limit less what is in use where JAX reports them (GPUs, TPUs), else, for a
  CPU, the host's available memory (`MemAvailable` in /proc/meminfo); None where neither is
  known."""
  device = jax.local_devices()[0] if device is None else device
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except  (backends without allocator statistics)
    stats = None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
  if device.platform != "cpu":
    return None
  return host_available_bytes()


def host_available_bytes() -> Optional[int]:
  """The host's available memory (`MemAvailable` in /proc/meminfo); None where unknown."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def check_device_fits(need: int, *, what: str, details: str, hint: str) -> None:
  """`check_fits` of `need` bytes against the free memory of the first local device (the
  default device, where a run's arrays go)."""
  device = jax.local_devices()[0]
  check_fits(need, free_memory_bytes(device), what=what, details=details,
             free_said=f"free on {device.platform}", hint=hint)  # fmt: skip


def program_bytes(compiled: Any) -> Optional[int]:
  """Bytes a compiled XLA program (`jax.stages.Compiled`) allocates as it runs, by XLA's
  memory analysis: its outputs and temporaries, less the outputs written over donated
  arguments; None where its backend has no analysis."""
  try:
    stats = compiled.memory_analysis()
  except (NotImplementedError, RuntimeError, AttributeError):
    return None
  if stats is None:
    return None
  return stats.output_size_in_bytes + stats.temp_size_in_bytes - stats.alias_size_in_bytes


def gib(num_bytes: int) -> str:
  """`num_bytes` in GiB, one decimal."""
  return f"{num_bytes / 2**30:,.1f} GiB"


class DoesNotFit(ValueError):
  """Settings that need more memory than is free (`check_fits`): a refusal of the run, raised
  before the memory is asked for."""


def check_fits(need: int, free: Optional[int], *, what: str, details: str, free_said: str,
               hint: str) -> None:  # fmt: skip
  """Raises DoesNotFit("{what} {need} ({details}), more than the {free} {free_said}: {hint}")
  where `need` bytes exceed `free` (None: unknown, nothing is refused)."""
  if free is not None and need > free:
    raise DoesNotFit(
        f"{what} {gib(need)} ({details}), more than the {gib(free)} {free_said}: {hint}"
    )
