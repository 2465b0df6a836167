"""Data-parallel learners over devices and hosts, on JAX's own runtime.

    initialize_distributed(num_processes=2, process_id=i, coordinator_address="host:1234")
    dp = DataParallel.create(learner_devices=2)      # 2 local devices per process
    state = dp.replicate(state)                      # identical on every device
    batch = dp.shard(local_traj)                     # [T+1, B_local] -> global [T+1, B]
    update = dp.jit(lambda s, b: agent.update(s, dp.constrain(b)))
    state, metrics = update(state, batch)            # gradients all-reduced by XLA

One mesh axis, "data", spans `learner_devices` devices of every process. The
learner state (parameters, optimizer state, keys, replay) is replicated; a batch
is split along its batch axis (axis 1 of time-major [T+1, B, ...] data). Under
`jit`, XLA's SPMD partitioner runs the update on each shard and all-reduces
wherever the math needs the whole batch (the mean of the loss, hence the
gradients), so an update on N devices computes the single-device update, to
float reassociation, and leaves parameters identical everywhere. Each process
feeds its own actors' data (`jax.make_array_from_process_local_data`); the
global batch is the concatenation over processes in process order.

With one device and one process every method is the identity (or a
`device_put`), so the single-device path pays nothing.

On CPU, `ensure_cpu_devices(n)` asks for n host devices before JAX starts its
backend (same effect as XLA_FLAGS=--xla_force_host_platform_device_count=n), and
processes exchange collectives with gloo.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import time
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Optional
import zlib

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

AXIS = "data"
JOIN_TIMEOUT_S = 120  # how long the processes of a job wait for each other to join
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]+):\d{1,5}$")  # host:port or [IPv6]:port


def _backend_started() -> bool:
  try:
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel

    return bool(xla_bridge._backends)  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except
    return True  # cannot tell: assume it has (and set nothing)


def check_distributed_args(
    num_processes: int, process_id: int, coordinator_address: Optional[str]
) -> None:
  """Raises ValueError for an inconsistent multi-process setting."""
  if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
    raise ValueError(f"num_processes must be a positive int, got {num_processes!r}")
  if (
      isinstance(process_id, bool)
      or not isinstance(process_id, int)
      or not (0 <= process_id < num_processes)
  ):
    raise ValueError(f"process_id must lie in [0, {num_processes}), got {process_id!r}")
  if num_processes > 1:
    if not coordinator_address or not _ADDRESS.match(coordinator_address):
      raise ValueError(
          "num_processes > 1 needs coordinator_address HOST:PORT or [IPV6]:PORT (process "
          f"0's address), got {coordinator_address!r}"
      )
    if not 1 <= int(coordinator_address.rsplit(":", 1)[1]) <= 65535:
      raise ValueError(f"coordinator_address {coordinator_address}: a port lies in [1, 65535]")
  elif process_id != 0:
    raise ValueError("process_id must be 0 with one process")
  elif coordinator_address is not None:
    raise ValueError("coordinator_address applies to a multi-process job (num_processes > 1)")


def initialize_distributed(
    num_processes: int,
    process_id: int,
    coordinator_address: Optional[str],
    timeout_s: int = JOIN_TIMEOUT_S,
) -> None:
  """Joins a `jax.distributed` job (nothing to do for one process).

  Must run before any JAX computation. Every process calls it with the same
  `num_processes` and `coordinator_address` and its own `process_id`; process 0
  hosts the coordinator. On CPU, collectives go through gloo.

  Raises:
    ValueError: bad `num_processes`, `process_id` or `coordinator_address`.
    RuntimeError: a JAX backend is already running in this process.
    ConnectionError: (process_id > 0) no coordinator accepted connections within
      `timeout_s`. (Once connected, JAX itself ends every process, with a native stack,
      when one does not join within `timeout_s`.)
  """
  check_distributed_args(num_processes, process_id, coordinator_address)
  if num_processes == 1:
    return
  if jax.distributed.is_initialized():
    return  # already joined (e.g. a second run in the same process)
  if _backend_started():
    raise RuntimeError(
        "initialize_distributed must run before any JAX computation "
        "(a JAX backend is already running in this process)"
    )
  deadline = time.monotonic() + timeout_s
  if process_id > 0:  # JAX would abort the process, with a native stack, after its timeout
    _wait_for_coordinator(coordinator_address, process_id, num_processes, deadline, timeout_s)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
      initialization_timeout=max(1, round(deadline - time.monotonic())),
  )


def _wait_for_coordinator(address: str, process_id: int, num_processes: int, deadline: float,
                          timeout_s: float) -> None:  # fmt: skip
  """Returns once the coordinator (process 0) accepts connections at `address`.

  Raises:
    ConnectionError: it did not by `deadline` (`time.monotonic()`; `timeout_s` after the
      start).
  """
  host, port = address.rsplit(":", 1)
  while True:
    try:
      with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
        return
    except OSError:
      if time.monotonic() > deadline:
        raise ConnectionError(
            f"process {process_id} of {num_processes} found no coordinator at {address} within "
            f"{timeout_s:g} s: start process 0, which hosts it, with the same "
            "--coordinator-address"
        ) from None
      time.sleep(0.5)


def _devices_by_process() -> dict[int, list]:
  """{process index: its devices}, in process order, each process's in `jax.devices()`'s
  order (the same on every process)."""
  by_process = {}
  for d in jax.devices():
    by_process.setdefault(d.process_index, []).append(d)
  return dict(sorted(by_process.items()))


@functools.lru_cache(maxsize=None)
def _process_gather() -> tuple[NamedSharding, jax.Device, Callable]:
  """The sharding that lays [num_processes, ...] out over one device per process (each
  process's first), this process's device in it, and the jitted gather (the identity,
  replicated): built once per process, as the devices never change."""
  firsts = [devices[0] for devices in _devices_by_process().values()]
  mesh = Mesh(np.array(firsts), ("processes",))
  gather = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P()))
  return NamedSharding(mesh, P("processes")), firsts[jax.process_index()], gather


def gather_from_processes(values: np.ndarray) -> np.ndarray:
  """[num_processes, ...]: every process's `values` (the same shape and dtype on each),
  on every process, gathered over one device per process, so that hosts may hold
  different numbers of devices (JAX's `process_allgather` spans every device and assumes
  each process has as many). Every process must call it."""
  values = np.asarray(values)
  if jax.process_count() == 1:
    return values[None]
  spread, mine, gather = _process_gather()
  rows = jax.make_array_from_single_device_arrays(
      (jax.process_count(), *values.shape), spread, [jax.device_put(values[None], mine)]
  )
  return np.asarray(gather(rows).addressable_data(0))


def check_same_settings(settings: Mapping[str, Any]) -> None:
  """Refuses a multi-process job whose processes were given different settings: every
  process calls it with its own (dotted field -> JSON value; leave out the ones that may
  differ, such as the process id), right after `initialize_distributed`. A learning rate
  given to one process only would otherwise train different parameters in each, silently,
  and other settings (the number of environments) fail in a collective much later.

  Raises:
    ValueError (on every process): the fields whose values differ, dotted as a resume's
      refusal names them.
  """
  if jax.process_count() == 1:
    return
  names = sorted(settings)
  digest = lambda value: zlib.crc32(json.dumps(value, sort_keys=True, default=str).encode())
  gather = lambda values: gather_from_processes(np.array(values, np.uint32).view(np.int32))
  # The fields themselves first: the next gather needs as many values from every process.
  fields = gather([len(names), digest(names)])
  if (fields != fields[0]).any():
    raise ValueError(
        "the processes of this job run different scripts or library versions (their settings "
        "have other fields): start every process with the same command but --process-id"
    )
  values = gather([digest(settings[name]) for name in names])
  differ = [names[i] for i in np.flatnonzero((values != values[0]).any(axis=0))]
  if differ:
    raise ValueError(
        f"the processes of this job were given different settings ({', '.join(differ)}): "
        "start every process with the same flags but --process-id"
    )


def ensure_cpu_devices(num_devices: int) -> None:
  """Asks for `num_devices` CPU devices if JAX's backend has not started yet.

  Harmless on GPU/TPU (only the CPU backend's device count changes). After the
  backend started it does nothing; `DataParallel.create` then reports a shortage.
  """
  if num_devices > 1 and not _backend_started():
    forced = re.search(
        r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", "")
    )
    if forced and int(forced.group(1)) >= num_devices:
      return  # XLA_FLAGS already asks for enough (and perhaps more)
    if jax.config.jax_num_cpu_devices < num_devices:
      jax.config.update("jax_num_cpu_devices", num_devices)


class DataParallel:
  """A learner mesh: `devices_per_process` local devices of every process."""

  def __init__(self, mesh: Mesh, devices_per_process: int):
    self.mesh = mesh
    self.devices_per_process = devices_per_process
    self.num_devices = mesh.devices.size
    self.num_processes = jax.process_count()
    self.process_index = jax.process_index()
    self.trivial = self.num_devices == 1
    self.replicated = NamedSharding(mesh, P())
    # A replicated value's copies in one memory: CPU devices all live in the host's.
    on_cpu = mesh.devices.flat[0].platform == "cpu"
    self.copies_per_memory = devices_per_process if on_cpu else 1

  @classmethod
  def create(cls, learner_devices: int = 1) -> "DataParallel":
    if not isinstance(learner_devices, int) or learner_devices < 1:
      raise ValueError(f"learner_devices must be a positive int, got {learner_devices!r}")
    local = jax.local_devices()
    if learner_devices > len(local):
      hint = (
          "; on CPU start with XLA_FLAGS=--xla_force_host_platform_device_count="
          f"{learner_devices} (the experiment scripts do this themselves)"
          if local[0].platform == "cpu"
          else ""
      )
      raise ValueError(
          f"learner_devices={learner_devices} but this process has "
          f"{len(local)} {local[0].platform} device(s){hint}"
      )
    by_process = _devices_by_process()
    devices = [d for p in by_process for d in by_process[p][:learner_devices]]
    dp = cls(Mesh(np.array(devices), (AXIS,)), learner_devices)
    if dp.num_processes > 1:
      dp.connect_collectives()
    return dp

  def connect_collectives(self) -> None:
    """Multi-host: one tiny collective over each device group a run uses (one device
    per process for `gather_processes`, and the learner mesh), at once.

    gloo sets a group up on its first use and fails ("Gloo context initialization
    failed ... GetKeyValue() timed out") if a peer has not arrived within 30 s; a
    group once set up waits as long as it must (measured: 45 s). Created here, right
    after the processes joined, the groups form while the processes are in step, so
    a process that compiles or steps more slowly than the others (a loaded machine)
    cannot make the run's first collectives fail. Every process must call it
    (`create` does).
    """
    self.gather_processes(np.zeros((1,), np.int32))
    ones = self.shard(np.ones((1, self.devices_per_process), np.float32))
    total = self.jit(jnp.sum)(ones)  # an all-reduce over the whole mesh
    if int(self.local(total)) != self.num_devices:
      raise RuntimeError(f"the learner mesh's all-reduce gave {total}, expected {self.num_devices}")

  # -- placing data ----------------------------------------------------------

  def batch_sharding(self, ndim: int) -> NamedSharding:
    """Splits axis 1 (the batch axis of time-major data) over the mesh."""
    return NamedSharding(self.mesh, P(None, AXIS) if ndim >= 2 else P())

  def replicate(self, tree: Any) -> Any:
    """Every leaf on every device of the mesh (values must agree across processes)."""
    if self.trivial:
      return tree
    if self.num_processes == 1:
      return jax.device_put(tree, self.replicated)
    mine = [d for d in self.mesh.devices.flat if d.process_index == self.process_index]

    def put(x):
      if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return x if x.sharding == self.replicated else jax.device_put(x, self.replicated)
      # Multi-host: every process holds the value, so the global array is assembled
      # from copies on this process's devices. (`device_put` would treat a committed
      # array, e.g. one computed from `local`, as a cross-host transfer, which the
      # CPU backend refuses.)
      return jax.make_array_from_single_device_arrays(
          np.shape(x), self.replicated, [jax.device_put(x, d) for d in mine]
      )

    return jax.tree.map(put, tree)

  def shard(self, tree: Any) -> Any:
    """Process-local [T+1, B_local, ...] data -> global [T+1, B_local * P, ...] arrays
    split along axis 1 (on one device: `device_put`)."""
    if self.trivial:
      return jax.device_put(tree)

    def put(x):
      x = np.asarray(x)
      return jax.make_array_from_process_local_data(self.batch_sharding(x.ndim), x)

    return jax.tree.map(put, tree)

  def constrain(self, tree: Any) -> Any:
    """Inside `jit`: lay a batch ([T, B, ...]) out split along axis 1."""
    if self.trivial:
      return tree
    return jax.tree.map(
        lambda x: jax.lax.with_sharding_constraint(x, self.batch_sharding(x.ndim)), tree
    )

  def jit(self, fn: Callable, **kwargs) -> Callable:
    """`jax.jit` whose outputs are replicated (learner state, metrics)."""
    if self.trivial:
      return jax.jit(fn, **kwargs)
    return jax.jit(fn, out_shardings=self.replicated, **kwargs)

  # -- reading back ----------------------------------------------------------

  def local(self, tree: Any) -> Any:
    """A replicated tree as arrays on this process's first device (no copy): what
    actors act with and what checkpoints store."""
    if self.trivial:
      return tree

    def one(x):
      if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1:
        return x.addressable_data(0)
      return x

    return jax.tree.map(one, tree)

  # -- agreeing across processes ----------------------------------------------

  def gather_processes(self, values: np.ndarray) -> np.ndarray:
    """[num_processes, ...]: every process's `values`, on every process, exactly (64-bit
    values too: JAX without x64 would cast them to 32 bits, so their bits are sent)."""
    values = np.asarray(values)
    if self.num_processes == 1:
      return values[None]
    wide = values.dtype.itemsize == 8
    sent = np.ascontiguousarray(values).reshape(-1).view(np.int32) if wide else values
    got = gather_from_processes(sent)
    if wide:
      got = np.ascontiguousarray(got).view(values.dtype).reshape((-1, *values.shape))
    return got
