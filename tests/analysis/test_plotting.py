"""Learning-curve PNGs: one run, seeds grouped, and no change to the process's matplotlib."""

import matplotlib
import pytest

from offpolicy_ac.analysis import plot_runs
from offpolicy_ac.analysis.metrics_file import encode_line


def _write_run(run_dir, returns):
  run_dir.mkdir(parents=True)
  lines = [
      encode_line({"env_steps": 1000 * (k + 1), "wall_time_s": float(k), "episode_return": r})
      for k, r in enumerate(returns)
  ]
  lines.append(encode_line({"env_steps": 9000, "wall_time_s": 9.0, "episode_return": None,
                            "eval_return": 50.0}))  # fmt: skip
  (run_dir / "metrics.jsonl").write_text("".join(lines))
  return run_dir


def test_plot_runs_writes_pngs_and_keeps_the_matplotlib_backend(tmp_path):
  before = matplotlib.get_backend()
  matplotlib.use("svg")  # stands for a notebook's inline backend: plotting must not switch it
  try:
    runs = [_write_run(tmp_path / f"seed{s}", [10.0 * s, 20.0, 30.0 + s]) for s in range(2)]
    one = plot_runs(runs[:1], tmp_path / "one.png", title="one run")
    grouped = plot_runs(runs, tmp_path / "seeds.png", group=True)
    for png in (one, grouped):
      assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 1000
    assert matplotlib.get_backend() == "svg"
    assert not list(tmp_path.glob("*.tmp.png"))
  finally:
    matplotlib.use(before)


def test_plot_runs_refuses_what_it_cannot_draw(tmp_path):
  run = _write_run(tmp_path / "run", [1.0, 2.0])
  with pytest.raises(ValueError, match="does not end in .png"):
    plot_runs([run], tmp_path / "curve.jpg")
  with pytest.raises(ValueError, match="one label per run: 1 labels, 2 runs"):
    plot_runs([run, run], tmp_path / "curve.png", labels=["a"])
  with pytest.raises(ValueError, match="no such run directory"):
    plot_runs([tmp_path / "missing"], tmp_path / "curve.png")
  with pytest.raises(ValueError, match=r"is not a run directory .*: the runs below it are .*run"):
    plot_runs([tmp_path], tmp_path / "curve.png")  # a folder of runs: not an empty plot
  for nothing in ([], str(run)):  # an empty plot; a str read as one directory per character
    with pytest.raises(ValueError, match="needs a sequence of run directories"):
      plot_runs(nothing, tmp_path / "curve.png")
  assert not list(tmp_path.glob("*.png"))


def test_plot_runs_makes_its_folder_and_draws_runs_that_share_no_step(tmp_path, monkeypatch):
  """Runs that share no step were drawn as a mean with a band over steps neither covers."""
  from matplotlib.axes import Axes

  drawn, plot = [], Axes.plot
  monkeypatch.setattr(Axes, "plot", lambda ax, *a, **kw: drawn.append(kw["label"]) or plot(
      ax, *a, **kw))  # fmt: skip
  early = _write_run(tmp_path / "early", [1.0, 2.0])  # env steps 1000 to 9000
  late = tmp_path / "late"
  late.mkdir()
  (late / "metrics.jsonl").write_text(encode_line({"env_steps": 20000, "wall_time_s": 1.0,
                                                   "episode_return": 5.0}))  # fmt: skip
  png = plot_runs([early, late], tmp_path / "new" / "folder" / "seeds.png", group=True)
  assert png.read_bytes().startswith(b"\x89PNG")
  assert drawn == ["early: episode_return", "late: episode_return", "eval_return (mean of 1)"]


def test_training_still_exports_plot_runs():
  from offpolicy_ac import training

  assert training.plot_runs is plot_runs


def test_plot_runs_expands_the_home_directory(tmp_path, monkeypatch):
  """As read_metrics, find_runs and plot_group_curves do: "~/run" is a run, not missing."""
  monkeypatch.setenv("HOME", str(tmp_path))
  _write_run(tmp_path / "run", [1.0, 2.0])
  png = plot_runs(["~/run"], "~/curve.png")
  assert png == tmp_path / "curve.png" and png.read_bytes().startswith(b"\x89PNG")
