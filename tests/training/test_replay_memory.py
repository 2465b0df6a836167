"""A replay buffer larger than the device's free memory is refused by name before the run
writes anything (it ended the process in an allocation error, or an out-of-memory kill)."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from offpolicy_ac import presets
from offpolicy_ac.training import learner as learner_lib


def test_free_memory_of_the_cpu_is_the_hosts_available_memory():
  free = learner_lib.free_memory_bytes(jax.local_devices(backend="cpu")[0])
  assert free is None or 0 < free  # None only where /proc/meminfo is missing


def test_check_replay_fits_names_the_bytes_and_the_flag(monkeypatch):
  rows = {"obs": jax.ShapeDtypeStruct((1000, 9, 4), jnp.float32),
          "action": jax.ShapeDtypeStruct((1000, 9), jnp.int32)}  # fmt: skip
  need = 1000 * 9 * (16 + 4)
  monkeypatch.setattr(learner_lib, "free_memory_bytes", lambda device: 2 * need)
  learner_lib.check_replay_fits(rows, 2, 1000)  # exactly fits
  with pytest.raises(ValueError) as e:
    learner_lib.check_replay_fits(rows, 3, 1000)
  assert str(e.value) == (
      "the replay buffer needs 0.0 GiB (1,000 sequences of 180 bytes x 3 learners (seeds or "
      "sweep settings)), more than the 0.0 GiB free on cpu: lower replay_capacity"
  )
  monkeypatch.setattr(learner_lib, "free_memory_bytes", lambda device: None)
  learner_lib.check_replay_fits(rows, 3, 1000)  # unknown: not refused


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_a_run_whose_replay_does_not_fit_is_refused_before_it_writes(tmp_path, monkeypatch,
                                                                     env_id):  # fmt: skip
  """The envpool driver and a compiled run, 4 seeds: 4 buffers of 64 sequences."""
  per_seed = 64 * 17 * (4 * 4 + 3 * 4 + 4 + 4 + 4 * 2)  # obs, type/reward/discount, ids, ...
  monkeypatch.setattr(learner_lib, "free_memory_bytes", lambda device: 3 * per_seed)
  args = presets.acer.Args()
  train = args.train.replace(env_id=env_id, replay_capacity=64, min_replay_size=64,
                             total_env_steps=4096, num_seeds=4)  # fmt: skip
  args = dataclasses.replace(args, train=train, run_dir=str(tmp_path / "run"))
  with pytest.raises(
      ValueError, match=r"the replay buffer needs .* \(64 sequences of \d+ bytes x 4"
  ):
    presets.acer.run(args)
  assert not (tmp_path / "run").exists()
