"""The data-parallel learner: N devices compute the one-device update,
parameters stay identical everywhere, bad settings fail fast, multi-host runs.

Host devices can only be forced before JAX starts its backend, and this process
has started it, so the device checks run this file as a script in a fresh
process (`python tests/training/test_parallel.py OUT_DIR CASE` with XLA_FLAGS asking for
4 host devices), and the multi-host checks run experiments/impala.py twice on
localhost.
"""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scripts import EXPERIMENTS
from scripts import cpu_process_env

from offpolicy_ac import agents
from offpolicy_ac import envs
from offpolicy_ac.training import RunLogger
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import parallel
from offpolicy_ac.training import train
from offpolicy_ac.training.learner import Learner
from offpolicy_ac.training.parallel import DataParallel
from offpolicy_ac.training.parallel import check_distributed_args

ROOT = pathlib.Path(__file__).parents[2]
FORCE_4_DEVICES = "--xla_force_host_platform_device_count=4"
WALL_CLOCK = ("wall_time_s", "env_steps_per_s")

# (case, agent, loop overrides, learner device counts). Each case trains from one state
# on the same CartPole trajectories and replay keys on one device, then on N.
CASES = [
    ("impala", "impala", {}, (2, 4)),
    ("sql", "sql", {}, (2, 4)),
    ("acer", "acer", {}, (2,)),
]
NUM_ITERS = 4


# -- the subprocess: one device against N -----------------------------------------


def _flat(tree):
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path): leaf for path, leaf in leaves}


def _host(x):
  if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  return np.asarray(x)


def _replication_report(tree, num_devices):
  """Leaves whose sharding is not replicated over the N devices, or whose shards
  differ in any bit."""
  bad = []
  for name, x in _flat(tree).items():
    if not isinstance(x, jax.Array):
      continue
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    shards = [np.asarray(s.data) for s in x.addressable_shards]
    if not x.sharding.is_fully_replicated or len(shards) != num_devices:
      bad.append(f"{name}: sharding {x.sharding} over {len(shards)} device(s)")
    elif any(s.tobytes() != shards[0].tobytes() or s.shape != shards[0].shape for s in shards[1:]):
      bad.append(f"{name}: shards differ")
  return bad


def _run_case(case, agent_name, overrides, device_counts, out_dir):
  """Trains NUM_ITERS iterations with the driver's `Learner` on one device and on each
  count of `device_counts`; saves states and metrics (npz) and a report."""

  replay = dict(replay_capacity=64, min_replay_size=8, mini_batch_size=16, mini_batch_length=4,
                num_updates_per_train_iter=2)  # fmt: skip
  config = TrainConfig.of(
      num_envs=8, unroll_length=8, **({} if agent_name == "impala" else replay), **overrides
  )
  env = envs.make("CartPole-v1", config.env.num_envs, 3)
  agent = {"impala": agents.make_impala, "sql": agents.make_sql, "acer": agents.make_acer}[
      agent_name
  ](env.spec)
  if agent_name == "acer":  # its replayed updates per iteration: the loop's
    agent = agents.make_acer(env.spec, agents.AcerConfig(replay_ratio=2))
  probe = Learner(agent, config, DataParallel.create(1), num_seeds=1)
  acting0 = probe.acting(probe.init([1]))[0]
  rollout = envs.make_rollout(env, probe.act, config.env.unroll_length, to_device=False)
  rollout_state = rollout.init(acting0, jax.random.PRNGKey(2))
  trajs = []
  for _ in range(NUM_ITERS):  # behaviour policy: the initial parameters
    rollout_state, traj, _ = rollout.unroll(acting0, rollout_state)
    trajs.append(traj)
  env.close()

  first = lambda tree: jax.tree.map(lambda x: x[0], tree)
  arrays = {f"init/state{k}": _host(v) for k, v in _flat(first(probe.init([1]).agent)).items()}
  report = {}
  for n in (1,) + tuple(device_counts):
    dp = DataParallel.create(n)
    n_config = config.replace(learner_devices=n)
    n_config.validate()
    learner = Learner(agent, n_config, dp, num_seeds=1)
    state = learner.init([1])
    fill = 0
    metrics_seq, batch_devices = [], set()
    for traj in trajs:
      batch = learner.batch([traj])
      batch_devices.add(len(batch.observation.addressable_shards))
      assert batch.observation.addressable_shards[-1].data.shape[1] == config.env.num_envs // n
      state, metrics, key = learner.ingest(state, batch)
      if agent.off_policy:
        fill += Learner.columns(batch, 1)
        if fill >= config.replay.min_replay_size:
          state, replayed = learner.sample_and_update(state, key)
          metrics = learner.mix(metrics, replayed)
      metrics_seq.append(metrics)
    tag = f"n{n}"
    report[tag] = {
        "mesh_devices": int(dp.num_devices),
        "batch_devices": sorted(batch_devices),
        "not_replicated": (_replication_report(state, n) + _replication_report(metrics_seq[-1], n)),
        "num_updates": int(learner.num_updates(state)[0]),
        "metrics_present": [m is not None for m in metrics_seq],
    }
    for name, leaf in _flat(first(dp.local(state).agent)).items():
      arrays[f"{tag}/state{name}"] = _host(leaf)
    for i, m in enumerate(metrics_seq):
      for name, value in (m or {}).items():
        arrays[f"{tag}/metrics[{i}].{name}"] = _host(dp.local(value)[0])
  np.savez(out_dir / f"{case}.npz", **arrays)
  (out_dir / f"{case}.json").write_text(json.dumps(report))


def _subprocess_main(out_dir, case):
  jax.config.update("jax_numpy_rank_promotion", "raise")
  # The experiment runner's CPU setting (actors call a tiny policy per step).
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  assert len(jax.local_devices()) == 4, jax.local_devices()
  _, agent_name, overrides, counts = next(c for c in CASES if c[0] == case)
  _run_case(case, agent_name, overrides, counts, out_dir)


# -- equivalence and replication --------------------------------------------------


def _train_on_one_and_n_devices(out, case):
  """Runs this file as a script with 4 forced host devices; returns its results."""
  env = cpu_process_env()
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + FORCE_4_DEVICES).strip()
  proc = subprocess.run(
      [sys.executable, __file__, str(out), case],
      capture_output=True,
      text=True,
      timeout=600,
      env=env,
      cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  arrays = np.load(out / f"{case}.npz")
  report = json.loads((out / f"{case}.json").read_text())
  tags = {k.split("/")[0] for k in arrays.files}
  results = {
      tag: {k[len(tag) + 1 :]: arrays[k] for k in arrays.files if k.startswith(tag + "/")}
      for tag in tags
  }
  return results, report


def _assert_close_trees(one, many, what):
  assert set(one) == set(many), what
  for name in sorted(one):
    a, b = one[name], many[name]
    assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {name}"
    if np.issubdtype(a.dtype, np.floating):
      scale = max(float(np.max(np.abs(a), initial=0.0)), 1e-3)
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{what}: {name}")
    else:  # counters and PRNG keys: exactly equal
      np.testing.assert_array_equal(b, a, err_msg=f"{what}: {name}")


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_n_device_training_equals_one_device_and_stays_replicated(tmp_path, case):
  """NUM_ITERS training iterations of the driver's `Learner` on N devices give
  the one-device parameters, optimizer state, target network, keys and metrics to
  float tolerance; every device holds the same bits; the state is replicated."""
  results, report = _train_on_one_and_n_devices(tmp_path, case)
  counts = next(c[3] for c in CASES if c[0] == case)
  init, one = results["init"], results["n1"]
  assert sum(k.startswith("state.params") for k in one) >= 4
  assert sum(k.startswith(f"metrics[{NUM_ITERS - 1}]") for k in one) >= 3
  assert report["n1"]["not_replicated"] == []
  for n in counts:
    _assert_close_trees(one, results[f"n{n}"], f"{n} devices")
    assert report[f"n{n}"]["mesh_devices"] == n and report[f"n{n}"]["batch_devices"] == [n]
    assert report[f"n{n}"]["not_replicated"] == []  # sharding replicated, shards equal
    assert report[f"n{n}"]["num_updates"] == report["n1"]["num_updates"] >= NUM_ITERS
    assert report[f"n{n}"]["metrics_present"] == report["n1"]["metrics_present"]
    assert report[f"n{n}"]["metrics_present"][-1]
  # The comparison is not of untouched copies: the updates moved the parameters.
  params = [k for k in init if k.startswith("state.params")]
  moved = [k for k in params if np.max(np.abs(one[k] - init[k])) > 1e-4]
  # (ACER's split torsos each carry a head only the other uses: those never move.)
  assert len(moved) >= 0.75 * len(params)
  losses = {float(one[k]) for k in one if k.startswith("metrics[") and k.endswith(".loss")}
  assert len(losses) >= NUM_ITERS - 1  # a different loss each iteration


# -- bad settings fail fast -------------------------------------------------------


def test_more_learner_devices_than_the_process_has_is_a_clear_error():
  n = len(jax.local_devices()) + 2
  with pytest.raises(ValueError) as info:
    DataParallel.create(n)
  message = str(info.value)
  assert f"learner_devices={n}" in message
  # The XLA_FLAGS hint is for CPU devices only: it cannot add GPUs.
  hint = f"XLA_FLAGS=--xla_force_host_platform_device_count={n}"
  assert (hint in message) == (jax.local_devices()[0].platform == "cpu")
  for bad in (0, -1, 1.5, "2"):
    with pytest.raises(ValueError, match="positive int"):
      DataParallel.create(bad)


def test_one_device_data_parallel_is_the_identity():
  dp = DataParallel.create(1)
  assert dp.trivial and dp.num_devices == 1 and dp.num_processes == 1
  tree = {"w": jnp.arange(6.0).reshape(2, 3)}
  assert dp.replicate(tree) is tree and dp.local(tree) is tree and dp.constrain(tree) is tree
  batch = dp.shard({"obs": np.ones((3, 4, 2), np.float32)})
  assert isinstance(batch["obs"], jax.Array) and batch["obs"].shape == (3, 4, 2)
  np.testing.assert_array_equal(dp.gather_processes(np.array([5, 7])), [[5, 7]])
  assert float(dp.jit(lambda t: t["w"].sum())(tree)) == 15.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_envs=6, learner_devices=4), r"num_envs \(6\) must divide evenly"),
        (dict(learner_devices=0), "learner_devices must be a positive int"),
        (dict(num_processes=2), "HOST:PORT"),
        (dict(num_processes=2, coordinator_address="localhost"), "HOST:PORT"),
        (dict(num_processes=2, coordinator_address="localhost:99999"), r"in \[1, 65535\]"),
        (dict(num_processes=2, coordinator_address="localhost:0"), r"in \[1, 65535\]"),
        (
            dict(num_processes=2, process_id=2, coordinator_address="localhost:1234"),
            r"process_id must lie in \[0, 2\)",
        ),
        (dict(process_id=1), "process_id"),
        (dict(num_processes=0), "num_processes must be a positive int"),
    ],
)
def test_loop_config_rejects_bad_parallel_settings(overrides, message):
  with pytest.raises(ValueError, match=message):
    TrainConfig.of(**overrides).validate()


def test_check_distributed_args():
  check_distributed_args(1, 0, None)
  check_distributed_args(2, 1, "localhost:1234")
  check_distributed_args(4, 3, "10.0.0.1:8476")
  check_distributed_args(2, 1, "[::1]:1234")  # IPv6
  for args in [
      (2, 0, "::1:1234"),
      (2, 0, "[::1]"),
      (2, 0, None),
      (2, 0, ""),
      (2, 0, "localhost"),
      (2, 0, "localhost:port"),
      (2, 0, "local host:12"),
      (2, -1, "localhost:1"),
      (2, 2, "localhost:1"),
      (1, 1, None),
      (0, 0, None),
      (2.0, 0, "localhost:1"),
      (True, 0, None),
      (2, True, "localhost:1"),
  ]:
    with pytest.raises(ValueError):
      check_distributed_args(*args)


def test_initialize_distributed_after_jax_started_raises():
  jax.devices()  # the backend runs in this process
  with pytest.raises(RuntimeError, match="before any JAX computation"):
    parallel.initialize_distributed(2, 0, f"localhost:{_free_port()}", timeout_s=5)
  assert not jax.distributed.is_initialized()
  parallel.initialize_distributed(1, 0, None)  # one process: nothing to join
  with pytest.raises(ValueError, match="HOST:PORT"):
    parallel.initialize_distributed(2, 0, None)
  before = jax.config.jax_num_cpu_devices
  parallel.ensure_cpu_devices(8)  # too late: changes nothing
  assert jax.config.jax_num_cpu_devices == before


_IMPORT_EVERYTHING = """
import pkgutil, runpy, sys
import offpolicy_ac
from offpolicy_ac.training import parallel
for module in pkgutil.walk_packages(offpolicy_ac.__path__, "offpolicy_ac."):
  __import__(module.name)
for script in sys.argv[1:]:
  demos = ["--demos", "demos.npz"] if script.endswith("sqil.py") else []
  runpy.run_path(script, run_name="imported")["parse"](["--seed", "0", *demos])
assert not parallel._backend_started(), "importing or parsing started a JAX backend"
"""


def test_importing_the_package_and_parsing_a_command_line_start_no_jax_backend():
  """A module-level JAX value (say `jnp.sqrt(2.0)` as an initialiser's gain) starts the
  backend at import, and every job of several processes then fails in
  initialize_distributed. Imports every module and parses every script's command line in a
  fresh process."""
  scripts = sorted(str(path) for path in EXPERIMENTS.glob("*.py") if _has_parse(path))
  assert scripts
  proc = subprocess.run(
      [sys.executable, "-c", _IMPORT_EVERYTHING, *scripts],
      env=cpu_process_env(),
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]


def _has_parse(path):
  return "\ndef parse(" in path.read_text()


def test_train_refuses_num_processes_without_a_distributed_job(tmp_path):
  config = TrainConfig.of(
      num_envs=4,
      unroll_length=4,
      total_env_steps=64,
      num_processes=2,
      coordinator_address="localhost:1234",
  )
  logger = RunLogger(tmp_path, total_env_steps=64, progress=False, tensorboard=False)
  try:
    with pytest.raises(ValueError, match="initialize_distributed"):
      train(agents.make_impala, config, [logger])
  finally:
    logger.close()


def _run_script(script, run_dir, *flags, timeout=300):
  cmd = [sys.executable, str(EXPERIMENTS / f"{script}.py"), "--run-dir", str(run_dir), *flags]
  return subprocess.run(
      cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=cpu_process_env()
  )


@pytest.mark.parametrize(
    "script, flags, message",
    [
        (
            "sql",
            ["--learner-devices", "2", "--mini-batch-size", "33"],
            "--mini-batch-size (33) must divide evenly over the 2 learner devices",
        ),
        (
            "impala",
            ["--learner-devices", "3"],
            "--num-envs (16) must divide evenly over --learner-devices (3)",
        ),
        ("impala", ["--num-processes", "2", "--process-id", "1"], "HOST:PORT"),
    ],
)
def test_scripts_reject_bad_parallel_settings(tmp_path, script, flags, message):
  proc = _run_script(script, tmp_path / "run", "--total-env-steps", "512", *flags)
  assert proc.returncode != 0
  assert message in proc.stderr, proc.stderr[-3000:]
  metrics = tmp_path / "run" / "metrics.jsonl"
  assert not metrics.exists() or not metrics.read_text()  # nothing trained


# -- multi-host: two processes on localhost -----------------------------------------


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _distributed_main(address, pid, out_dir):
  """Process `pid` of a 2-process job, one device each: the DataParallel methods."""
  parallel.initialize_distributed(2, pid, address, timeout_s=120)
  parallel.initialize_distributed(2, pid, address)  # joined already: nothing to do
  dp = DataParallel.create(1)
  if pid == 1:
    # Process 0 reaches the first collective below 35 s before process 1. gloo gives
    # up on a group that is still forming after 30 s; `create` formed them already.
    time.sleep(35)
  committed = jax.device_put(jnp.arange(4.0) + 1.0, jax.local_devices()[0])
  assert committed.committed
  tree = dp.replicate(
      {
          "committed": committed,
          "uncommitted": jnp.arange(3.0),
          "host": np.full(2, 7.0, np.float32),
          "key": jax.random.PRNGKey(5),
      }
  )
  tree = dp.replicate(tree)  # already global: unchanged
  batch = dp.shard(np.full((2, 3), pid + 1.0, np.float32))  # this process's [T, B_local]
  result = dp.jit(lambda t, b: t["committed"].sum() * jnp.mean(dp.constrain(b)))(tree, batch)
  report = {
      "num_devices": dp.num_devices,
      "batch_shape": list(batch.shape),
      "not_replicated": _replication_report(tree, 1) + _replication_report(result, 1),
      "global_replicated": all(x.sharding == dp.replicated for x in jax.tree.leaves(tree)),
      "values": {k: np.asarray(dp.local(v)).tolist() for k, v in tree.items()},
      "result": float(dp.local(result)),
      "gathered": dp.gather_processes(np.array([pid, 10 + pid])).tolist(),
  }
  (out_dir / f"process{pid}.json").write_text(json.dumps(report))


def test_data_parallel_methods_across_two_processes(tmp_path):
  """replicate (committed arrays too: no cross-host transfer), shard, jit, local and
  gather_processes in a 2-process job on localhost."""
  address = f"localhost:{_free_port()}"
  procs = [
      subprocess.Popen(
          [sys.executable, __file__, "--distributed", address, str(pid), str(tmp_path)],
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          text=True,
          cwd=ROOT,
          env=cpu_process_env(),
      )
      for pid in (0, 1)
  ]
  try:
    outputs = [proc.communicate(timeout=240)[0] for proc in procs]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  for proc, out in zip(procs, outputs):
    assert proc.returncode == 0, out[-4000:]
  for pid in (0, 1):
    report = json.loads((tmp_path / f"process{pid}.json").read_text())
    assert report["num_devices"] == 2
    assert report["batch_shape"] == [2, 6]  # batches of both processes, concatenated
    assert report["not_replicated"] == [] and report["global_replicated"]
    assert report["values"] == {
        "committed": [1.0, 2.0, 3.0, 4.0],
        "uncommitted": [0.0, 1.0, 2.0],
        "host": [7.0, 7.0],
        "key": [0, 5],
    }
    assert report["result"] == pytest.approx(10.0 * 1.5)  # the mean over both batches
    assert report["gathered"] == [[0, 10], [1, 11]]


def _start_two_processes(run_dir, flags, procs, logs, own_flags=((), ()), own_env=({}, {}),
                         script="impala"):  # fmt: skip
  """Starts experiments/<script>.py as processes 0 and 1 of one job (appending to
  `procs` and to `logs`, their output files, so the caller can always clean up);
  `own_flags[i]` go to process i only, and so do the variables `own_env[i]` adds to its
  environment."""
  address = f"localhost:{_free_port()}"
  for pid in (0, 1):
    logs.append(open(run_dir.parent / f"{run_dir.name}-process{pid}-{time.time_ns()}.log", "w+"))
    cmd = [
        sys.executable,
        str(EXPERIMENTS / f"{script}.py"),
        "--run-dir",
        str(run_dir),
        "--num-processes",
        "2",
        "--process-id",
        str(pid),
        "--coordinator-address",
        address,
        *flags,
        *own_flags[pid],
    ]
    procs.append(
        subprocess.Popen(
            cmd,
            stdout=logs[-1],
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**cpu_process_env(), **own_env[pid]},
        )
    )


def _stop_and_read(procs, logs):
  """Kills what still runs; the logs' contents."""
  for proc in procs:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  outputs = []
  for log in logs:
    log.seek(0)
    outputs.append(log.read())
    log.close()
  return outputs


def _job(run_dir, flags, own_flags=((), ()), timeout=300, own_env=({}, {}), script="impala"):
  """Runs experiments/<script>.py as processes 0 and 1 of one job to their end:
  [(return code, output)] of each."""
  procs, logs = [], []
  try:
    _start_two_processes(run_dir, flags, procs, logs, own_flags, own_env, script)
    deadline = time.monotonic() + timeout
    for proc in procs:
      proc.wait(timeout=max(deadline - time.monotonic(), 1))
  finally:
    outputs = _stop_and_read(procs, logs)
  return [(proc.returncode, out) for proc, out in zip(procs, outputs)]


def _two_processes(run_dir, *flags, own_flags=((), ()), timeout=300, own_env=({}, {}),
                   script="impala"):  # fmt: skip
  """Runs experiments/<script>.py as processes 0 and 1 of one job; both must exit 0."""
  results = _job(run_dir, flags, own_flags, timeout, own_env, script)
  for pid, (code, out) in enumerate(results):
    assert code == 0, f"process {pid} failed:\n{out[-4000:]}"
  return [out for _, out in results]


@pytest.mark.parametrize(
    "own_flags, field",
    [
        (((), ("--learning-rate", "0.001")), "agent.learning_rate"),
        # Settings are compared over one device per process: the processes' device counts
        # differ here (JAX's process_allgather failed with "cannot reshape array of size 3").
        ((("--learner-devices", "2"), ()), "train.parallel.learner_devices"),
    ],
)
def test_processes_given_different_settings_are_refused_before_anything_is_written(
    tmp_path, own_flags, field
):
  run = tmp_path / "run"
  results = _job(run, ["--total-env-steps", "40960"], own_flags=own_flags)
  for pid, (code, out) in enumerate(results):
    assert code == 2, f"process {pid}:\n{out[-3000:]}"
    assert out.strip().splitlines()[-1] == (
        f"[impala] error: the processes of this job were given different settings "
        f"({field}): start every process with the same flags but --process-id"
    )
  assert not (run / "config.json").exists() and not (run / "checkpoints").exists()


def test_hosts_with_more_devices_than_the_learner_uses_train_together(tmp_path):
  # Process 0's host holds 4 devices, process 1's 2 (as GPU hosts of 8 and 4 GPUs would);
  # each learns on 2. The processes' agreements gathered over every device of each and
  # failed ("cannot reshape array of size 6 into shape (2,4)").
  run = tmp_path / "run"
  four = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
  _two_processes(run, "--total-env-steps", "1024", "--log-every", "512", "--eval-every", "0",
                 "--learner-devices", "2", own_env=(four, {}))  # fmt: skip
  # The two hosts' CPU backends compile the learner for other device counts (other thread
  # layouts of its reductions), so the copies agree to float32 rounding, not bit for bit
  # as on hosts alike (jax 0.10.2: 393 of 4,675 parameters, at most 3.7e-8 apart).
  ours, theirs = (serialization.msgpack_restore(path.read_bytes()) for path in
                  (run / "final_params.msgpack", run / "process1" / "final_params.msgpack"))  # fmt: skip
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), ours, theirs)


def test_processes_may_name_their_shared_run_directory_differently(tmp_path):
  # A shared filesystem mounted at another path on another host: here a link.
  run = tmp_path / "run"
  run.mkdir()
  (tmp_path / "mounted").symlink_to(run)
  _two_processes(run, "--total-env-steps", "4096", "--eval-every", "0",
                 own_flags=((), ("--run-dir", str(tmp_path / "mounted"))))  # fmt: skip
  assert (run / "final_params.msgpack").exists() and (run / "process1").is_dir()


def test_a_job_of_two_processes_trains_several_seeds_one_after_the_other(tmp_path):
  # Every process locked the shared root: process 1 was refused, and process 0 waited for
  # it until JAX's distributed service aborted.
  run = tmp_path / "run"
  _two_processes(run, "--num-seeds", "2", "--total-env-steps", "2048", "--log-every", "1024",
                 "--eval-every", "0")  # fmt: skip
  assert json.loads((run / "seeds.json").read_text()) == {"seeds": [0, 1]}
  for seed in ("seed0", "seed1"):
    params = (run / seed / "final_params.msgpack").read_bytes()
    assert params == (run / seed / "process1" / "final_params.msgpack").read_bytes()
  assert not (run / "process1").exists()


# Imported by a process of the job at its start (as sitecustomize): its warm-up compiles
# 5 s late (process 0), or its first agreement with the other process waits for its
# warm-up (process 1), so that one process agrees before its warm-up ends, the other after.
LATE_WARM_UP = """
import os, time
from offpolicy_ac.training import envpool_program, learner

if os.environ["WARM_UP_ORDER"] == "late":
  check_fits = learner.Learner._check_fits  # called by the warm-up's thread only
  def late_check_fits(*args):
    time.sleep(5)
    return check_fits(*args)
  learner.Learner._check_fits = staticmethod(late_check_fits)
else:
  agree = envpool_program.EnvpoolProgram._agree
  def agree_after_warm_up(self, *args):
    self._warm.join(timeout=60)
    return agree(self, *args)
  envpool_program.EnvpoolProgram._agree = agree_after_warm_up
"""


def test_processes_whose_warm_up_and_first_unroll_end_in_other_orders_agree(tmp_path):
  # The warm-up (on its own thread) and the first agreement on env steps (a gather, on the
  # main thread) end in either order; the job agrees, and the processes learn the same.
  site = tmp_path / "site"
  site.mkdir()
  (site / "sitecustomize.py").write_text(LATE_WARM_UP)
  env = [
      {"WARM_UP_ORDER": order, "PYTHONPATH": f"{site}{os.pathsep}{cpu_process_env()['PYTHONPATH']}"}
      for order in ("late", "first")
  ]
  run = tmp_path / "run"
  _two_processes(run, "--total-env-steps", "2048", "--log-every", "1024", "--eval-every", "0",
                 own_env=env)  # fmt: skip
  assert (run / "final_params.msgpack").read_bytes() == (
      run / "process1" / "final_params.msgpack"
  ).read_bytes()


def test_a_process_without_its_coordinator_stops_with_one_line():
  code = (
      "from offpolicy_ac.training import parallel\n"
      f"parallel.initialize_distributed(2, 1, 'localhost:{_free_port()}', timeout_s=2)"
  )
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=120, env=cpu_process_env())  # fmt: skip
  assert proc.returncode != 0
  assert "ConnectionError: process 1 of 2 found no coordinator at localhost:" in proc.stderr
  assert "within 2 s: start process 0, which hosts it" in proc.stderr


def _lines(run_dir):
  return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _without_wall_clock(lines):
  return [{k: v for k, v in l.items() if k not in WALL_CLOCK} for l in lines]


# Global env steps: each process steps 16 envs x 16 steps = 256 per iteration, so one
# update per 512 global steps.
MULTI_HOST_FLAGS = ["--log-every", "10240", "--checkpoint-every", "20480"]
LEARNER_METRICS = ("loss", "policy_loss", "value_loss", "entropy", "grad_norm", "mean_rho")


def test_two_processes_learn_with_identical_parameters_then_resume(tmp_path):
  """One job of two processes (one learner device each), then the job resumed from
  its checkpoint. (One test, so that pytest-xdist never runs the job twice.)"""
  straight = tmp_path / "straight"
  _two_processes(straight, "--total-env-steps", "40960", *MULTI_HOST_FLAGS)
  _check_two_process_run(straight)
  _check_two_process_resume(straight, tmp_path / "resumed")
  _check_a_refusal_on_one_process_ends_the_job(straight, tmp_path / "lost")


def _check_a_refusal_on_one_process_ends_the_job(straight_run, run):
  """Process 1 refuses alone after the processes joined (its directory is gone), while
  process 0 waits for it in a collective: each stops within seconds saying why, not
  both in the distributed runtime's shutdown barrier for minutes."""
  shutil.copytree(straight_run, run)
  shutil.rmtree(run / "process1")
  start = time.monotonic()
  results = _job(run, ["--total-env-steps", "61440", "--resume", *MULTI_HOST_FLAGS], timeout=120)
  took = time.monotonic() - start
  (code0, out0), (code1, out1) = results
  assert code1 == 2, out1[-3000:]
  assert (
      out1.strip()
      .splitlines()[-1]
      .startswith(f"[impala] error: --resume: {run / 'process1'} holds no run")
  ), out1[-3000:]
  assert "this process's files of the job" in out1 and "resume that run" not in out1
  assert code0 == 1 and "process 0 of 2 stopped" in out0, out0[-3000:]
  assert took < 90, took


def _check_two_process_run(run):
  other = run / "process1"
  params = (run / "final_params.msgpack").read_bytes()
  assert len(params) > 1000 and params == (other / "final_params.msgpack").read_bytes()
  assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == [
      "20480",
      "40960",
  ]
  assert not (other / "checkpoints").exists()  # only process 0 writes checkpoints
  for d in (run, other):
    summary = json.loads((d / "summary.json").read_text())
    assert summary["env_steps"] == 40960 and summary["num_updates"] == 80
  a, b = _lines(run), _lines(other)
  assert (
      [l["env_steps"] for l in a] == [l["env_steps"] for l in b] == [10240, 20480, 30720, 40960]
  )  # global steps, every process
  assert [l["num_updates"] for l in a] == [l["num_updates"] for l in b] == [20, 40, 60, 80]
  for la, lb in zip(a, b):  # one learner: the same updates on the global batch
    for name in LEARNER_METRICS:
      assert la[name] == pytest.approx(lb[name], rel=1e-6, abs=1e-7), name
  # Each process's own actors (own env seeds): their episodes differ.
  assert [l["episode_return"] for l in a] != [l["episode_return"] for l in b]
  for lines in (a, b):
    returns = [l["episode_return"] for l in lines]
    assert max(returns[1:]) > returns[0] and max(returns[1:]) > 40  # random play: ~22


def _check_two_process_resume(straight_run, run):
  """Resumed from the 20480 checkpoint, the job logs what the straight run logged
  up to 40960, exactly, then goes on."""
  shutil.copytree(straight_run, run)
  shutil.rmtree(run / "checkpoints" / "40960")  # as if stopped at 20480
  _two_processes(run, "--total-env-steps", "61440", "--resume", *MULTI_HOST_FLAGS)
  assert (run / "final_params.msgpack").read_bytes() == (
      run / "process1" / "final_params.msgpack"
  ).read_bytes()
  for d in (run, run / "process1"):
    straight = _without_wall_clock(_lines(straight_run / d.relative_to(run)))
    resumed = _without_wall_clock(_lines(d))
    assert [l["env_steps"] for l in resumed] == [10240 * i for i in range(1, 7)]
    assert [l["num_updates"] for l in resumed] == [20 * i for i in range(1, 7)]
    assert resumed[:4] == straight
    summary = json.loads((d / "summary.json").read_text())
    assert summary["env_steps"] == 61440 and summary["num_updates"] == 120
  assert sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == [
      20480,
      40960,
      61440,
  ]


def test_a_killed_process_ends_the_job_at_once_and_it_resumes_from_the_checkpoint(tmp_path):
  """Process 1 is killed (SIGKILL) after the first checkpoint. Process 0 must stop
  within seconds with exit code 1 and a message saying where to resume (not wait for
  the distributed runtime's 100 s heartbeat timeout and abort); the checkpoint stays
  whole, and the job restarted with --resume continues from it to the end."""
  run = tmp_path / "run"
  procs, logs = [], []
  try:
    _start_two_processes(run, ["--total-env-steps", "81920", *MULTI_HOST_FLAGS], procs, logs)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "20480").exists():
      assert time.monotonic() < deadline and procs[0].poll() is None, "no checkpoint"
      time.sleep(0.1)
    procs[1].kill()
    procs[1].wait()
    killed = time.monotonic()
    procs[0].wait(timeout=60)
    took = time.monotonic() - killed
  finally:
    out = _stop_and_read(procs, logs)[0]
  assert procs[0].returncode == 1, out[-3000:]
  assert took < 30, took
  assert "process 0 of 2 stopped" in out and "--resume" in out, out[-3000:]
  saved = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
  assert f"The last checkpoint, at env step {saved[-1]:,}" in out, out[-3000:]
  assert saved and saved[0] >= 20480 and saved[-1] < 81920
  end = 81920  # the job's budget: a resumed run may not get a smaller one
  _two_processes(run, "--total-env-steps", str(end), "--resume", *MULTI_HOST_FLAGS)
  assert (run / "final_params.msgpack").read_bytes() == (
      run / "process1" / "final_params.msgpack"
  ).read_bytes()
  for d in (run, run / "process1"):
    steps = [l["env_steps"] for l in _lines(d)]
    assert steps == list(range(10240, end + 1, 10240)), steps  # no line lost or repeated
    assert json.loads((d / "summary.json").read_text())["env_steps"] == end


def test_a_signal_to_one_process_stops_the_job_and_each_says_so(tmp_path):
  run = tmp_path / "run"
  procs, logs = [], []
  try:
    _start_two_processes(run, ["--total-env-steps", "819200", *MULTI_HOST_FLAGS], procs, logs)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "20480").exists():
      assert time.monotonic() < deadline and procs[0].poll() is None, "no checkpoint"
      time.sleep(0.1)
    procs[1].send_signal(signal.SIGINT)
    for proc in procs:
      proc.wait(timeout=120)
  finally:
    outputs = _stop_and_read(procs, logs)
  assert [proc.returncode for proc in procs] == [0, 0], outputs[0][-3000:]
  # Process 0, which writes the run, got no signal: its output said nothing of the stop.
  assert "[impala] stopped by a signal to another process of the job at env step" in outputs[0]
  assert "[impala] stopped by SIGINT at env step" in outputs[1]
  summary = json.loads((run / "summary.json").read_text())
  assert summary["interrupted"] and summary["stopped_by"].startswith("a signal to another")


def test_two_processes_with_two_learner_devices_each(tmp_path):
  """A 4-device mesh over 2 processes: parameters identical, learning proceeds."""
  run = tmp_path / "run"
  _two_processes(
      run,
      "--learner-devices",
      "2",
      "--total-env-steps",
      "20480",
      "--log-every",
      "5120",
      "--checkpoint-every",
      "0",
  )
  assert (run / "final_params.msgpack").read_bytes() == (
      run / "process1" / "final_params.msgpack"
  ).read_bytes()
  a, b = _lines(run), _lines(run / "process1")
  assert [l["num_updates"] for l in a] == [l["num_updates"] for l in b] == [10, 20, 30, 40]
  for la, lb in zip(a, b):
    assert la["loss"] == pytest.approx(lb["loss"], rel=1e-6, abs=1e-7)
  assert a[-1]["episode_return"] > a[0]["episode_return"]
  # Evaluations: 5 episodes on each process, their mean gathered exactly (not in float32):
  # CartPole's integer returns over 10 episodes make multiples of 0.1.
  summary = json.loads((run / "summary.json").read_text())
  assert "mean return of 10 episodes" in summary["evaluation_protocol"]
  for value in [l["eval_return"] for l in a] + [summary["last_eval_return"]]:
    assert value * 10 == pytest.approx(round(value * 10), abs=1e-9), value


def test_acer_in_two_processes_with_two_learner_devices_each(tmp_path):
  """ACER mixes its fresh update's metrics with the replayed ones': on the host (done on
  arrays spanning both processes' devices, eagerly, the two processes deadlocked before
  their first line)."""
  run = tmp_path / "run"
  _two_processes(run, "--learner-devices", "2", "--total-env-steps", "8192", "--log-every",
                 "2048", "--checkpoint-every", "0", timeout=180, script="acer")  # fmt: skip
  a, b = _lines(run), _lines(run / "process1")
  assert [l["env_steps"] for l in a] == [l["env_steps"] for l in b] == [2048, 4096, 6144, 8192]
  for la, lb in zip(a, b):
    assert la["loss"] == pytest.approx(lb["loss"], rel=1e-6, abs=1e-7)
  assert (run / "final_params.msgpack").read_bytes() == (
      run / "process1" / "final_params.msgpack"
  ).read_bytes()


@pytest.mark.slow
def test_full_two_processes_with_two_learner_devices_learn_cartpole(tmp_path):
  """Two processes x two learner devices reach CartPole's ceiling (about 30 s here)."""
  run = tmp_path / "run"
  _two_processes(
      run,
      "--learner-devices",
      "2",
      "--total-env-steps",
      "200000",
      "--log-every",
      "10000",
      "--checkpoint-every",
      "100000",
      timeout=900,
  )
  assert (run / "final_params.msgpack").read_bytes() == (
      run / "process1" / "final_params.msgpack"
  ).read_bytes()
  for d in (run, run / "process1"):
    # A line where no episode ended (the policy near 500 steps an episode) has no return.
    returns = [l["episode_return"] for l in _lines(d) if l["episode_return"] is not None]
    assert max(np.convolve(returns, np.ones(5) / 5, mode="valid")) >= 400


if __name__ == "__main__":
  if sys.argv[1] == "--distributed":
    _distributed_main(sys.argv[2], int(sys.argv[3]), pathlib.Path(sys.argv[4]))
  else:
    _subprocess_main(pathlib.Path(sys.argv[1]), sys.argv[2])
