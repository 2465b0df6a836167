"""Public API of offpolicy_ac.envs and its bad-input errors (raised before stepping)."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from offpolicy_ac import envs

jax.config.update("jax_numpy_rank_promotion", "raise")


def test_every_exported_name_imports():
  assert sorted(set(envs.__all__)) == sorted(envs.__all__)
  for name in envs.__all__:
    assert getattr(envs, name) is not None, name
  assert (envs.FIRST, envs.MID, envs.LAST) == (0, 1, 2)


def test_spec_is_hashable_and_describes_spaces():
  spec = envs.make("CartPole-v1", 3, seed=0, batch_size=2).spec
  assert hash(spec) == hash(spec)  # usable as a static jit argument
  assert spec.is_discrete and spec.num_actions == 2 and spec.action_shape == ()
  assert spec.observation_shape == (4,) and spec.observation_dtype == "float32"
  assert (spec.num_envs, spec.batch_size, spec.is_batched) == (3, 2, True)
  assert spec.action_low is None and spec.action_dtype == "int32"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(task_id="CartPole-v9"), r"unknown task id 'CartPole-v9'.*CartPole-v1"),
        (dict(task_id=3), "task_id must be a str"),
        (dict(task_id="foo:bar"), r"'foo:bar'.*\(JAX environments: gymnax:NAME, brax:NAME\)"),
        (dict(task_id="Breakout-MinAtar"), r"the JAX environment is 'gymnax:Breakout-MinAtar'$"),
        (dict(num_envs=0), "num_envs must be >= 1"),
        (dict(num_envs=2.0), "num_envs must be an int"),
        (dict(seed=-1), r"seed must be in \[0, 2147483648\), got -1"),
        (dict(batch_size=5), r"batch_size \(5\) must be <= num_envs \(4\)"),
        (dict(batch_size=0), "batch_size must be >= 1"),
        (dict(max_episode_steps=0), r"max_episode_steps must be in \[1, 2147483648\), got 0"),
        (dict(frame_skip=4), r"unknown envpool option\(s\) \['frame_skip'\]"),
        (dict(gym_reset_return_info=False), "gym_reset_return_info=False is not supported"),
    ],
)
def test_make_rejects_bad_arguments(kwargs, match):
  args = dict(task_id="CartPole-v1", num_envs=4, seed=0)
  extra = {k: v for k, v in kwargs.items() if k not in args}
  args.update({k: v for k, v in kwargs.items() if k in args})
  with pytest.raises(ValueError, match=match):
    envs.make(args.pop("task_id"), args.pop("num_envs"), args.pop("seed"), **extra)


def test_make_atari_rejects_non_atari():
  with pytest.raises(ValueError, match="Atari id"):
    envs.make_atari("Hopper-v5", 1, 0)
  with pytest.raises(ValueError, match="unknown task id"):
    envs.make_atari("Pongg-v5", 1, 0)


def _fresh_pair(task_id="CartPole-v1", n=3, **kwargs):
  a = envs.make(task_id, n, seed=11, **kwargs)
  b = envs.make(task_id, n, seed=11, **kwargs)
  return a, b, a.reset(), b.reset()


@pytest.mark.parametrize(
    "action, match",
    [
        (np.zeros((2,), np.int32), r"action shape \(2,\), expected \(3,\)"),
        (np.zeros((3, 1), np.int32), r"action shape \(3, 1\), expected \(3,\)"),
        (np.zeros((3,), np.float32), "integer dtype, got float32"),
        (np.array([0, 1, 2]), r"must be in \[0, 2\), got \[2\]"),
        (np.array([-1, 0, 1]), r"must be in \[0, 2\), got \[-1\]"),
    ],
)
def test_bad_discrete_actions_raise_before_stepping(action, match):
  a, b, _, _ = _fresh_pair()
  with pytest.raises(ValueError, match=match):
    a.step(action)
  # Nothing was sent: `a` steps exactly like an untouched twin afterwards.
  good = np.array([1, 0, 1])
  np.testing.assert_array_equal(a.step(good).observation, b.step(good).observation)


@pytest.mark.parametrize(
    "action, match",
    [
        (np.zeros((2, 1), np.float32), r"action shape \(2, 1\), expected \(3, 1\)"),
        (np.zeros((3,), np.float32), r"action shape \(3,\), expected \(3, 1\)"),
        (np.zeros((3, 1), np.int32), "floating dtype, got int32"),
        (np.full((3, 1), np.nan, np.float32), "must be finite"),
    ],
)
def test_bad_continuous_actions_raise_before_stepping(action, match):
  a, b, _, _ = _fresh_pair("Pendulum-v1")
  with pytest.raises(ValueError, match=match):
    a.step(action)
  good = np.full((3, 1), 0.5, np.float32)
  np.testing.assert_array_equal(a.step(good).observation, b.step(good).observation)


def test_jax_actions_are_accepted():
  env = envs.make("CartPole-v1", 2, seed=0)
  env.reset()
  ts = env.step(jnp.array([0, 1], jnp.int32))
  np.testing.assert_array_equal(ts.step_type, envs.MID)


def test_send_recv_misuse_is_reported():
  env = envs.make("CartPole-v1", 4, seed=0, batch_size=2)
  with pytest.raises(RuntimeError, match="reset"):
    env.step(np.zeros(4, np.int32))
  ts = env.reset()
  with pytest.raises(ValueError, match="already have an action in flight"):
    env.send(np.zeros(1, np.int32), np.array([(set(range(4)) - set(ts.env_id.tolist())).pop()]))
  with pytest.raises(ValueError, match="env_id out of range"):
    env.send(np.zeros(1, np.int32), np.array([4]))
  with pytest.raises(ValueError, match="duplicates"):
    env.send(np.zeros(2, np.int32), np.array([ts.env_id[0], ts.env_id[0]]))
  with pytest.raises(RuntimeError, match="still stepping"):
    env.reset()
  env.send(np.zeros(2, np.int32), ts.env_id)
  env.recv()
  env.recv()  # the two environments still resetting
  with pytest.raises(RuntimeError, match="block forever"):
    env.recv()


@pytest.mark.parametrize(
    "task_id, atari, kwargs",
    [
        ("CartPole-v1", False, {}),
        ("CartPole-v1", False, dict(batch_size=2, max_episode_steps=9)),
        ("Pendulum-v1", False, {}),
        ("Pong-v5", True, {}),
        ("Pong-v5", True, dict(img_height=64, img_width=64, stack_num=2)),
        ("Hopper-v4", False, {}),
    ],
)
def test_spec_without_a_pool_equals_the_pools_spec(task_id, atari, kwargs):
  with warnings.catch_warnings():  # neither passes on gymnasium's notes on float64 bounds
    warnings.simplefilter("error", UserWarning)
    got = envs.spec(task_id, atari=atari, num_envs=3, **kwargs)
    with (envs.make_atari if atari else envs.make)(task_id, 3, 0, **kwargs) as env:
      assert got == env.spec
  assert envs.is_atari(task_id) == atari
  # The pool layout is the one asked for (default: one environment, whole batches).
  options = {k: v for k, v in kwargs.items() if k != "batch_size"}
  default = envs.spec(task_id, atari=atari, **options)
  assert (default.num_envs, default.batch_size) == (1, 1)
  assert default._replace(num_envs=3, batch_size=got.batch_size) == got


def test_spec_rejects_what_make_rejects():
  with pytest.raises(ValueError, match="unknown task id"):
    envs.spec("CartPole-v9")
  with pytest.raises(ValueError, match=r"unknown envpool option\(s\) \['frame_skip'\]"):
    envs.spec("CartPole-v1", frame_skip=4)
  with pytest.raises(ValueError, match="Atari id"):
    envs.spec("CartPole-v1", atari=True)
  with pytest.raises(ValueError, match=r"batch_size \(2\) must be <= num_envs \(1\)"):
    envs.spec("CartPole-v1", batch_size=2)
  with pytest.raises(ValueError, match="unknown task id"):
    envs.is_atari("Pongg-v5")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(seed=2**31), r"seed must be in \[0, 2147483648\), got 2147483648"),
        (dict(env_seed=[1, 2, 3, 4]), "pass seed as an argument of make"),
        (dict(num_threads=-1), r"num_threads must be in \[0, 2147483648\), got -1"),
        (dict(max_episode_steps=2**31), r"max_episode_steps must be in \[1, 2147483648\)"),
        (
            dict(task_id="gymnax:CartPole-v1"),
            "is a JAX environment: make it with envs.make_functional",
        ),
    ],
)
def test_make_refuses_what_envpool_would_abort_on_or_ignore(kwargs, match):
  test_make_rejects_bad_arguments(kwargs, match)


def test_a_time_limit_is_refused_where_envpool_does_not_apply_it():
  # Catch's episodes run 9 steps whatever the limit; with a limit of 5 envpool flagged each
  # termination (the ball caught or missed) a truncation, learned with discount 1.
  with pytest.raises(ValueError, match=r"max_episode_steps: Catch-v0 \(envpool.toy_text\) "):
    envs.make("Catch-v0", 1, 0, max_episode_steps=5)
  env = envs.make("Catch-v0", 1, 0)  # its own rules end every episode, a termination
  env.reset()
  for _ in range(9):
    step = env.step(np.ones(1, np.int32))
  assert step.step_type[0] == envs.LAST and step.discount[0] == 0.0
  env.close()
  envs.make("CartPole-v1", 1, 0, max_episode_steps=5).close()  # applied by envpool
  # Blackjack's hands play on to their natural end past a limit of 1 or 2, each flagged a
  # truncation: busts (reward -1) were learned with discount 1.
  for task_id in ("CliffWalking-v0", "Highway-v0", "Blackjack-v1"):
    with pytest.raises(ValueError, match=f"max_episode_steps: {task_id} "):
      envs.make(task_id, 1, 0, max_episode_steps=5)
  with pytest.raises(ValueError, match="only Box observation spaces"):  # Taxi applies it
    envs.make("Taxi-v3", 1, 0, max_episode_steps=5)


@pytest.mark.parametrize("make", [envs.make, lambda task_id, *_: envs.spec(task_id)],
                         ids=["make", "spec"])  # fmt: skip
@pytest.mark.parametrize(
    "task_id, match",
    [
        # Each player acts: an action per player, which one policy's [B] batch is not (the
        # run failed after its directory was written; make's reset failed to broadcast).
        ("IntersectionMultiAgent-v0", "tasks of several players are not supported"),
        # ViZDoom's action box is [2.2e-308, 1.8e308], float64 limits: in float32 the bounds
        # were [0, inf], negative actions clipped to 0 (and the run hung in envpool).
        ("Basic-v1", r"action bounds must be finite in float32.*2\.22"),
    ],
)
def test_tasks_the_agents_cannot_drive_are_refused(monkeypatch, make, task_id, match):
  import envpool

  def no_pool(*args, **kwargs):  # refused from envpool's spec: no simulator is started
    raise AssertionError("a pool was made for a refused task")

  monkeypatch.setattr(envpool, "make_gymnasium", no_pool)
  with pytest.raises(ValueError, match=match):
    make(task_id, 2, 0)


def test_a_task_module_that_cannot_load_is_named(monkeypatch):
  import envpool

  def no_module(task_id, **kwargs):  # as envpool's Procgen without the system's Qt 5
    raise ImportError("EnvPool Procgen requires the system Qt 5 runtime on Linux.")

  monkeypatch.setattr(envpool, "make_spec", no_module)
  with pytest.raises(ValueError, match="CartPole-v1: envpool cannot load this task's module: "
                                       "EnvPool Procgen requires"):  # fmt: skip
    envs.spec("CartPole-v1")


def test_atari_options_are_checked_before_envpool():
  with pytest.raises(ValueError, match=r"max_num_players must be in \[1, "):
    envs.make("Pong-v5", 1, 0, max_num_players=0)
  with pytest.raises(ValueError, match=r"repeat_action_probability must be a number in \[0, 1\]"):
    envs.make("Pong-v5", 1, 0, repeat_action_probability=2.0)
  envs.make("Pong-v5", 1, 0, repeat_action_probability=np.float32(0.25)).close()  # a number
  with pytest.raises(ValueError, match="make_atari's train must be True or False, got 'no'"):
    envs.make_atari("Pong-v5", 1, 0, train="no")  # was the training preset


@pytest.mark.parametrize(
    "option, message",
    [
        (dict(episodic_life="no"), "episodic_life must be True or False, got 'no'"),
        (dict(mode="1"), "mode must be an int, got '1'"),
        (dict(task=3), "task must be a str, got 3"),
    ],
)
def test_an_envpool_option_of_another_type_is_refused_by_name(option, message):
  # envpool's constructor refused them listing every option's type, none by name.
  for build in (lambda: envs.make_atari("Pong-v5", 1, 0, **option),
                lambda: envs.spec("Pong-v5", atari=True, **option)):  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(message)):
      build()


def test_envpool_options_of_numpy_types_are_given_as_python_values():
  env = envs.make_atari("Pong-v5", 1, 0, episodic_life=np.bool_(False), noop_max=np.int64(3))
  env.close()
  envs.make("HalfCheetah-v4", 1, 0, ctrl_cost_weight=1).close()  # an int for a float option


def test_episodes_finished_before_a_reset_wait_to_be_popped():
  env = envs.make("CartPole-v1", 1, 0, max_episode_steps=2)
  env.reset()
  for _ in range(2):
    ts = env.step(np.zeros(1, np.int32))
  assert ts.step_type[0] == envs.LAST
  env.reset()
  stats = env.pop_episode_stats()
  env.close()
  assert stats.episode_length.tolist() == [2] and stats.episode_return.tolist() == [2.0]


def test_a_closed_pool_refuses_to_step():
  env = envs.make("CartPole-v1", 2, 0)
  env.reset()
  env.close()
  for call in (env.reset, lambda: env.step(np.zeros(2, np.int32))):
    with pytest.raises(RuntimeError, match="the environments were closed"):
      call()


def test_a_step_that_could_never_receive_is_refused_before_it_sends():
  """step() with actions for fewer environments than a batch sent them, then its recv
  raised: the pool was left stepping, and reset() refused from then on."""
  env = envs.make("CartPole-v1", 3, 0)
  env.reset()
  with pytest.raises(ValueError, match=r"actions for 2 environment\(s\) and 0 in flight: a batch "
                                       r"is 3"):  # fmt: skip
    env.step(np.zeros(2, np.int32), np.array([0, 1]))
  assert env.num_in_flight == 0
  assert env.step(np.zeros(3, np.int32)).step_type.shape == (3,)  # the pool still steps
  env.reset()
  env.close()
  with pytest.raises(ValueError, match="atari must be True or False, got 'no'"):
    envs.spec("CartPole-v1", atari="no")


def test_is_functional_needs_a_prefix_and_a_name():
  assert envs.is_functional("gymnax:CartPole-v1") and envs.is_functional("brax:ant")
  assert not envs.is_functional("gymnax") and not envs.is_functional(None)
  assert not envs.is_functional("CartPole-v1")
  with pytest.raises(ValueError, match=r"max_episode_steps must be in \[1, 2147483648\)"):
    envs.make_functional("gymnax:CartPole-v1", max_episode_steps=2**40)
