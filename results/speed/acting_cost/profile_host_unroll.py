"""Where one actor's host-loop unroll spends the actor thread's CPU time (bench_async's agent).

    python results/speed/acting_cost/profile_host_unroll.py CartPole-v1 1500
    python results/speed/acting_cost/profile_host_unroll.py Pong-v5 60

Wraps the host loop's parts with `time.thread_time` (the calling thread only: envpool's
worker threads and XLA's are not counted); 'rest' is the jitted policy call, the NumPy
conversions of its outputs and the loop itself.
"""

import collections
import pathlib
import sys
import time

import jax

jax.config.update("jax_cpu_enable_async_dispatch", False)
sys.path.insert(0, str(pathlib.Path(__file__).parents[3] / "experiments"))

import bench_async  # noqa: E402

from offpolicy_ac import envs  # noqa: E402
from offpolicy_ac.envs import _envpool_env  # noqa: E402
from offpolicy_ac.envs import _host_rollout  # noqa: E402
from offpolicy_ac.presets import impala  # noqa: E402
from offpolicy_ac.training.sources import make_env  # noqa: E402

ACC: collections.Counter = collections.Counter()


def wrap(owner, name: str) -> None:
  fn = getattr(owner, name)

  def timed(*args, **kwargs):
    c0 = time.thread_time()
    out = fn(*args, **kwargs)
    ACC[name] += time.thread_time() - c0
    return out

  setattr(owner, name, timed)


def main(task_id: str, unrolls: int) -> None:
  for owner, name in ((_host_rollout, "_place_steps"), (_host_rollout, "_split_unroll"),
                      (_envpool_env.EnvPoolEnv, "convert_block"),
                      (_envpool_env.EnvPoolEnv, "pop_episode_stats"),
                      (_envpool_env.EnvPoolEnv, "recv_raw"), (_envpool_env.EnvPoolEnv, "send")):  # fmt: skip
    wrap(owner, name)
  task = bench_async._task(task_id, bench_async.Args(), impala.PRESETS)
  spec = envs.spec(task_id, atari=task.atari, num_envs=task.num_envs)
  agent = bench_async._Agents().get(task, spec)
  params = agent.init(jax.random.PRNGKey(0)).params
  env = make_env(task.loop, task.num_envs, 0)
  rollout = envs.make_rollout(env, agent.act, task.unroll_length)
  state = rollout.init(params, jax.random.PRNGKey(1))
  for _ in range(5):
    state, _, _ = rollout.unroll(params, state)
  ACC.clear()
  c0 = time.thread_time()
  for _ in range(unrolls):
    state, _, _ = rollout.unroll(params, state)
  total = time.thread_time() - c0
  env.close()
  print(f"{task_id} host unroll [T={task.unroll_length}, N={task.num_envs}]: "
        f"{total / unrolls * 1e6:.0f} us actor-thread CPU per unroll")  # fmt: skip
  for name, v in [*ACC.most_common(), ("rest (policy call, loop)", total - sum(ACC.values()))]:
    print(f"  {name:26s} {v / unrolls * 1e6:7.0f} us {100 * v / total:6.1f}%")


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]))
