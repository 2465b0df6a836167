"""The compiled rollout's per-unroll host cost with and without this change, in one process.

    python results/speed/acting_cost/ab_compiled_unroll.py CartPole-v1 2000
    python results/speed/acting_cost/ab_compiled_unroll.py Pong-v5 60

Two rollouts (two pools) of bench_async's agent, 'old' made with jit dispatch and a
`device_put` of the parameters at every unroll (as before), 'new' as the library makes it
(the AOT-compiled executable, parameters placed once); their unrolls alternate, and the
medians of the actor thread's CPU time per unroll are printed (`time.thread_time`).
"""

import pathlib
import statistics
import sys
import time

import jax

jax.config.update("jax_cpu_enable_async_dispatch", False)
sys.path.insert(0, str(pathlib.Path(__file__).parents[3] / "experiments"))

import bench_async  # noqa: E402

from offpolicy_ac import envs  # noqa: E402
from offpolicy_ac.envs import _xla_rollout  # noqa: E402
from offpolicy_ac.presets import impala  # noqa: E402
from offpolicy_ac.training.sources import make_env  # noqa: E402


class _PlaceEveryTime:

  def __init__(self, cpu):
    self._cpu = cpu

  def __call__(self, params):
    return jax.device_put(params, self._cpu)


def main(task_id: str, unrolls: int) -> None:
  task = bench_async._task(task_id, bench_async.Args(), impala.PRESETS)
  spec = envs.spec(task_id, atari=task.atari, num_envs=task.num_envs)
  agent = bench_async._Agents().get(task, spec)
  params = agent.init(jax.random.PRNGKey(0)).params
  rollouts, envs_ = {}, []
  for name in ("old", "new"):
    saved = _xla_rollout._Precompiled, _xla_rollout._PlacedParams
    if name == "old":
      _xla_rollout._Precompiled, _xla_rollout._PlacedParams = (lambda f: f), _PlaceEveryTime
    env = make_env(task.loop.replace(rollout="compiled"), task.num_envs, 0)
    envs_.append(env)
    rollout = envs.make_rollout(env, agent.act, task.unroll_length, backend="compiled")
    _xla_rollout._Precompiled, _xla_rollout._PlacedParams = saved
    state = rollout.init(params, jax.random.PRNGKey(1))
    for _ in range(5):
      state, _, _ = rollout.unroll(params, state)
    rollouts[name] = [rollout, state]
  times: dict = {name: [] for name in rollouts}
  for i in range(unrolls):
    for name in ("old", "new") if i % 2 else ("new", "old"):
      rollout, state = rollouts[name]
      c0 = time.thread_time()
      rollouts[name][1], _, _ = rollout.unroll(params, state)
      times[name].append(time.thread_time() - c0)
  for env in envs_:
    env.close()
  for name, ts in times.items():
    print(f"{task_id} {name}: median actor-thread CPU per unroll "
          f"{statistics.median(ts) * 1e6:.0f} us ({unrolls} unrolls)")  # fmt: skip


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]))
