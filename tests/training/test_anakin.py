"""The compiled (Anakin) run: one jitted program per run, hyper-parameters as data, sweeps
whose lanes equal single runs, exact resume, errors before compiling."""

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scripts import cpu_process_env
from scripts import load_script

from offpolicy_ac import presets
from offpolicy_ac.agents import AcerConfig
from offpolicy_ac.agents import ImpalaConfig
from offpolicy_ac.agents import SqlConfig
from offpolicy_ac.agents import make_acer
from offpolicy_ac.agents import make_impala
from offpolicy_ac.agents import make_sqil
from offpolicy_ac.agents import make_sql
from offpolicy_ac.agents import make_sql_discrete
from offpolicy_ac.cli import parse_args
from offpolicy_ac.training import TrainConfig
from offpolicy_ac.training import load_run
from offpolicy_ac.training import make_train
from offpolicy_ac.training import read_metrics

pytest.importorskip("gymnax")

CARTPOLE = "gymnax:CartPole-v1"
WALL_CLOCK = ("wall_time_s", "env_steps_per_s")


def _config(**fields):
  base = dict(env_id=CARTPOLE, num_envs=4, unroll_length=8, total_env_steps=640,
              log_every=160, eval_every=320, eval_episodes=2, checkpoint_every=320)  # fmt: skip
  return TrainConfig.of(**{**base, **fields})


def test_train_is_one_program_and_its_metrics_are_arrays():
  """`train` traces the agent's factory once; a second call with other hyper-parameters
  reuses the compiled program. Metrics have one entry per iteration."""
  traced = []

  def counting_make(spec, config):
    traced.append(1)
    return make_impala(spec, config)

  compiled = make_train(counting_make, ImpalaConfig(), _config())
  train = jax.jit(compiled.train)
  built = len(traced)  # make_train builds the agent once to validate it
  state, metrics = train(jax.random.PRNGKey(0), compiled.hyperparams)
  after_first = len(traced)
  other = {**compiled.hyperparams, "learning_rate": jnp.float32(1e-2)}
  state2, _ = train(jax.random.PRNGKey(0), other)
  assert len(traced) == after_first > built
  assert compiled.iterations == 20 and metrics["env_steps"].shape == (20,)
  np.testing.assert_array_equal(metrics["env_steps"], np.arange(1, 21) * 32)
  assert int(state.env_steps) == 640 and int(state.learner.agent.num_updates) == 20
  evaluated = ~np.isnan(metrics["eval_return"])
  np.testing.assert_array_equal(np.flatnonzero(evaluated), [9, 19])  # every 320 steps
  assert (metrics["eval_return"][evaluated] >= 1).all()
  assert metrics["episodes"].sum() > 0 and np.isfinite(metrics["loss"]).all()
  different = jax.tree.map(lambda a, b: not np.array_equal(a, b), state.learner.agent.params,
                           state2.learner.agent.params)  # fmt: skip
  assert any(jax.tree.leaves(different))  # the learning rate is data, not a constant


@pytest.mark.parametrize("fields, per_chunk", [
    (dict(log_every=10**9, eval_every=0, checkpoint_every=0), 20),  # the budget
    (dict(log_every=10**9, eval_every=320, checkpoint_every=0), 10),  # the evaluations'
    (dict(log_every=10**9, eval_every=0, checkpoint_every=96), 3),  # the checkpoints'
    (dict(log_every=100), 4),  # a log line's, rounded up
])  # fmt: skip
def test_a_chunk_is_no_longer_than_the_budget_or_the_points_the_host_stops_at(fields, per_chunk):
  """Every call scans all of a chunk's iterations (those past the active ones idle): a
  chunk as long as a huge --log-every made a short run slow and large."""
  compiled = make_train(make_impala, ImpalaConfig(), _config(**fields))
  assert (compiled.iterations, compiled.iterations_per_chunk) == (20, per_chunk)


def test_a_run_without_evaluations_compiles_no_evaluation_program():
  from offpolicy_ac.training.compiled_program import CompiledProgram  # pylint: disable=import-outside-toplevel

  program = CompiledProgram(make_train(make_impala, ImpalaConfig(), _config(eval_every=0)),
                            [0], [{}])  # fmt: skip
  state = program.init()
  state, _ = program.advance(state, 0, 64, 64, lambda: False)
  with pytest.raises(ValueError, match="evaluates nothing"):
    program.evaluate(state, lambda: False)


def test_a_stop_while_the_programs_compile_does_not_wait_for_them(monkeypatch):
  """XLA's compilation cannot be interrupted: the advance waited for it (minutes for a
  large network) before it saw the stop request, and a Ctrl-C then took that long."""
  import threading  # pylint: disable=import-outside-toplevel

  from offpolicy_ac.training.compiled_program import CompiledProgram  # pylint: disable=import-outside-toplevel

  release = threading.Event()
  monkeypatch.setattr(CompiledProgram, "_compile", lambda self, lowered: release.wait(60))
  program = CompiledProgram(make_train(make_impala, ImpalaConfig(), _config(eval_every=0)),
                            [0], [{}])  # fmt: skip
  try:
    state = program.init()
    _, progress = program.advance(state, 0, 64, 64, lambda: True)
    assert progress.stopped and progress.env_steps == 0 and not progress.updates
    assert program._thread.is_alive()  # pylint: disable=protected-access
  finally:
    release.set()


def test_chunks_repeat_the_whole_run():
  """Running the budget chunk by chunk (as the scripts do) gives `train`'s metrics."""
  compiled = make_train(make_sql, SqlConfig(), _config(min_replay_size=8, mini_batch_size=8,
                                                       mini_batch_length=4))  # fmt: skip
  key, hp = jax.random.PRNGKey(3), compiled.hyperparams
  _, whole = jax.jit(compiled.train)(key, hp)
  run = jax.jit(compiled.run)
  state = jax.jit(compiled.init)(key, hp)
  evaluate = jax.jit(compiled.evaluate)
  chunks, evaluations = [], []
  per = compiled.iterations_per_chunk
  for c in range(compiled.iterations // per):
    state, m = run(state, hp, jnp.int32(per))
    chunks.append(m)
    if (c + 1) * per * compiled.steps_per_iteration % 320 == 0:  # eval_every
      evaluations.append(evaluate(state, hp))
  chunked = jax.tree.map(lambda *xs: np.concatenate(xs), *chunks)
  for name in ("env_steps", "episodes", "episode_return_sum", "num_updates"):
    np.testing.assert_array_equal(chunked[name], whole[name], err_msg=name)
  np.testing.assert_allclose(chunked["loss"], whole["loss"], rtol=1e-5, equal_nan=True)
  evaluated = ~np.isnan(whole["eval_return"])
  np.testing.assert_allclose([mean for mean, _ in evaluations], whole["eval_return"][evaluated])
  np.testing.assert_allclose([low for _, low in evaluations], whole["eval_return_min"][evaluated])
  # SQL learns only once the replay holds min_replay_size sequences: NaN before.
  assert not whole["updated"][0] and np.isnan(whole["loss"][0]) and whole["updated"][-1]


def test_a_sweep_lane_is_the_single_run_with_that_setting_and_seed():
  compiled = make_train(make_impala, ImpalaConfig(), _config())
  settings = [0.003, 0.01]
  seeds = [0, 1]
  lanes = [(lr, s) for lr in settings for s in seeds]
  hps = {k: jnp.stack([v] * len(lanes)) for k, v in compiled.hyperparams.items()}
  hps["learning_rate"] = jnp.asarray([lr for lr, _ in lanes], jnp.float32)
  keys = jnp.stack([jax.random.PRNGKey(s) for _, s in lanes])
  _, swept = jax.jit(jax.vmap(compiled.train))(keys, hps)
  for k, (lr, seed) in enumerate(lanes):
    single = make_train(make_impala, ImpalaConfig(learning_rate=lr), _config())
    _, alone = jax.jit(single.train)(jax.random.PRNGKey(seed), single.hyperparams)
    np.testing.assert_array_equal(swept["episodes"][k, :6], alone["episodes"][:6])
    np.testing.assert_allclose(swept["loss"][k], alone["loss"], rtol=1e-3, atol=1e-5)


def _impala_main(run_dir, **fields):
  module = presets.impala
  args = module.Args()
  resume = fields.pop("resume", False)
  agent = fields.pop("agent", args.agent)
  train = _config(**fields)
  return module.run(dataclasses.replace(args, train=train, agent=agent, run_dir=str(run_dir),
                                         resume=resume))  # fmt: skip


def test_greedy_means_are_written_as_the_decimals_float32_held(tmp_path):
  """A mean of 5 integer returns, computed in float32, reads 425.2, not 425.20001220703125."""
  run_dir = tmp_path / "run"
  _impala_main(run_dir, eval_episodes=5, eval_every=160)
  summary = json.loads((run_dir / "summary.json").read_text())
  means = [l["eval_return"] for l in _lines(run_dir) if "eval_return" in l]
  means += [summary["last_eval_return"], summary["best_eval_return"]]
  assert all(float(round(5 * mean)) == 5 * mean for mean in means), means
  # Other means keep every digit float32 held; NaN (no evaluation) stays NaN.
  from offpolicy_ac.training.compiled_program import _float32_mean

  assert _float32_mean(np.float32(9.400001), 5) == 9.4
  assert _float32_mean(np.float32(-153.34567), 5) == -153.34567
  assert _float32_mean(np.float32(425.20001220703125), 5) == 425.2
  assert np.isnan(_float32_mean(np.float32("nan"), 5))


def _lines(run_dir):
  return [{k: v for k, v in l.items() if k not in WALL_CLOCK} for l in read_metrics(run_dir)]


def test_script_run_writes_the_run_directory_and_resumes_exactly(tmp_path):
  straight = tmp_path / "straight"
  result = _impala_main(straight)
  for name in ("config.json", "metrics.jsonl", "learning_curve.png", "final_params.msgpack",
               "summary.json"):  # fmt: skip
    assert (straight / name).exists(), name
  assert result.env_steps == 640 and result.last_eval_return is not None
  lines = _lines(straight)
  assert [l["env_steps"] for l in lines] == [160, 320, 480, 640]
  assert "eval_return" in lines[1] and "eval_return" not in lines[0]
  summary = json.loads((straight / "summary.json").read_text())
  assert "gymnax:CartPole-v1" in summary["evaluation_protocol"]

  cut = tmp_path / "cut"
  _impala_main(cut, total_env_steps=320)
  resumed = _impala_main(cut, resume=True)
  assert resumed.env_steps == 640
  assert _lines(cut) == lines


def test_a_run_resumed_with_a_larger_budget_goes_on_after_a_partial_interval(tmp_path):
  """400 env steps are 13 iterations of 32: lines at 160 and 320, and a final line for
  the partial interval at 416. Resumed with 640, the run goes on from iteration 13 (not
  from the interval's start) to 20, and logs what the straight run of 640 logs: the final
  line is replaced by the whole interval's."""
  run_dir = tmp_path / "grow"
  _impala_main(run_dir, total_env_steps=400)
  assert [l["env_steps"] for l in _lines(run_dir)] == [160, 320, 416]
  assert _lines(run_dir)[-1]["final"]
  result = _impala_main(run_dir, total_env_steps=640, resume=True)
  assert [l["env_steps"] for l in _lines(run_dir)] == [160, 320, 480, 640]
  assert result.env_steps == 640 and result.num_updates == 20
  straight = tmp_path / "straight"
  _impala_main(straight)
  assert _lines(run_dir) == _lines(straight)


def test_script_sweep_writes_one_directory_per_learner_and_a_comparison(tmp_path):
  root = tmp_path / "sweep"
  results = _impala_main(root, num_seeds=2, sweep=("learning_rate=0.003,0.01",))
  assert len(results) == 4
  for lr in ("0.003", "0.01"):
    for seed in (0, 1):
      run_dir = root / f"learning_rate={lr}" / f"seed{seed}"
      config = json.loads((run_dir / "config.json").read_text())["config"]
      assert config["agent"]["learning_rate"] == float(lr)
      assert config["train"]["budget"]["seed"] == seed
      assert len(read_metrics(run_dir)) == 4
  assert (root / "gymnax_CartPole-v1.png").exists()
  assert "learning_rate" in (root / "sweep_summary.txt").read_text()
  # Each learner loads back its own parameters, final or from its lane of the checkpoints
  # the learners share (tests/training/test_compiled_load_run.py has the rest of load_run).
  finals = {}
  for lr in ("0.003", "0.01"):
    for seed in (0, 1):
      run = load_run(root / f"learning_rate={lr}" / f"seed{seed}")
      assert run.agent.config.learning_rate == float(lr) and run.checkpoints == (320, 640)
      last = load_run(run.run_dir, checkpoint=640)
      assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(last.params),
                                                      jax.tree.leaves(run.params)))  # fmt: skip
      finals[lr, seed] = jax.tree.leaves(run.params)[0]
  assert len({x.tobytes() for x in finals.values()}) == 4
  evaluate = load_script("evaluate")
  lane = root / "learning_rate=0.01" / "seed1"
  result = evaluate.main(evaluate.Args(run_dir=str(lane), episodes=2))
  assert len(result["returns"]) == 2 and (lane / "evaluation.json").exists()
  with pytest.raises(ValueError, match="root of a sweep"):
    load_run(root)


@pytest.mark.parametrize(
    "sweep, message",
    [
        (("learning_rat=0.1",), "no field 'learning_rat'"),
        (("hidden_sizes=32",), "static field"),
        (("gamma=1.5",), "gamma must lie in"),
    ],
)
def test_a_bad_sweep_fails_before_compiling(tmp_path, sweep, message):
  with pytest.raises(ValueError, match=message):
    _impala_main(tmp_path / "bad", sweep=sweep)
  assert not (tmp_path / "bad").exists()


def test_a_sweep_whose_values_combine_into_an_invalid_setting_fails_before_compiling(tmp_path):
  """Each field's values pass against the base config (rho-bar 2, c-bar 0.5), but the lane
  (0.6, 1.5) has rho-bar below c-bar: refused with the lanes, before anything is built
  (it was refused only once the program had been built)."""
  from offpolicy_ac.training import sweeps

  agent = ImpalaConfig(clip_rho_threshold=2.0, clip_c_threshold=0.5)
  sweep = ("clip_rho_threshold=0.6,2", "clip_c_threshold=0.5,1.5")
  message = (r"the setting \{'clip_rho_threshold': 0.6, 'clip_c_threshold': 1.5\} is invalid: "
             r"rho-bar \(0.6\) < c-bar \(1.5\)")  # fmt: skip
  with pytest.raises(ValueError, match=message):
    sweeps.sweep_lanes(agent, _config(sweep=sweep))
  with pytest.raises(ValueError, match=message):
    _impala_main(tmp_path / "bad", sweep=sweep, agent=agent)
  assert not (tmp_path / "bad").exists()


def test_unsupported_settings_are_refused_before_compiling():
  with pytest.raises(ValueError, match="actor threads"):
    make_train(make_impala, ImpalaConfig(), _config(actors="async", num_actors=2))
  with pytest.raises(ValueError, match="batched env stepping"):
    make_train(make_sql, SqlConfig(), _config(env_batch_size=2))
  with pytest.raises(ValueError, match="needs a discrete action space"):
    make_train(make_sql_discrete, SqlConfig(), _config(env_id="gymnax:Pendulum-v1"))
  # ACER's replay ratio is the loop's replayed updates per iteration: not two values.
  with pytest.raises(ValueError, match=r"acer's replay_ratio \(4\) is its replayed updates per "
                     r"iteration, and num_updates_per_train_iter is 1: make them equal"):  # fmt: skip
    make_train(make_acer, AcerConfig(), _config(min_replay_size=8, mini_batch_size=8,
                                                mini_batch_length=4))  # fmt: skip
  with pytest.raises(ValueError, match="sqil learns from demonstrations .* give batch_fn="):
    make_train(make_sqil, SqlConfig(), _config(min_replay_size=8))  # plain SQL, named sqil
  with pytest.raises(ValueError, match="one vmapped learner, which cannot use actor threads"):
    TrainConfig.of(env_id="CartPole-v1", sweep=("learning_rate=0.1",), actors="async",
                   num_actors=2).validate()  # fmt: skip


@pytest.mark.parametrize("make, config", [(make_impala, ImpalaConfig()),
                                          (make_acer, AcerConfig(replay_ratio=1))],
                         ids=["impala", "acer"])  # fmt: skip
def test_continuous_agents_compile_on_a_continuous_jax_environment(make, config):
  """IMPALA's Gaussian policy and ACER's stochastic dueling network in one program, on
  gymnax's Pendulum (float32 actions clipped to the bounds by the environment)."""
  replay = {} if make is make_impala else dict(min_replay_size=8, mini_batch_size=8,
                                               mini_batch_length=4)  # fmt: skip
  compiled = make_train(make, config, _config(env_id="gymnax:Pendulum-v1", **replay))
  _, metrics = jax.jit(compiled.train)(jax.random.PRNGKey(0), compiled.hyperparams)
  assert np.isfinite(metrics["loss"][metrics["updated"]]).all() and metrics["updated"].any()
  assert metrics["episodes"].sum() == 0  # 640 steps over 4 envs: no 200-step episode ended yet
  assert np.isfinite(metrics["eval_return"][~np.isnan(metrics["eval_return"])]).all()


def test_repeated_sweep_flags_parse_into_one_sweep():
  """`--sweep A --sweep B` (or `--sweep=A`) reaches the config as one tuple, in order."""
  module = presets.impala
  argv = ["--env-id", CARTPOLE, "--sweep", "learning_rate=1e-3,3e-3", "--seed", "2",
          "--sweep=gamma=0.99,0.995"]  # fmt: skip
  args = parse_args(module.Args, module.PRESETS, argv=argv)
  assert args.train.budget.sweep == ("learning_rate=1e-3,3e-3", "gamma=0.99,0.995")
  assert args.train.budget.seed == 2


def test_compiling_for_startup_computes_what_compiling_for_speed_computes(tmp_path):
  """--compile-for startup changes how XLA compiles the chunk, not what it computes: one
  chunk (5 iterations) agrees with the speed-compiled run to rounding, and the run
  resumes exactly."""
  speed = tmp_path / "speed"
  _impala_main(speed, total_env_steps=160)
  startup = tmp_path / "startup"
  _impala_main(startup, total_env_steps=160, compile_for="startup")
  fast, quick = _lines(speed)[0], _lines(startup)[0]
  assert fast["episodes"] == quick["episodes"] and fast["num_updates"] == quick["num_updates"]
  for name in ("episode_return", "loss", "entropy"):
    np.testing.assert_allclose(quick[name], fast[name], rtol=1e-4, err_msg=name)

  straight = tmp_path / "straight"
  _impala_main(straight, compile_for="startup")
  cut = tmp_path / "cut"
  _impala_main(cut, total_env_steps=320, compile_for="startup")
  _impala_main(cut, compile_for="startup", resume=True)
  assert _lines(cut) == _lines(straight)


def test_the_chunk_compiles_with_the_startup_options_and_its_errors_reach_the_caller(
    tmp_path, monkeypatch
):
  """The chunk compiles on a background thread: an error there is raised by the run."""
  from offpolicy_ac.training import compiled_program

  monkeypatch.setattr(
      compiled_program, "startup_compile_options", lambda: {"xla_no_such_option": 1}
  )
  with pytest.raises(Exception, match="xla_no_such_option"):
    _impala_main(tmp_path / "run", compile_for="startup")
  _impala_main(tmp_path / "speed")  # the speed program does not use them


def test_startup_compile_options_are_given_to_a_cpu_compiler_only(monkeypatch):
  """The startup options name XLA:CPU options (a GPU's compiler refuses
  `xla_cpu_use_fusion_emitters`), so elsewhere `init` compiles with none."""
  from offpolicy_ac.training import learner

  assert learner.startup_compile_options() == learner.STARTUP_COMPILE_OPTIONS
  monkeypatch.setattr(learner, "STARTUP_COMPILE_OPTIONS", {"xla_no_such_option": 1})
  traced = learner.trace_init_lanes(lambda x: x + 1, jnp.arange(3.0))
  with pytest.raises(Exception, match="xla_no_such_option"):
    learner.run_once(traced, jnp.arange(3.0))
  monkeypatch.setattr(learner.jax, "default_backend", lambda: "gpu")
  assert learner.startup_compile_options() == {}
  np.testing.assert_array_equal(learner.run_once(traced, jnp.arange(3.0)), [1.0, 2.0, 3.0])


def test_compile_for_is_checked_before_anything_runs():
  with pytest.raises(ValueError, match="compile_for must be 'speed' or 'startup'"):
    _config(compile_for="fast").validate()
  with pytest.raises(ValueError, match="applies to a JAX environment's compiled run"):
    TrainConfig.of(env_id="CartPole-v1", compile_for="startup").validate()


def test_a_python_process_whose_compiled_run_was_refused_exits_cleanly(tmp_path):
  """A refusal after the programs began compiling (a run directory holding a run), caught
  by the caller, left XLA compiling on a daemon thread: the interpreter's exit aborted the
  process (SIGABRT, "terminate called after throwing an instance of ''")."""
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  (run_dir / "config.json").write_text(json.dumps({"config": {}, "algorithm": "impala"}))
  (run_dir / "metrics.jsonl").write_text(json.dumps({"env_steps": 1}) + "\n")
  code = f"""
import dataclasses
from offpolicy_ac.presets import impala
args = impala.Args(run_dir={str(run_dir)!r})
args = dataclasses.replace(args, train=args.train.replace(env_id={CARTPOLE!r}))
try:
  impala.run(args, progress=False)
except FileExistsError as e:
  print("refused:", e)
"""
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300, env=cpu_process_env())  # fmt: skip
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "already holds a run" in proc.stdout and "terminate called" not in proc.stderr


def test_train_and_init_refuse_a_key_that_is_not_one_and_take_traced_keys():
  compiled = make_train(make_impala, ImpalaConfig(), _config())
  for call in (compiled.train, compiled.init):
    with pytest.raises(ValueError, match=r"train/init: key must be a PRNG key .* got 0"):
      call(0, compiled.hyperparams)
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  states = jax.vmap(compiled.init, in_axes=(0, None))(keys, compiled.hyperparams)
  assert states.iteration.shape == (2,)
  state = jax.jit(compiled.init)(jax.random.key(1), compiled.hyperparams)
  assert int(state.iteration) == 0


def test_train_refuses_a_budget_its_32_bit_count_cannot_hold():
  """`train` counts env steps in int32: a longer budget is refused before anything traces
  (the scripts run such a budget in chunks of `run`); an evaluation interval past the
  budget, which no 32-bit count reaches, means no evaluation rather than an overflow."""
  key = jax.random.PRNGKey(0)
  long = make_train(make_impala, ImpalaConfig(), _config(total_env_steps=2**31))
  with pytest.raises(ValueError, match=r"train runs at most 2\*\*31 - 1 env steps .* chunks of "
                                       r"`run`"):  # fmt: skip
    jax.jit(long.train).lower(key, long.hyperparams)
  state, metrics = long.run(long.init(key, long.hyperparams), long.hyperparams, 1)
  assert int(state.env_steps) == long.steps_per_iteration == metrics["env_steps"][0]
  rare = make_train(make_impala, ImpalaConfig(), _config(eval_every=3_000_000_000))
  _, metrics = jax.jit(rare.train)(key, rare.hyperparams)
  assert np.isnan(metrics["eval_return"]).all() and metrics["env_steps"][-1] == 640


def test_concrete_hyperparams_the_config_refuses_are_refused_by_name():
  compiled = make_train(make_sql, SqlConfig(), _config(min_replay_size=8, mini_batch_size=8,
                                                       mini_batch_length=4))  # fmt: skip
  key = jax.random.PRNGKey(0)
  for field, value, message in (("alpha", 0.0, "alpha"), ("gamma", 1.5, "gamma"),
                                ("learning_rate", -1.0, "learning_rate")):  # fmt: skip
    bad = {**compiled.hyperparams, field: jnp.float32(value)}
    with pytest.raises(ValueError, match=rf"the setting .*'{field}': {value}.* is invalid: .*"
                                         rf"{message}"):  # fmt: skip
      compiled.init(key, bad)
    with pytest.raises(ValueError, match="is invalid"):
      compiled.train(key, bad)
  state = compiled.init(key, {**compiled.hyperparams, "gamma": jnp.float32(0.9)})
  assert int(state.iteration) == 0
