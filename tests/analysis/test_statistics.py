"""Grouping runs by configuration, aligning them, and the IQM with bootstrap intervals.

Synthetic run directories (config.json and metrics.jsonl written here, in the format of
`analysis.metrics_file`); the IQM checked by hand and against NumPy; the script end to end.
"""

import json
import pathlib
import warnings

import numpy as np
import pytest
from rliable import metrics as rly_metrics
from scripts import load_script

from offpolicy_ac.analysis import statistics as S
from offpolicy_ac.analysis.metrics_file import encode_line
from offpolicy_ac.analysis.metrics_file import jsonable
from offpolicy_ac.training import TrainConfig


def write_run(run_dir, *, algorithm="impala", seed=0, lr=6e-4, steps=(0, 100, 200),
              returns=None, eval_returns=None, **train_fields):  # fmt: skip
  """A run directory as run_experiment writes it (config.json, metrics.jsonl)."""
  run_dir = pathlib.Path(run_dir)
  run_dir.mkdir(parents=True)
  train = TrainConfig.of(seed=seed, **train_fields)
  config = {
      "config": {
          "train": jsonable(train),
          "agent": {"learning_rate": lr, "gamma": 0.99, "hidden_sizes": [64, 64]},
          "resume": False,
          "run_dir": str(run_dir),
      },
      "git_revision": f"rev{seed}",
      "algorithm": algorithm,
  }
  (run_dir / "config.json").write_text(json.dumps(config))
  returns = np.arange(len(steps), dtype=float) + seed if returns is None else returns
  lines = []
  for i, step in enumerate(steps):
    record = {"env_steps": step, "wall_time_s": 0.1 * i, "episode_return": float(returns[i])}
    if eval_returns is not None:
      record["eval_return"] = float(eval_returns[i])
    lines.append(encode_line(record))
  (run_dir / "metrics.jsonl").write_text("".join(lines))
  return run_dir


def _groups(paths):
  return S.group_runs([S.run_info(d) for d in S.find_runs(paths)])


# --- grouping -------------------------------------------------------------------------


def test_seeds_pool_and_a_different_learning_rate_separates(tmp_path):
  for s in range(3):
    write_run(tmp_path / f"a{s}", seed=s, log_every=1000 + s, checkpoint_every=500 * s,
              compile_for=("speed", "startup")[s % 2])  # fmt: skip
  for s in range(2):
    write_run(tmp_path / f"b{s}", seed=s, lr=1e-3)
  groups = _groups([tmp_path])
  assert sorted(len(g.runs) for g in groups) == [2, 3]
  by_size = {len(g.runs): g for g in groups}
  assert {r.seed for r in by_size[3].runs} == {0, 1, 2}
  assert dict(by_size[3].settings)["agent.learning_rate"] == 6e-4
  assert dict(by_size[2].settings)["agent.learning_rate"] == 1e-3
  labels = dict(zip([len(g.runs) for g in groups], S.group_labels(groups)))
  assert labels == {3: "impala learning_rate=0.0006", 2: "impala learning_rate=0.001"}


def test_labels_write_values_as_a_sweep_names_its_directories(tmp_path):
  """A sweep's learner of learning_rate 1.0 is in learning_rate=1/: its label says the same;
  a value that 6 digits would round keeps all of them."""
  for name, lr in [("one", 1.0), ("half", 0.5), ("fine", 1.0000001e-3), ("round", 1e-3)]:
    write_run(tmp_path / name, lr=lr)
  assert sorted(S.group_labels(_groups([tmp_path]))) == [
      "impala learning_rate=0.001", "impala learning_rate=0.0010000001",
      "impala learning_rate=0.5", "impala learning_rate=1"]  # fmt: skip


def test_runs_are_grouped_by_their_input_files_contents_not_paths(tmp_path):
  """SQIL's runs record their demonstrations' path in the config and its digest in
  `inputs`: the same file under two paths pools, another file under the same path does
  not."""
  for name, path, digest in [("a", "demos.npz", "aa" * 32), ("b", "/data/demos.npz", "aa" * 32),
                             ("c", "demos.npz", "bb" * 32)]:  # fmt: skip
    run = write_run(tmp_path / name, algorithm="sqil", seed=ord(name))
    record = json.loads((run / "config.json").read_text())
    record["config"]["demos"] = path
    record["inputs"] = {"demos": digest}
    (run / "config.json").write_text(json.dumps(record))
  groups = _groups([tmp_path])
  assert sorted(len(g.runs) for g in groups) == [1, 2]
  assert sorted(S.group_labels(groups)) == [  # digests, and the names they were read from
      "sqil demos=demos.npz (sha256:aaaaaaaaaaaa)",
      "sqil demos=demos.npz (sha256:bbbbbbbbbbbb)",
  ]
  (tmp_path / "b" / "config.json").write_text(
      (tmp_path / "b" / "config.json").read_text().replace("/data/demos.npz", "/data/other.npz")
  )
  assert "sqil demos=demos.npz, other.npz (sha256:aaaaaaaaaaaa)" in S.group_labels(
      _groups([tmp_path])
  )


def test_final_scores_table_gives_the_iqm_of_the_runs_final_greedy_returns(tmp_path):
  """For runs too short for a logged evaluation: their summary.json's last_eval_return."""
  scores = {("a", 0): 10.0, ("a", 1): 30.0, ("b", 0): 5.0, ("b", 1): 7.0}
  for (name, seed), score in scores.items():
    lr = 1e-3 if name == "a" else 3e-3
    run = write_run(tmp_path / f"{name}{seed}", seed=seed, lr=lr)
    (run / "summary.json").write_text(json.dumps({"last_eval_return": score}))
  groups = _groups([tmp_path])
  curves, labels = [S.group_curve(g) for g in groups], S.group_labels(groups)
  assert {c.metric for c in curves} == {"episode_return"}  # no greedy evaluation logged
  title, *table = S.final_scores_table(curves, labels).splitlines()
  assert title == "The final parameters' greedy returns (summary.json):"
  assert table[0].split() == ["group", "env", "runs", "final", "greedy", "return", "IQM",
                              "[95%", "CI]"]  # fmt: skip
  assert table[2].split() == ["impala", "learning_rate=0.001", "CartPole-v1", "2", "20.00",
                              "[10.00,", "30.00]"]  # fmt: skip
  assert table[3].split()[-3:] == ["6.0000", "[5.0000,", "7.0000]"]
  # Curves of greedy returns, or of any other metric, need no second table.
  for metric in ("eval_return", "loss"):
    assert S.final_scores_table([c._replace(metric=metric) for c in curves], labels) is None
  # A run stopped before its end, or one being resumed, has no final score yet: its group's
  # row says so, the other groups' keep theirs; with no group scored, there is no table.
  unscored = "- (a run not finished, or without a final evaluation)"
  for unfinished in ({"interrupted": True}, {"resumed_since": "2026-01-01T00:00:00+0000"}):
    (tmp_path / "b1" / "summary.json").write_text(
        json.dumps({"last_eval_return": 7.0, **unfinished})
    )
    _, _, _, row_a, row_b = S.final_scores_table(curves, labels).splitlines()
    assert row_a.split()[-3:] == ["20.00", "[10.00,", "30.00]"] and row_b.endswith(unscored)
  (tmp_path / "b1" / "summary.json").write_text(
      json.dumps({"last_eval_return": 7.0, "interrupted": False})
  )
  assert S.final_scores_table(curves, labels).splitlines()[4].split()[-3:] == [
      "6.0000",
      "[5.0000,",
      "7.0000]",
  ]
  (tmp_path / "b1" / "summary.json").unlink()  # a run still training: no score to give
  assert S.final_scores_table(curves, labels).splitlines()[4].endswith(unscored)
  (tmp_path / "a1" / "summary.json").unlink()
  assert S.final_scores_table(curves, labels) is None
  with pytest.raises(ValueError, match="one label per curve"):
    S.final_scores_table(curves, ["one"])


def test_algorithms_and_environments_are_never_pooled(tmp_path):
  # Identical configs but for the algorithm, or but for the environment.
  write_run(tmp_path / "impala0", algorithm="impala", seed=0)
  write_run(tmp_path / "impala1", algorithm="impala", seed=1)
  write_run(tmp_path / "acer0", algorithm="acer", seed=0)
  write_run(tmp_path / "pend0", algorithm="impala", seed=0, env_id="Pendulum-v1")
  groups = _groups([tmp_path])
  keys = sorted((g.algorithm, g.env_id, len(g.runs)) for g in groups)
  assert keys == [("acer", "CartPole-v1", 1), ("impala", "CartPole-v1", 2),
                  ("impala", "Pendulum-v1", 1)]  # fmt: skip
  for g in groups:
    assert {r.algorithm for r in g.runs} == {g.algorithm}
    assert {r.env_id for r in g.runs} == {g.env_id}
  # Each algorithm is alone in its figure's group of that algorithm: its name suffices.
  assert sorted(S.group_labels(groups)) == ["acer", "impala", "impala"]


def test_fields_that_change_learning_are_kept(tmp_path):
  write_run(tmp_path / "a", seed=0)
  write_run(tmp_path / "b", seed=1, num_envs=8)
  write_run(tmp_path / "c", seed=2, eval_every=1000)
  # The budget: the default evaluation interval and an annealed step size derive from it.
  write_run(tmp_path / "d", seed=3, total_env_steps=10**6)
  assert len(_groups([tmp_path])) == 4
  assert "train.budget.seed" in S.IGNORED_FIELDS
  assert "train.env.num_envs" not in S.IGNORED_FIELDS


def test_one_module_imported_by_name_or_by_path_is_one_configuration(tmp_path):
  for seed, spelling in enumerate(["my_torsos", "src/my_torsos.py"]):
    path = write_run(tmp_path / f"s{seed}", seed=seed) / "config.json"
    config = json.loads(path.read_text())
    config["config"]["import_modules"] = [spelling]  # a --resume may change it too
    path.write_text(json.dumps(config))
  assert [len(g.runs) for g in _groups([tmp_path])] == [2]


def test_find_runs_searches_below_and_skips_dirs_without_metrics(tmp_path):
  a = write_run(tmp_path / "x" / "seed0", seed=0)
  b = write_run(tmp_path / "x" / "seed1", seed=1)
  (tmp_path / "x" / "config.json").write_text("{}")  # a vmapped run's root: no metrics
  assert S.find_runs([tmp_path]) == [a.resolve(), b.resolve()]
  assert S.find_runs([a]) == [a.resolve()]
  with pytest.raises(ValueError, match="does not exist"):
    S.find_runs([tmp_path / "missing"])
  with pytest.raises(ValueError, match="no run directory"):
    S.find_runs([tmp_path / "x" / "seed0" / "metrics.jsonl"])
  with pytest.raises(ValueError, match="no config.json"):
    S.run_info(tmp_path)


def test_find_runs_counts_a_multi_host_job_once(tmp_path):
  """Processes other than 0 log the same learner in root/process<i>: not another seed."""
  fields = dict(num_processes=2, coordinator_address="localhost:1234")
  root = write_run(tmp_path / "job", **fields)
  write_run(root / "process1", process_id=1, **fields)
  assert S.find_runs([tmp_path]) == [root.resolve()]


def test_find_runs_follows_links_to_run_directories_once(tmp_path):
  a = write_run(tmp_path / "runs" / "a", seed=0)
  (tmp_path / "linked").mkdir()
  (tmp_path / "linked" / "a").symlink_to(a, target_is_directory=True)
  (tmp_path / "linked" / "loop").symlink_to(tmp_path / "linked", target_is_directory=True)
  assert S.find_runs([tmp_path / "linked"]) == [a.resolve()]


def test_find_runs_expands_the_home_directory(tmp_path, monkeypatch):
  a = write_run(tmp_path / "runs" / "a", seed=0)
  monkeypatch.setenv("HOME", str(tmp_path))
  assert S.find_runs(["~/runs"]) == [a.resolve()]


def test_a_field_a_config_lacks_is_not_its_null(tmp_path):
  # Two groups that differ only there (configs of two versions) get labels of their own.
  a, b = write_run(tmp_path / "a", seed=0), write_run(tmp_path / "b", seed=0)
  config = json.loads((b / "config.json").read_text())
  assert config["config"]["train"]["env"].pop("max_episode_steps") is None
  (b / "config.json").write_text(json.dumps(config))
  labels = S.group_labels(_groups([a, b]))
  assert len(set(labels)) == 2 and any("(not recorded)" in label for label in labels), labels


# --- alignment -------------------------------------------------------------------------


def test_align_keeps_shared_steps():
  x = np.array([0.0, 10.0, 20.0])
  steps, ys = S.align_runs([(x, [1, 2, 3]), (x, [4, 5, 6])])
  np.testing.assert_array_equal(steps, x)
  np.testing.assert_array_equal(ys, [[1, 2, 3], [4, 5, 6]])


def test_align_interpolates_on_the_common_range():
  # Logged at other cadences (every 100 and every 50 steps): interpolated.
  a = (np.array([0.0, 100.0, 200.0, 300.0]), np.array([0.0, 1.0, 2.0, 3.0]))
  b = (np.array([10.0, 60.0, 110.0, 160.0, 210.0]), np.full(5, 5.0))
  steps, ys = S.align_runs([a, b], max_points=200)
  assert steps[0] == 10.0 and steps[-1] == 210.0  # latest start, earliest end
  assert len(steps) == 5  # as many points as the densest run has there
  np.testing.assert_allclose(ys[0], steps / 100.0)
  np.testing.assert_allclose(ys[1], 5.0)
  with pytest.raises(ValueError, match="overlap"):
    S.align_runs([(np.array([0.0, 1.0]), np.zeros(2)), (np.array([2.0, 3.0]), np.zeros(2))])
  # A run that logged at its first and last steps only, against one that logged every step:
  # their last lines differ by more than the jitter, but they are not runs of one interval
  # (they were cut to their one shared first point).
  steps, ys = S.align_runs([(np.arange(1000.0), np.ones(1000)), ([0.0, 999.0], [0.0, 1.0])])
  assert steps[0] == 0.0 and steps[-1] == 999.0 and len(steps) == 200
  np.testing.assert_allclose(ys[1], steps / 999.0)
  # A short run's own last gap (a partial interval) does not make its interval another.
  steps, ys = S.align_runs([([256, 512, 600], [10.0, 20.0, 99.0]),
                            ([256, 512, 768, 1000], [1.0, 2.0, 3.0, 4.0])])  # fmt: skip
  np.testing.assert_array_equal(steps, [256, 512])
  np.testing.assert_array_equal(ys, [[10.0, 20.0], [1.0, 2.0]])


def test_runs_that_share_one_step_align_there():
  # A run that logged one line (just started, or killed early) cuts the curve to its step.
  steps, ys = S.align_runs([(np.array([5.0, 10.0]), np.array([1.0, 2.0])),
                            (np.array([5.0]), np.array([7.0]))])  # fmt: skip
  np.testing.assert_array_equal(steps, [5.0])
  np.testing.assert_array_equal(ys, [[1.0], [7.0]])


def test_runs_that_logged_the_same_steps_up_to_a_jitter_keep_their_points():
  # Actor threads end iterations a few steps apart: the logged values are kept (run a's peak
  # of 422.8 too), at the median of the runs' steps; a run still going cuts the curve where
  # it ends, on the steps they share.
  a = ([5120, 10240, 15104, 20224], [68.0, 223.4, 422.8, 165.8])
  b = ([5000, 10112, 15232, 20096], [147.8, 326.8, 262.4, 405.8])
  steps, ys = S.align_runs([a, b])
  np.testing.assert_array_equal(steps, [5060, 10176, 15168, 20160])
  np.testing.assert_array_equal(ys, [a[1], b[1]])
  steps, ys = S.align_runs([a, (a[0][:3], [1.0, 2.0, 3.0])])
  np.testing.assert_array_equal(steps, a[0][:3])
  np.testing.assert_array_equal(ys, [a[1][:3], [1.0, 2.0, 3.0]])
  # A last line for the partial interval at the end of a budget (310) is a small interval:
  # the others still align, without that last line.
  steps, ys = S.align_runs([([100, 200, 300, 310], [1.0, 2, 3, 4]),
                            ([101, 199, 302, 400], [5.0, 6, 7, 8])])  # fmt: skip
  np.testing.assert_array_equal(steps, [100.5, 199.5, 301])
  np.testing.assert_array_equal(ys, [[1, 2, 3], [5, 6, 7]])
  # Runs that each logged one line, a few steps apart (just started): one point.
  steps, ys = S.align_runs([([5120], [1.0]), ([5000], [2.0])])
  np.testing.assert_array_equal(steps, [5060])
  np.testing.assert_array_equal(ys, [[1.0], [2.0]])


def test_a_nan_value_leaves_its_step_out_and_is_never_made_up():
  x = np.array([0.0, 100.0, 200.0])
  steps, ys = S.align_runs([(x, [0.0, np.nan, 100.0]), (x, [0.0, 10.0, 20.0])])
  np.testing.assert_array_equal(steps, [0.0, 200.0])
  np.testing.assert_array_equal(ys, [[0.0, 100.0], [0.0, 20.0]])
  with pytest.raises(ValueError, match="no step where every run has a finite value"):
    S.align_runs([(x, [0.0, np.nan, np.nan]), (x, [np.nan, 1.0, 2.0])])
  # Interpolated runs are interpolated over their finite values only.
  steps, ys = S.align_runs([(x, [0.0, np.nan, 100.0]), ([0.0, 50.0, 150.0, 200.0], np.ones(4))])
  assert np.all(np.isfinite(ys))
  np.testing.assert_allclose(ys[0], steps / 2.0)


def test_align_refuses_steps_that_do_not_increase_and_lengths_that_differ():
  with pytest.raises(ValueError, match=r"run 0's steps do not increase \(200 then 0\)"):
    S.align_runs([([100, 200, 0, 50], np.zeros(4)), ([0, 100], np.zeros(2))])
  with pytest.raises(ValueError, match="run 1 has 3 steps and 2 values"):
    S.align_runs([([0, 1, 2], np.zeros(3)), ([0, 1, 2], np.zeros(2))])


def test_group_curve_names_the_run_of_a_bad_value_or_of_steps_out_of_order(tmp_path):
  run = write_run(tmp_path / "r0", steps=(0, 100, 200))
  metrics = run / "metrics.jsonl"
  good = metrics.read_text()
  metrics.write_text(good.replace('"episode_return": 1.0', '"episode_return": "x"'))
  with pytest.raises(ValueError, match=r"r0: episode_return at env step 100 is 'x', not a num"):
    S.group_curve(_groups([tmp_path])[0], reps=50)
  metrics.write_text(good + good)  # two runs' files joined
  with pytest.raises(ValueError, match=r"r0: its metrics.jsonl logs env step 200, then 0"):
    S.group_curve(_groups([tmp_path])[0], reps=50)
  metrics.write_text(good.replace('"episode_return": 1.0', '"episode_return": NaN'))
  write_run(tmp_path / "r1", seed=1, steps=(0, 100, 200))
  with pytest.warns(
      RuntimeWarning, match=r"r0 logged episode_return NaN or infinite at env steps 100"
  ):
    curve = S.group_curve(_groups([tmp_path])[0], reps=50)
  np.testing.assert_array_equal(curve.env_steps, [0, 200])


def test_find_runs_takes_one_path_and_skips_what_it_cannot_read(tmp_path, monkeypatch):
  write_run(tmp_path / "runs" / "r0")
  assert S.find_runs(str(tmp_path / "runs")) == [(tmp_path / "runs" / "r0").resolve()]
  assert S.find_runs(tmp_path / "runs") == S.find_runs([tmp_path / "runs"])
  # A folder whose entries cannot be looked at (EACCES; root reads any mode, so the error
  # is made here), beside runs and with one inside: skipped, the runs beside it found.
  write_run(tmp_path / "runs" / "locked" / "r1")
  write_run(tmp_path / "runs" / "z2", seed=2)

  def refused(method):
    def call(self, *args, **kwargs):
      if "locked" in self.parts and self.name != "locked":
        raise PermissionError(13, "Permission denied", str(self))
      return method(self, *args, **kwargs)

    return call

  for name in ("exists", "is_dir", "stat"):
    monkeypatch.setattr(pathlib.Path, name, refused(getattr(pathlib.Path, name)))
  runs = tmp_path / "runs"
  assert S.find_runs([runs]) == [(runs / "r0").resolve(), (runs / "z2").resolve()]


@pytest.mark.parametrize("content", ["[1, 2]", '"hi"', "null", '{"config": [1]}'])
def test_run_info_refuses_a_config_json_that_is_not_a_runs(tmp_path, content):
  run = write_run(tmp_path / "r0")
  (run / "config.json").write_text(content)
  with pytest.raises(ValueError, match=r"is not a run's config.json \(no `config` object\)"):
    S.run_info(run)


# --- IQM and intervals -----------------------------------------------------------------


def test_iqm_by_hand():
  # 8 runs: drop the 2 lowest and 2 highest, mean of the middle 4.
  scores = np.array([100.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, -50.0])
  assert S.iqm(scores) == pytest.approx((2 + 3 + 4 + 5) / 4)
  # 4 runs: the middle 2; per point along the other axis.
  cols = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [40.0, 400.0]])
  np.testing.assert_allclose(S.iqm(cols), [2.5, 25.0])


def test_iqm_matches_rliable_and_numpy():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(12, 7))
  expected = [rly_metrics.aggregate_iqm(scores[:, j : j + 1]) for j in range(7)]
  np.testing.assert_allclose(S.iqm(scores), expected)
  ordered = np.sort(scores, axis=0)[3:9]  # 12 runs: the middle 6
  np.testing.assert_allclose(S.iqm(scores), ordered.mean(0))


def test_intervals_bracket_the_iqm_repeat_with_the_seed_and_shrink_with_more_runs():
  rng = np.random.default_rng(1)
  few, many = rng.normal(size=(5, 3)), rng.normal(size=(80, 3))
  est = S.iqm_with_intervals(few, reps=500, seed=3)
  np.testing.assert_allclose(est.point, S.iqm(few))
  assert np.all(est.lower <= est.point) and np.all(est.point <= est.upper)
  assert np.all(est.upper - est.lower > 0)
  again = S.iqm_with_intervals(few, reps=500, seed=3)
  np.testing.assert_array_equal(again.lower, est.lower)
  np.testing.assert_array_equal(again.upper, est.upper)
  wide = S.iqm_with_intervals(few, reps=500, seed=0)
  narrow = S.iqm_with_intervals(many, reps=500, seed=0)
  assert np.all(narrow.upper - narrow.lower < wide.upper - wide.lower)


def test_interval_matches_a_numpy_bootstrap():
  # One task: the stratified bootstrap resamples runs; percentile interval.
  rng = np.random.default_rng(2)
  scores = rng.normal(size=(10, 1))
  est = S.iqm_with_intervals(scores, reps=2000, seed=0)
  idx = np.random.default_rng(5).integers(0, 10, size=(10, 4000))
  boot = np.sort(scores[idx, 0], axis=0)[2:8].mean(0)  # 10 runs: the middle 6
  lo, hi = np.percentile(boot, [2.5, 97.5])
  assert est.lower[0] == pytest.approx(lo, abs=0.1)
  assert est.upper[0] == pytest.approx(hi, abs=0.1)


def test_identical_runs_give_a_zero_width_interval():
  est = S.iqm_with_intervals(np.full((4, 2), 7.0), reps=100)
  np.testing.assert_allclose([est.lower, est.point, est.upper], 7.0)


def test_bad_scores_raise():
  with pytest.raises(ValueError, match="runs, points"):
    S.iqm_with_intervals(np.zeros(3))
  with pytest.raises(ValueError, match="finite"):
    S.iqm_with_intervals(np.array([[np.nan]]))
  with pytest.raises(ValueError, match="at least one run"):
    S.iqm(np.zeros((0, 3)))
  with pytest.raises(ValueError, match="at least one run"):
    S.iqm([])
  with pytest.raises(ValueError, match="finite"):
    S.iqm([[1.0], [np.nan], [3.0], [4.0]])


def test_too_few_bootstrap_replications_raise():
  scores = np.arange(8.0).reshape(4, 2)
  with pytest.raises(ValueError, match=r"reps=39 is too few for a 0.95 interval.*reps >= 40"):
    S.iqm_with_intervals(scores, reps=39)
  with pytest.raises(ValueError, match=r"reps >= 200"):
    S.iqm_with_intervals(scores, reps=100, confidence=0.99)
  S.iqm_with_intervals(scores, reps=40)
  with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\)"):
    S.iqm_with_intervals(scores, confidence=1.0)


# --- curves, table, script -------------------------------------------------------------


def test_group_curve_prefers_evaluation_returns(tmp_path):
  for s in range(4):
    write_run(tmp_path / f"r{s}", seed=s, steps=(100 + s, 200 + s, 300 + s),
              returns=[0.0, 0.0, 0.0], eval_returns=[s, 10.0 + s, 20.0 + s])  # fmt: skip
  (group,) = _groups([tmp_path])
  curve = S.group_curve(group, reps=200)
  assert curve.metric == "eval_return"
  # Steps 3 apart at most, 100 apart in a run: the same steps (their median), as logged.
  np.testing.assert_array_equal(curve.env_steps, [101.5, 201.5, 301.5])
  # At the last step the runs read 20 + s: IQM of 4 = mean of the middle 2.
  assert curve.iqm[-1] == pytest.approx(np.mean([21.0, 22.0]))
  assert S.group_curve(group, metric="episode_return", reps=50).iqm[-1] == 0.0


@pytest.mark.parametrize("gap", [1, 2, 3])
def test_an_interval_without_episodes_leaves_its_step_out_not_the_ones_after(tmp_path, gap):
  """A null episode_return (no episode ended in the interval) is a step without a value:
  the runs stay aligned line by line (a gap before the last line had cut the curve short
  by two steps, without a word)."""
  steps = (5000, 10000, 15000, 20000, 25000)
  returns = [10.0, 20.0, 30.0, 40.0, 50.0]
  run = write_run(tmp_path / "r0", seed=0, steps=steps, returns=returns)
  metrics = run / "metrics.jsonl"  # as the logger writes a return of no episode: null
  missing = f'"episode_return": {returns[gap]}'
  metrics.write_text(metrics.read_text().replace(missing, '"episode_return": null'))
  write_run(tmp_path / "r1", seed=1, steps=steps, returns=returns)
  (group,) = _groups([tmp_path])
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no episode ended: nothing to warn of
    curve = S.group_curve(group, reps=50)
  assert curve.metric == "episode_return"
  np.testing.assert_array_equal(curve.env_steps, [s for k, s in enumerate(steps) if k != gap])
  np.testing.assert_array_equal(curve.iqm, [r for k, r in enumerate(returns) if k != gap])


def test_a_short_run_or_a_repeated_seed_in_a_group_is_named(tmp_path):
  for s in range(3):
    write_run(tmp_path / f"r{s}", seed=s, steps=(0, 100, 200))
  write_run(tmp_path / "smoke", seed=0, steps=(0, 50, 100))
  (group,) = _groups([tmp_path])
  with pytest.warns(RuntimeWarning) as caught:
    curve = S.group_curve(group, reps=50)
  messages = [str(w.message) for w in caught]
  assert any("the curve stops at 100 env steps, where" in m and "smoke" in m for m in messages)
  assert any("the same seed" in m and "r0" in m and "smoke" in m for m in messages)
  assert curve.env_steps[-1] == 100
  write_run(tmp_path / "late", seed=5, steps=(300, 400))  # no overlap with the others
  (group,) = _groups([tmp_path])
  with pytest.warns(RuntimeWarning), pytest.raises(ValueError, match=r"late \[300, 400\]"):
    S.group_curve(group, reps=50)


def test_nan_values_and_a_run_without_evaluations_are_named(tmp_path):
  """NaN is logged as null: left out of the curve, with a warning naming the run; a run
  without evaluations moves the group to episode_return, with a warning naming it."""
  for s in range(3):
    write_run(tmp_path / f"r{s}", seed=s, steps=(0, 100, 200), eval_returns=[0.0, 1.0, 2.0])
  metrics = tmp_path / "r1" / "metrics.jsonl"
  metrics.write_text(metrics.read_text().replace('"eval_return": 2.0', '"eval_return": null'))
  (group,) = _groups([tmp_path])
  with pytest.warns(RuntimeWarning, match=r"r1 logged eval_return NaN or infinite at env "
                                          r"steps 200"):  # fmt: skip
    assert S.group_curve(group, reps=50).metric == "eval_return"
  # Infinity (not the logger's, another writer's) is left out the same way, and named.
  metrics.write_text(metrics.read_text().replace('"eval_return": null', '"eval_return": Infinity'))
  with pytest.warns(RuntimeWarning, match=r"r1 logged eval_return NaN or infinite"):
    assert S.group_curve(group, reps=50).metric == "eval_return"
  write_run(tmp_path / "r3", seed=3, steps=(0, 100, 200))
  (group,) = _groups([tmp_path])
  with pytest.warns(RuntimeWarning, match=r"compared on episode_return, since .*r3 logged no"):
    assert S.group_curve(group, reps=50).metric == "episode_return"
  # A run whose every evaluation is NaN is a run without evaluations: kept, on
  # episode_return (it was left out of the group, raising its IQM).
  write_run(tmp_path / "r4", seed=4, steps=(0, 100, 200), eval_returns=[np.nan] * 3)
  (tmp_path / "r3" / "metrics.jsonl").unlink()
  (tmp_path / "r3" / "config.json").unlink()
  (group,) = _groups([tmp_path])
  with pytest.warns(RuntimeWarning, match=r"since .*r4 logged no eval_return \(or only NaN\)"):
    curve = S.group_curve(group, reps=50)
  assert curve.metric == "episode_return" and len(curve.group.runs) == 4


def test_a_run_that_logged_nothing_yet_is_left_out_of_its_group(tmp_path):
  """A run just started (no episode ended, no evaluation) is left out with a warning: it
  neither stops the plot nor moves its group to episode_return."""
  for s in range(3):
    write_run(tmp_path / f"r{s}", seed=s, steps=(0, 100, 200), eval_returns=[0.0, 1.0, 2.0])
  started = write_run(tmp_path / "started", seed=3, steps=(0,))
  (started / "metrics.jsonl").write_text('{"env_steps": 64, "episode_return": null}\n')
  (group,) = _groups([tmp_path])
  with pytest.warns(RuntimeWarning, match=r"left out .*started, which logged no eval_return"):
    curve = S.group_curve(group, reps=50)
  assert curve.metric == "eval_return" and len(curve.group.runs) == 3
  assert "started" not in " ".join(str(r.run_dir) for r in curve.group.runs)
  (group,) = _groups([started])
  with pytest.raises(ValueError, match=r"no run logged episode_return \(.*started\)"):
    S.group_curve(group, reps=50)
  (started / "metrics.jsonl").write_text("")  # as the logger opens it: found, and named
  (group,) = _groups([tmp_path])
  with pytest.warns(RuntimeWarning, match=r"left out .*started, which logged no eval_return"):
    assert len(S.group_curve(group, reps=50).group.runs) == 3


@pytest.mark.parametrize("line, fragment", [
    ('[1, 2]\n', "line 4 is not a metrics line"),
    ('{"wall_time_s": 1.0}\n', "line 4 is not a metrics line"),
    ('{"env_steps": NaN}\n', "line 4 is not a metrics line"),
    ('{"env_steps": true}\n', "line 4 is not a metrics line"),
    ('{"env_steps": 3\n{"env_steps": 4}\n', "is damaged: line 4 is not valid JSON"),
    ('\udc92\udcff\n{"env_steps": 4}\n', "is damaged: line 4 is not valid JSON"),  # not UTF-8
])  # fmt: skip
def test_metrics_lines_that_are_not_metrics_are_refused(tmp_path, line, fragment):
  run = write_run(tmp_path / "run", steps=(0, 1, 2))
  good = (run / "metrics.jsonl").read_text()
  (run / "metrics.jsonl").write_bytes((good + line).encode("utf-8", "surrogateescape"))
  with pytest.raises(ValueError, match=fragment):
    S.group_curve(_groups([tmp_path])[0], reps=50)
  (run / "metrics.jsonl").write_text(good + '{"env_st')
  assert len(S.read_metrics(run)) == 3  # a last line cut by a kill is skipped
  (tmp_path / "good.jsonl").write_text(good)
  (run / "metrics.jsonl").write_text("\n" + good.replace("\n", "\n \n", 1) + "\n\n")
  assert S.read_metrics(run) == S.read_metrics(tmp_path / "good.jsonl")  # blank lines: nothing


def test_read_metrics_takes_the_run_directory_or_its_metrics_file(tmp_path):
  run = write_run(tmp_path / "run", steps=(0, 1, 2))
  by_dir = S.read_metrics(run)
  assert [r["env_steps"] for r in by_dir] == [0, 1, 2]
  assert S.read_metrics(run / "metrics.jsonl") == by_dir
  (tmp_path / "started").mkdir()
  (tmp_path / "started" / "config.json").write_text("{}")
  assert S.read_metrics(tmp_path / "started") == []  # no metrics yet
  # A folder of runs, or of anything else, is no run of no metrics: a plot of it would be
  # empty in silence.
  write_run(tmp_path / "mine" / "a")
  with pytest.raises(ValueError, match=r"mine is not a run directory .*: the runs below it "
                                       r"are .*mine/a"):  # fmt: skip
    S.read_metrics(tmp_path / "mine")
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match=r"empty is not a run directory \(no config.json"):
    S.read_metrics(tmp_path / "empty")
  with pytest.raises(FileNotFoundError, match="runz does not exist"):
    S.read_metrics(tmp_path / "runz")
  write_run(tmp_path / "seeds" / "seed0")
  write_run(tmp_path / "seeds" / "seed1")
  with pytest.raises(
      ValueError, match=r"holds several learners' runs: read one of them \(.*seed0, .*seed1\)"
  ):
    S.read_metrics(tmp_path / "seeds")


def test_plot_script_end_to_end(tmp_path, capsys):
  runs = tmp_path / "runs"
  for s in range(3):
    write_run(runs / f"impala-lr6e-4-{s}", seed=s, steps=(0, 1000 + s, 2000 + 2 * s))
    write_run(runs / f"impala-lr1e-3-{s}", seed=s, lr=1e-3, steps=(0, 1000, 2000),
              returns=[0.0, 10.0 + s, 20.0 + s])  # fmt: skip
  write_run(runs / "acer-pendulum", algorithm="acer", env_id="Pendulum-v1")
  plot = load_script("plot")
  out = tmp_path / "plots"
  curves = plot.main(plot.Args(paths=(str(runs),), out_dir=str(out), reps=200))
  assert sorted(p.name for p in out.iterdir()) == ["CartPole-v1.png", "Pendulum-v1.png"]
  assert all(p.stat().st_size > 0 for p in out.iterdir())
  assert len(curves) == 3
  text = capsys.readouterr().out
  assert "final IQM [95% CI]" in text
  row = next(line for line in text.splitlines() if "learning_rate=0.001" in line)
  assert "CartPole-v1" in row and "episode_return" in row and " 3 " in row
  final = row.split()[-3:]  # IQM of 20, 21, 22 (3 runs: their mean) and its interval
  assert final[0] == "21.00"
  lower, upper = float(final[1].strip("[,")), float(final[2].strip("]"))
  assert 20.0 <= lower < 21.0 < upper <= 22.0
  assert any(line.startswith("acer ") and "Pendulum-v1" in line for line in text.splitlines())


def test_plot_script_bootstraps_the_final_scores_with_its_reps_and_seed(tmp_path, capsys):
  """The final greedy returns' intervals are drawn as the curves' are, with --reps and
  --seed (they were left at the defaults: any --reps or --seed printed the same table)."""
  for seed, score in enumerate([10.0, 25.0, 33.0, 47.0, 52.0, 68.0, 71.0, 99.0]):
    run = write_run(tmp_path / "runs" / f"r{seed}", seed=seed)
    (run / "summary.json").write_text(json.dumps({"last_eval_return": score}))
  plot = load_script("plot")

  def finals(**kw):
    plot.main(plot.Args(paths=(str(tmp_path / "runs"),), out_dir=str(tmp_path / "p"), **kw))
    text = capsys.readouterr().out
    return text.split("The final parameters' greedy returns")[1].splitlines()[-1].split()[-3:]

  for reps, seed in [(2000, 0), (40, 7)]:
    est = S.iqm_with_intervals(np.asarray([10.0, 25, 33, 47, 52, 68, 71, 99])[:, None],
                               reps=reps, seed=seed)  # fmt: skip
    want = [S._number(est.point[0]), f"[{S._number(est.lower[0])},",
            f"{S._number(est.upper[0])}]"]  # fmt: skip
    assert finals(reps=reps, seed=seed) == want
  assert finals(reps=40, seed=7) != finals()


def test_plot_script_leaves_out_a_group_that_logged_nothing_yet(tmp_path, capsys):
  runs = tmp_path / "runs"
  write_run(runs / "impala", seed=0)
  started = write_run(runs / "acer", algorithm="acer", env_id="Pendulum-v1")
  (started / "metrics.jsonl").write_text('{"env_steps": 64, "episode_return": null}\n')
  plot = load_script("plot")
  with pytest.warns(RuntimeWarning, match=r"acer Pendulum-v1: no run logged episode_return"):
    curves = plot.main(plot.Args(paths=(str(runs),), out_dir=str(tmp_path / "p"), reps=50))
  assert [c.group.algorithm for c in curves] == ["impala"]
  assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["CartPole-v1.png"]
  with pytest.raises(S.NothingLogged):
    plot.main(plot.Args(paths=(str(started),), out_dir=str(tmp_path / "p"), reps=50))


def test_plot_script_leaves_out_a_run_whose_config_is_damaged(tmp_path, capsys):
  """One run's truncated config.json stopped the whole figure."""
  runs = tmp_path / "runs"
  for seed in (0, 1):
    write_run(runs / f"impala{seed}", seed=seed)
  damaged = write_run(runs / "damaged", seed=2)
  (damaged / "config.json").write_text('{"config": {\n')
  plot = load_script("plot")
  with pytest.warns(RuntimeWarning, match=r"damaged/config.json is damaged .*: left out"):
    curves = plot.main(plot.Args(paths=(str(runs),), out_dir=str(tmp_path / "p"), reps=50))
  assert [len(c.group.runs) for c in curves] == [2]
  with pytest.raises(ValueError, match="config.json is damaged"):  # the one run given
    plot.main(plot.Args(paths=(str(damaged),), out_dir=str(tmp_path / "p"), reps=50))


def test_plot_script_names_a_metric_no_run_logs_and_needs_a_path(tmp_path):
  runs = tmp_path / "runs"
  write_run(runs / "impala", seed=0)
  write_run(runs / "acer", algorithm="acer", env_id="Pendulum-v1")
  plot = load_script("plot")
  args = lambda **kw: plot.Args(**{"out_dir": str(tmp_path / "p"), "reps": 50, **kw})
  with pytest.raises(ValueError, match=r"--metric nosuch: no run has logged it \(yet\); they log "
                                       r"env_steps, episode_return, wall_time_s"):  # fmt: skip
    plot.main(args(paths=(str(runs),), metric="nosuch"))
  with pytest.raises(ValueError, match="give the run directories"):
    plot.main(args(paths=()))


def test_the_table_shows_small_values_with_their_digits():
  values = (285.8, 21.0, 0.99991, 1.0003, -0.00123, 2.5e-5, 0.0)
  assert [S._number(v) for v in values] == [
      "285.80", "21.00", "0.9999", "1.0003", "-0.0012", "2.5e-05", "0.0000"]  # fmt: skip


def test_the_table_names_what_it_takes_when_given_something_else(tmp_path):
  groups = _groups(write_run(tmp_path / "a"))
  with pytest.raises(TypeError, match=r"summary_table takes GroupCurves \(group_curves' results\)"):
    S.summary_table(groups, ["a"])


def test_jsonable_writes_numpy_and_jax_scalars_as_numbers():
  """A config setting given as a 0-d JAX or NumPy array (`jnp.float32(1e-3)`) is written as
  the number, which config.json reads back (its `str` could not be: load_run refused it)."""
  import jax.numpy as jnp

  values = [jnp.float32(0.5), np.asarray(2), np.float32(0.25), np.bool_(True), np.float32("nan")]
  assert jsonable(values) == [0.5, 2, 0.25, True, None]
  assert jsonable(jnp.zeros(2)) == str(jnp.zeros(2))  # not a scalar: as before


def test_a_config_json_of_str_scalars_before_they_were_numbers_resumes():
  """config.json written before jsonable turned 0-d JAX arrays and NumPy bools into numbers
  held their str: the same setting as the number now, another number still differs."""
  import jax.numpy as jnp
  import numpy as np

  from offpolicy_ac.analysis.metrics_file import jsonable
  from offpolicy_ac.training.rundir import config_differences

  old = {"agent": {"learning_rate": str(jnp.float32(1e-3)), "flag": str(np.bool_(True)),
                   "name": "adam"}}  # fmt: skip
  new = jsonable({"agent": {"learning_rate": jnp.float32(1e-3), "flag": np.bool_(True),
                            "name": "adam"}})  # fmt: skip
  assert new["agent"]["learning_rate"] != old["agent"]["learning_rate"]
  assert config_differences(old, new) == []
  changed = jsonable({"agent": {"learning_rate": jnp.float32(3e-3), "flag": np.bool_(False),
                                "name": "1.0"}})  # fmt: skip
  assert config_differences(old, changed) == ["agent.flag", "agent.learning_rate", "agent.name"]


def test_a_null_and_the_value_it_stands_for_are_the_same_setting_on_resume():
  """`demo_batch_size` null is --mini-batch-size's, `eval_every` null the interval derived
  from the budget: either given explicitly (or dropped again) is no change; another value
  is, and so is a null that stands for another value in its own config."""
  from offpolicy_ac.analysis.metrics_file import config_jsonable
  from offpolicy_ac.training import TrainConfig
  from offpolicy_ac.training.rundir import config_differences

  def config(demo_batch_size, **train):
    train = TrainConfig.of(**{"mini_batch_size": 32, "total_env_steps": 100_000,
                              "log_every": 1_000, **train})  # fmt: skip
    return config_jsonable({"demo_batch_size": demo_batch_size, "train": train})

  run = config(None)
  assert config_differences(run, config(32, eval_every=5_000)) == []
  assert config_differences(config(32, eval_every=5_000), run) == []
  assert config_differences(run, config(16, eval_every=4_000)) == [
      "demo_batch_size", "train.eval.eval_every"
  ]  # fmt: skip
  assert config_differences(config(32), config(None, mini_batch_size=16)) == [
      "demo_batch_size", "train.replay.mini_batch_size"
  ]  # fmt: skip
  # Both null: the same setting, though a larger budget derives another interval.
  assert config_differences(run, config(None, total_env_steps=200_000)) == []


def test_a_setting_without_effect_in_either_run_is_no_difference_on_resume():
  """Seeds with actor threads run one after the other whatever vmap_seeds says, and the
  scripts refuse the flag there: a run recorded with vmap_seeds false (before that, or
  from Python) resumes with the default. Where the seeds can share a vmapped learner, it
  is a difference."""
  from offpolicy_ac.analysis.metrics_file import config_jsonable
  from offpolicy_ac.training import TrainConfig
  from offpolicy_ac.training.rundir import config_differences

  def config(**train):
    return config_jsonable({"train": TrainConfig.of(num_seeds=2, **train)})

  threads = dict(actors="async", num_actors=2)
  assert config_differences(config(vmap_seeds=False, **threads), config(**threads)) == []
  assert config_differences(config(vmap_seeds=False, learner_devices=2),
                            config(learner_devices=2)) == []  # fmt: skip
  assert config_differences(config(vmap_seeds=False), config()) == ["train.budget.vmap_seeds"]
  # Without effect in one run only: still a difference (the other field says so too).
  assert config_differences(config(vmap_seeds=False, **threads), config()) == [
      "train.acting.actors", "train.acting.num_actors", "train.budget.vmap_seeds"
  ]  # fmt: skip


def test_a_groups_interval_does_not_depend_on_its_directories_names(tmp_path):
  """The bootstrap resamples runs by position: runs are ordered by seed, so the same runs
  named otherwise (seed 10 listed before seed 2, or the names shuffled) give the same
  interval, and a group made by hand in another order gives it too."""
  seeds = [0, 1, 2, 3, 5, 8, 10, 11]
  values = np.random.default_rng(0).normal(size=(len(seeds), 3))
  names = [[f"seed{s}" for s in seeds], ["h", "b", "f", "a", "g", "c", "e", "d"]]
  intervals = []
  for layout, layout_names in enumerate(names):
    for seed, name, returns in zip(seeds, layout_names, values):
      write_run(tmp_path / str(layout) / name, seed=seed, returns=returns)
    (group,) = _groups([tmp_path / str(layout)])
    assert [r.seed for r in group.runs] == seeds
    for runs in (group.runs, group.runs[::-1]):
      curve = S.group_curve(group._replace(runs=runs), reps=200)
      intervals.append(np.stack([curve.iqm, curve.lower, curve.upper]))
  for other in intervals[1:]:
    np.testing.assert_array_equal(other, intervals[0])
