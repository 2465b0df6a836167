"""experiments/evaluate.py: greedy returns, their JSON file and an MP4 of episode 0."""

import dataclasses
import gc
import json
import re
import resource
import subprocess
import sys

import imageio.v2 as imageio
import imageio.v3 as iio
import numpy as np
import pytest
from script_server import run_script
from scripts import EXPERIMENTS
from scripts import cpu_process_env
from scripts import load_script

from offpolicy_ac import presets
from offpolicy_ac.cli import import_modules
from offpolicy_ac.demos import load_demos
from offpolicy_ac.demos import record_episodes
from offpolicy_ac.networks import torsos
from offpolicy_ac.training import describe_protocol
from offpolicy_ac.training import evaluate
from offpolicy_ac.training import evaluation
from offpolicy_ac.training import load_run
from offpolicy_ac.training import pool_seed
from offpolicy_ac.training import video as video_lib
from offpolicy_ac.training import write_video


def _train(run_dir, preset, steps):
  module = presets.impala
  args = module.PRESETS[preset]
  args = dataclasses.replace(
      args,
      run_dir=str(run_dir),
      train=args.train.replace(total_env_steps=steps, log_every=steps, checkpoint_every=0),
  )
  module.run(args, progress=False)
  return run_dir


@pytest.mark.parametrize(
    "preset, frame_shape", [("cartpole", (400, 600, 3)), ("pendulum", (500, 500, 3))]
)
def test_evaluate_prints_and_writes_the_returns_and_a_video(tmp_path, capsys, preset, frame_shape):
  run_dir = _train(tmp_path / "run", preset, 512)
  module = load_script("evaluate")
  video = tmp_path / "greedy.mp4"
  result = module.main(module.Args(run_dir=str(run_dir), episodes=3, seed=4, video=str(video)))
  printed = capsys.readouterr().out
  for k in range(3):
    assert f"episode {k}: return {result['returns'][k]:.2f}" in printed
  assert f"mean {result['mean']:.2f}" in printed
  assert json.loads((run_dir / "evaluation.json").read_text()) == result
  # The protocol is printed and stored beside the scores.
  assert result["protocol"] == describe_protocol(load_run(run_dir).config, 3)
  assert f"protocol: {result['protocol']}" in printed
  # The same protocol as the in-training evaluation, from the loaded run.
  run = load_run(run_dir)
  with run.make_env(3, pool_seed(4, "evaluate")) as env:
    returns = evaluate(env, run.greedy, run.acting, 3)
  np.testing.assert_allclose(result["returns"], returns, rtol=1e-6)
  assert result["mean"] == pytest.approx(np.mean(returns))
  assert result["min"] == min(result["returns"]) and result["max"] == max(result["returns"])
  # The video is episode 0 (same seed), one frame per step plus the reset.
  frames = iio.imread(video)
  assert frames.shape == (result["video"]["frames"],) + frame_shape
  assert result["video"]["return"] == pytest.approx(result["returns"][0], rel=1e-5)
  if preset == "cartpole":  # reward 1 per step
    assert len(frames) == result["returns"][0] + 1
  else:  # Pendulum: always truncated at 200 steps
    assert len(frames) == 201
  assert np.abs(frames[0].astype(int) - frames[-1].astype(int)).max() > 100  # it moved


@pytest.mark.parametrize("script", ["evaluate", "record_demos"])
def test_many_episodes_are_played_in_bounded_pools_as_one_pool_would(tmp_path, monkeypatch, script):
  run_dir = _train(tmp_path / "run", "cartpole", 512)
  module = load_script(script)
  monkeypatch.setattr(evaluation, "POOL_SIZE", 4)
  run, pools = load_run(run_dir), []
  make_env = type(run).make_env

  def recording(self, num_envs, seed, **kwargs):
    pools.append((num_envs, seed))
    return make_env(self, num_envs, seed, **kwargs)

  monkeypatch.setattr(type(run), "make_env", recording)
  out = tmp_path / "demos.npz"
  extra = {"out": str(out)} if script == "record_demos" else {}
  result = module.main(module.Args(run_dir=str(run_dir), episodes=10, seed=2, **extra))
  first = pool_seed(2, "evaluate")
  assert pools == [(4, first), (4, first + 4), (2, first + 8)]
  monkeypatch.undo()
  with run.make_env(10, pool_seed(2, "evaluate")) as env:  # envpool seeds env i seed + i
    if script == "evaluate":
      returns = evaluate(env, run.greedy, run.acting, 10)
      np.testing.assert_allclose(result["returns"], returns, rtol=1e-6)
      assert len(set(result["returns"])) > 1  # different episodes
    else:
      one_pool = record_episodes(env, run.greedy_policy(), 10)
      saved = load_demos(out)
      for name, field in one_pool.items():
        np.testing.assert_array_equal(result[name], field, err_msg=name)
        np.testing.assert_array_equal(saved[name], field, err_msg=name)
      assert len(set(one_pool["episode_lengths"])) > 1  # different episodes


def test_evaluations_of_other_parameters_go_to_their_own_files(tmp_path):
  args = presets.impala.PRESETS["cartpole"]
  train = args.train.replace(total_env_steps=1024, log_every=512, checkpoint_every=512)
  run_dir = tmp_path / "run"
  presets.impala.run(dataclasses.replace(args, run_dir=str(run_dir), train=train), progress=False)
  module = load_script("evaluate")
  final = module.main(module.Args(run_dir=str(run_dir), episodes=2))
  best = module.main(module.Args(run_dir=str(run_dir), episodes=2, best=True))
  checkpoint = load_run(run_dir).checkpoints[-1]
  kept = module.main(module.Args(run_dir=str(run_dir), episodes=2, checkpoint=checkpoint))
  for name, result in [("evaluation", final), ("evaluation_best", best),
                       (f"evaluation_checkpoint{checkpoint}", kept)]:  # fmt: skip
    assert json.loads((run_dir / f"{name}.json").read_text()) == result
  assert (final["parameters"], best["parameters"], kept["parameters"]) == (
      "final", "best", "checkpoint")  # fmt: skip
  # Without final parameters (a run killed), the newest checkpoint's are evaluated: into
  # its own file, not evaluation.json (a later evaluation of the final ones replaced it).
  (run_dir / "evaluation.json").unlink()
  (run_dir / f"evaluation_checkpoint{checkpoint}.json").unlink()
  (run_dir / "final_params.msgpack").unlink()
  newest = module.main(module.Args(run_dir=str(run_dir), episodes=2))
  assert newest["parameters"] == "checkpoint" and newest["env_steps"] == checkpoint
  assert json.loads((run_dir / f"evaluation_checkpoint{checkpoint}.json").read_text()) == newest
  assert not (run_dir / "evaluation.json").exists()


def test_evaluate_refuses_bad_arguments(tmp_path):
  module = load_script("evaluate")
  with pytest.raises(ValueError, match="--episodes"):
    module.main(module.Args(run_dir=str(tmp_path), episodes=0))
  with pytest.raises(ValueError, match=r"--episodes must be in \[1, 1,048,576\]"):
    module.main(module.Args(run_dir=str(tmp_path), episodes=2**20 + 1))
  with pytest.raises(FileNotFoundError, match="no config.json"):
    module.main(module.Args(run_dir=str(tmp_path)))
  # An empty path is not the working directory (--run-dir), nor the default (--out, --video).
  for flag, fields in (("run-dir", dict(run_dir=" ")), ("out", dict(out="")),
                       ("video", dict(video="")),):  # fmt: skip
    with pytest.raises(ValueError, match=f"^--{flag} is empty: give a path$"):
      module.main(module.Args(**{"run_dir": str(tmp_path), **fields}))


def test_evaluate_refuses_outputs_that_would_overwrite_the_run(tmp_path):
  """--out and --video may not name a file of the run, a path in one of its folders, or
  each other: refused before anything is evaluated; evaluate.py's own files may be
  written again."""
  run_dir = _train(tmp_path / "run", "cartpole", 512)
  (run_dir / "checkpoints").mkdir(exist_ok=True)  # the run's folders, with or without files
  written = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
  module = load_script("evaluate")
  main = lambda **kw: module.main(module.Args(run_dir=str(run_dir), episodes=1, **kw))  # noqa: E731
  for entry in sorted(run_dir.iterdir()):
    if entry.is_dir():
      message = f"is in {entry}, a folder of the run"
      refused = {"out": [entry / "x.json", entry / "new" / "x.json"], "video": [entry / "v.mp4"]}
    else:  # config.json, metrics.jsonl, summary.json, *.msgpack(.crc32), .lock, ...
      message = f"is the file {entry.name} of the run in {run_dir}"
      refused = {"out": [entry, tmp_path / "elsewhere" / ".." / "run" / entry.name]}
    for flag, paths in refused.items():
      for path in paths:
        with pytest.raises(ValueError, match=re.escape(f"--{flag} {path} {message}")):
          main(**{flag: str(path)})
  same = tmp_path / "same.mp4"
  with pytest.raises(ValueError, match="^--out .* and --video .* are the same file"):
    main(out=str(tmp_path / "x" / ".." / "same.mp4"), video=str(same))
  assert not same.exists() and not (run_dir / "evaluation.json").exists()
  assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == written
  load_run(run_dir)
  # evaluate.py's own files in the run directory are written again.
  for _ in range(2):
    main()
    main(out=str(run_dir / "mine.json"), video=str(run_dir / "greedy.mp4"))
  assert json.loads((run_dir / "mine.json").read_text())["video"]["frames"] > 0
  # The command line: one line, exit code 2, the run intact.
  config = run_dir / "config.json"
  proc = run_script(EXPERIMENTS / "evaluate.py",
                    ["--run-dir", run_dir, "--episodes", "2", "--out", config])  # fmt: skip
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert proc.stderr.strip() == (
      f"[evaluate] error: --out {config} is the file config.json of the run in {run_dir}: "
      "overwriting it would damage the run; give another path"
  )
  assert config.read_bytes() == written[config]


@pytest.mark.parametrize("script", ["evaluate", "record_demos"])
def test_a_full_disk_ends_evaluate_and_record_demos_in_one_line_leaving_no_file(tmp_path, script):
  """A write refused for full storage (a file-size limit, EFBIG, as a full disk's ENOSPC)
  ends the script with exit code 1 and one line that says to run it again (not to
  `--resume`, a training run's flag), and leaves no partial output file."""
  run_dir = _train(tmp_path / "run", "cartpole", 512)
  out = tmp_path / "out" / ("results.json" if script == "evaluate" else "demos.npz")
  limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))  # results: ~600 bytes
  proc = subprocess.run(
      [sys.executable, str(EXPERIMENTS / f"{script}.py"), "--run-dir", str(run_dir),
       "--episodes", "20", "--out", str(out)],
      capture_output=True, text=True, timeout=300, preexec_fn=limit, env=cpu_process_env(),
  )  # fmt: skip
  last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert re.fullmatch(rf"\[{script}\] error: a file would pass the file-size limit \(ulimit -f\)"
                      rf" \({re.escape(str(out))}\); make room, then run it again",
                      last), last  # fmt: skip
  assert not list(out.parent.iterdir())


def test_record_demos_refuses_an_out_that_would_overwrite_the_run(tmp_path):
  """record_demos.py's --out may not name a file of the run or a path in its folders (it
  wrote demonstrations over config.json and final_params.msgpack); demonstrations
  recorded into the run before may be recorded again."""
  run_dir = _train(tmp_path / "run", "cartpole", 512)
  (run_dir / "checkpoints").mkdir(exist_ok=True)
  written = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
  module = load_script("record_demos")
  main = lambda out: module.main(module.Args(run_dir=str(run_dir), out=str(out), episodes=1))  # noqa: E731
  for entry in sorted(run_dir.iterdir()):
    message = (f"is in {entry}, a folder of the run" if entry.is_dir() else
               f"is the file {entry.name} of the run in {run_dir}")  # fmt: skip
    path = entry / "x.npz" if entry.is_dir() else entry
    with pytest.raises(ValueError, match=re.escape(f"--out {path} {message}")):
      main(path)
  assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == written
  for _ in range(2):
    main(run_dir / "demos.npz")
  assert load_demos(run_dir / "demos.npz")["episode_lengths"].shape == (1,)
  load_run(run_dir)


@pytest.mark.parametrize("script", ["evaluate", "record_demos"])
def test_an_out_may_not_overwrite_another_run_either(tmp_path, script):
  """--out into another run than the one evaluated (its config.json, final parameters,
  checkpoints/, a seed's summary.json) left that run unloadable, with exit code 0."""
  run_dir = _train(tmp_path / "run", "cartpole", 512)
  other = _train(tmp_path / "other", "cartpole", 512)
  (other / "checkpoints").mkdir(exist_ok=True)
  written = {p: p.read_bytes() for p in other.rglob("*") if p.is_file()}
  module = load_script(script)
  for path, message in [
      (other / "config.json", f"is the file config.json of the run in {other}"),
      (other / "final_params.msgpack", f"is the file final_params.msgpack of the run in {other}"),
      (other / "checkpoints" / "x.json", f"is in {other / 'checkpoints'}, a folder of the run"),
  ]:
    with pytest.raises(ValueError, match=re.escape(f"--out {path} {message}")):
      module.main(module.Args(run_dir=str(run_dir), out=str(path), episodes=1))
  assert {p: p.read_bytes() for p in other.rglob("*") if p.is_file()} == written
  load_run(other)


def test_write_video_round_trip_pads_odd_sizes(tmp_path):
  rng = np.random.default_rng(0)
  frames = np.zeros((7, 31, 45, 3), np.uint8)
  for k in range(7):  # a bright square moving right on grey
    frames[k] = 60
    frames[k, 10:20, 4 * k : 4 * k + 10] = 230
  frames += rng.integers(0, 3, frames.shape, dtype=np.uint8)
  path = write_video(tmp_path / "sub" / "v.mp4", frames, fps=10)
  back = iio.imread(path)
  assert back.shape == (7, 32, 46, 3)
  assert np.abs(back[:, :31, :45].astype(int) - frames).mean() < 8
  assert not list(path.parent.glob(".*tmp*"))


def test_write_video_encodes_frames_as_an_iterable_yields_them(tmp_path):
  def frames():
    for k in range(5):
      yield np.full((8, 9, 3), 40 * k, np.uint8)

  path = write_video(tmp_path / "v.mp4", frames(), fps=10)
  back = iio.imread(path)
  assert back.shape == (5, 8, 10, 3)
  np.testing.assert_allclose(back[:, :, :9].mean(axis=(1, 2, 3)), 40 * np.arange(5), atol=6)


def test_write_video_leaves_no_file_when_its_frames_fail(tmp_path):
  def frames():
    yield np.zeros((8, 8, 3), np.uint8)
    raise RuntimeError("the episode did not finish")

  with pytest.raises(RuntimeError, match="did not finish"):
    write_video(tmp_path / "v.mp4", frames())
  with pytest.raises(ValueError, match=r"frame 1 is \(8, 6, 3\) uint8, frame 0 \(8, 8, 3\)"):
    write_video(
        tmp_path / "v.mp4", iter([np.zeros((8, 8, 3), np.uint8)] + [np.zeros((8, 6, 3), np.uint8)])
    )
  with pytest.raises(ValueError, match="got no frame"):
    write_video(tmp_path / "v.mp4", iter([]))
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("fail_at", ["frame", "iterable"])
def test_write_video_leaves_no_file_once_its_failure_is_handled(tmp_path, fail_at):
  # The writer still open when the failure's traceback goes would write the file again.
  def frames():
    yield np.zeros((4, 4, 3), np.uint8)
    if fail_at == "iterable":
      raise RuntimeError("the episode did not finish")
    yield np.zeros((6, 4, 3), np.uint8)

  try:
    write_video(tmp_path / "v.mp4", frames())
  except (RuntimeError, ValueError):
    pass
  else:
    pytest.fail("write_video took a failing episode")
  gc.collect()
  assert not list(tmp_path.iterdir())


def test_evaluate_refuses_a_video_it_cannot_write_before_playing_episodes(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # an install broken since
  module = load_script("evaluate")
  with pytest.raises(ValueError, match=r"--video: writing a video needs imageio and "
                     r"imageio-ffmpeg .*: pip install 'imageio>=2.34,<3'"):  # fmt: skip
    module.main(module.Args(run_dir=str(tmp_path / "no-run"), video=str(tmp_path / "v.mp4")))
  assert not list(tmp_path.iterdir())


def test_an_ffmpeg_named_by_imageio_ffmpeg_exe_that_does_not_exist_is_refused_first(tmp_path,
                                                                                   monkeypatch):  # fmt: skip
  """imageio-ffmpeg takes IMAGEIO_FFMPEG_EXE untested: the episodes were played, then the
  video failed, pointing to an ffmpeg message never printed (ffmpeg never started)."""
  missing = str(tmp_path / "bin" / "ffmpeg")
  monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", missing)
  module = load_script("evaluate")
  with pytest.raises(ValueError) as e:
    module.main(module.Args(run_dir=str(tmp_path / "no-run"), video=str(tmp_path / "v.mp4")))
  assert str(e.value) == (
      f"--video: writing a video needs ffmpeg, and IMAGEIO_FFMPEG_EXE is {missing}, which is "
      "not an executable file: point it at ffmpeg, or unset it (imageio-ffmpeg then uses its "
      "own)"
  )
  # Past the check (write_video's own is the same): ffmpeg that cannot start printed nothing.
  monkeypatch.setattr(video_lib, "video_writer", lambda: imageio)
  with pytest.raises(OSError) as e:
    write_video(tmp_path / "v.mp4", np.zeros((2, 4, 4, 3), np.uint8))
  assert str(e.value) == (f"writing the video {tmp_path / 'v.mp4'} failed: ffmpeg stopped "
                          f"([Errno 2] No such file or directory: '{missing}')")  # fmt: skip
  assert not list(tmp_path.iterdir())


_WRITE_UNDER_A_SIZE_LIMIT = """
import resource, sys
import numpy as np
from offpolicy_ac.training import write_video
path, limit = sys.argv[1], int(sys.argv[2])
if limit:  # what ffmpeg, a child, may write: it stops at the limit, as on a full disk
  resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
frames = np.random.default_rng(0).integers(0, 256, (20, 32, 32, 3), dtype=np.uint8)
try:
  print(write_video(path, frames, fps=10).stat().st_size)
except OSError as e:
  print(e)
  sys.exit(3)
"""


def test_write_video_refuses_a_file_ffmpeg_could_not_finish(tmp_path):
  """ffmpeg that cannot write the rest of the file (a full disk) exits quietly: the video
  is read back, and a file that does not read back is an error that leaves no file."""

  def write(name: str, limit: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _WRITE_UNDER_A_SIZE_LIMIT, name, str(limit)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip

  whole = write("whole.mp4", 0)
  assert whole.returncode == 0, whole.stderr[-2000:]
  size = int(whole.stdout)
  cut = write("cut.mp4", size // 2)
  assert cut.returncode == 3, (cut.stdout, cut.stderr[-2000:])
  assert re.fullmatch(r"writing the video cut\.mp4 failed: ffmpeg did not finish the file, "
                      r"which does not read back \(.+\); a full disk\?\n", cut.stdout)  # fmt: skip
  assert sorted(path.name for path in tmp_path.iterdir()) == ["whole.mp4"]


@pytest.mark.parametrize("fps", [float("inf"), float("nan"), 0, 1e-9, 3e9, "30", True])
def test_write_video_refuses_a_frame_rate_ffmpeg_cannot_write(tmp_path, fps):
  """ffmpeg wrote no file at 1e-9 or 3e9 frames/s (after the evaluation had run)."""
  with pytest.raises(ValueError, match="fps must be a number from 0.001 to 1,000,000, got"):
    write_video(tmp_path / "v.mp4", np.zeros((2, 8, 8, 3), np.uint8), fps=fps)
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("fps", [1e-3, 1e6])
def test_write_video_takes_the_frame_rates_at_its_bounds(tmp_path, fps):
  path = write_video(tmp_path / "v.mp4", np.zeros((3, 8, 8, 3), np.uint8), fps=fps)
  assert path.stat().st_size > 1000  # three frames, not the empty file of 1e-6


def test_write_video_expands_the_home_directory(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.chdir(tmp_path)
  path = write_video("~/v.mp4", np.zeros((2, 8, 8, 3), np.uint8), fps=10)
  assert path == tmp_path / "home" / "v.mp4" and path.exists()
  assert not (tmp_path / "~").exists()


@pytest.mark.parametrize(
    "frames, message",
    [
        (np.zeros((0, 8, 8, 3), np.uint8), "N >= 1"),
        (np.zeros((2, 8, 8), np.uint8), "uint8"),
        (np.zeros((2, 8, 8, 3), np.float32), "uint8"),
    ],
)
def test_write_video_refuses_bad_frames(tmp_path, frames, message):
  with pytest.raises(ValueError, match=message):
    write_video(tmp_path / "v.mp4", frames)


def test_evaluate_says_to_raise_max_steps_when_the_episodes_outlast_it(tmp_path):
  run_dir = _train(tmp_path / "run", "cartpole", 512)
  module = load_script("evaluate")
  with pytest.raises(ValueError, match=r"did not finish 2 episodes in 3 steps: raise --max-steps"):
    module.main(module.Args(run_dir=str(run_dir), episodes=2, max_steps=3))


_TORSO_MODULE = """
import flax.linen as nn

from offpolicy_ac import networks


class Plugin(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.tanh(nn.Dense(8)(x.reshape(x.shape[0], -1)))


networks.register_torso("plugin-torso", lambda observation_shape, hidden_sizes: Plugin())
"""


def test_a_run_with_a_torso_of_ones_own_loads_after_import_modules(tmp_path):
  """evaluate.py, record_demos.py and the training scripts import the module that
  registers the run's torso (a dotted name from the current directory, or a .py file);
  without it the refusal names the flag."""
  (tmp_path / "plugin_torso.py").write_text(_TORSO_MODULE)
  import_modules("--import-modules", [str(tmp_path / "plugin_torso.py")])
  try:
    args = presets.impala.PRESETS["cartpole"]
    args = dataclasses.replace(
        args,
        run_dir=str(tmp_path / "run"),
        agent=dataclasses.replace(args.agent, torso="plugin-torso"),
        train=args.train.replace(total_env_steps=512, log_every=512, checkpoint_every=512),
    )
    presets.impala.run(args, progress=False)
  finally:
    torsos._REGISTERED.pop("plugin-torso")  # pylint: disable=protected-access
    sys.modules.pop("plugin_torso")

  def script(name, *flags):
    command = [sys.executable, str(EXPERIMENTS / f"{name}.py"), "--run-dir", "run", *flags]
    return subprocess.run(command, cwd=tmp_path, env=cpu_process_env(), capture_output=True,
                          text=True, check=False)  # fmt: skip

  refused = script("evaluate", "--episodes", "2")
  assert refused.returncode == 2, refused.stderr
  assert "unknown torso 'plugin-torso'" in refused.stderr
  assert "--import-modules MODULE" in refused.stderr and "Traceback" not in refused.stderr
  evaluated = script("evaluate", "--episodes", "2", "--import-modules", "plugin_torso")
  assert evaluated.returncode == 0, evaluated.stderr
  assert json.loads((tmp_path / "run" / "evaluation.json").read_text())["episodes"] == 2
  recorded = script("record_demos", "--out", "demos.npz", "--episodes", "1",
                    "--import-modules", str(tmp_path / "plugin_torso.py"))  # fmt: skip
  assert recorded.returncode == 0, recorded.stderr
  assert (tmp_path / "demos.npz").is_file()
  # The training scripts import it too: the run resumes from the command line.
  flags = ["--preset", "cartpole", "--torso", "plugin-torso", "--total-env-steps", "1024",
           "--log-every", "512", "--checkpoint-every", "512", "--resume"]  # fmt: skip
  refused = script("impala", *flags)
  assert refused.returncode == 2 and "unknown torso 'plugin-torso'" in refused.stderr
  resumed = script("impala", *flags, "--import-modules", "plugin_torso")
  assert resumed.returncode == 0, resumed.stderr
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["env_steps"] == 1024


def test_import_modules_refuses_a_module_it_cannot_find(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", list(sys.path))  # import_modules adds the directory
  with pytest.raises(ValueError, match=r"--import-modules nope_plugin: no module named "
                     r"'nope_plugin' \(on the path or in "):  # fmt: skip
    import_modules("--import-modules", ["nope_plugin"])
  with pytest.raises(ValueError, match=r"--import-modules missing\.py: no such file"):
    import_modules("--import-modules", ["missing.py"])
  (tmp_path / "lib").mkdir()  # a file's own imports are found beside it
  (tmp_path / "lib" / "plugin_helper.py").write_text("VALUE = 3\n")
  (tmp_path / "lib" / "plugin_main.py").write_text("import plugin_helper\n")
  try:
    import_modules("--import-modules", [str(tmp_path / "lib" / "plugin_main.py")])
    assert sys.modules["plugin_main"].plugin_helper.VALUE == 3
  finally:
    sys.modules.pop("plugin_main", None)
    sys.modules.pop("plugin_helper", None)
  (tmp_path / "needs_missing.py").write_text("import nope_dependency\n")
  for given in ("needs_missing", str(tmp_path / "needs_missing.py")):  # named, with its error
    with pytest.raises(ValueError, match=rf"--import-modules {given}: it imports "
                       r"'nope_dependency', which is not installed or not on the path \(No "
                       r"module named 'nope_dependency'\)") as e:  # fmt: skip
      import_modules("--import-modules", [given])
    assert isinstance(e.value.__cause__, ModuleNotFoundError)
    assert "needs_missing" not in sys.modules


def test_import_modules_refuses_a_name_that_another_module_shadows(tmp_path, monkeypatch):
  """`json` or `numpy` in the current directory would not be imported by its dotted name:
  the standard library's or the installed one would, and the run be refused as
  unregistered."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
  (tmp_path / "json.py").write_text("ANSWER = 42\n")
  (tmp_path / "numpy").mkdir()
  for name, local in (("json", "json.py"), ("numpy.linalg", "numpy")):
    # Both are imported already: loading the one here by its path would replace them.
    with pytest.raises(ValueError, match=rf"--import-modules {name}: {local} in the current "
                       r"directory is shadowed by the module .*; rename it$"):  # fmt: skip
      import_modules("--import-modules", [name])
  with pytest.raises(ValueError, match="json.py: a module named 'json' is already imported"):
    import_modules("--import-modules", ["json.py"])  # and the path is refused as such
  (tmp_path / "plugin_local.py").write_text("ANSWER = 42\n")
  try:
    import_modules("--import-modules", ["plugin_local"])  # nothing shadows it
    assert sys.modules["plugin_local"].ANSWER == 42
  finally:
    sys.modules.pop("plugin_local", None)


def test_import_modules_tells_the_module_here_from_one_below_the_current_directory(
    tmp_path, monkeypatch
):
  """A folder without __init__.py here (a namespace package) is the module here, and is
  imported; a module of that name in a folder below the current directory found first (a
  .venv's site-packages) is another one, and is refused."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "site").mkdir()
  monkeypatch.setattr(sys, "path", [str(tmp_path / "site"), *sys.path])
  (tmp_path / "plugin_ns").mkdir()
  (tmp_path / "plugin_ns" / "agent.py").write_text("ANSWER = 42\n")
  (tmp_path / "plugin_twin.py").write_text("ANSWER = 42\n")
  (tmp_path / "site" / "plugin_twin.py").write_text("ANSWER = 0\n")
  try:
    import_modules("--import-modules", ["plugin_ns.agent"])
    assert sys.modules["plugin_ns.agent"].ANSWER == 42
    with pytest.raises(ValueError, match=r"plugin_twin\.py in the current directory is "
                       r"shadowed by the module 'plugin_twin' \(.*site.*give the file's path"):  # fmt: skip
      import_modules("--import-modules", ["plugin_twin"])
    assert "plugin_twin" not in sys.modules
    import_modules("--import-modules", ["plugin_twin.py"])  # as that advice says
    assert sys.modules["plugin_twin"].ANSWER == 42
  finally:
    for name in ("plugin_ns.agent", "plugin_ns", "plugin_twin"):
      sys.modules.pop(name, None)


def test_import_modules_refuses_a_file_named_as_a_module_already_imported(tmp_path):
  """A file is imported under its name: `string.py` would replace the standard library's
  `string` in sys.modules, for every later import of it."""
  import string  # pylint: disable=import-outside-toplevel

  (tmp_path / "string.py").write_text("ANSWER = 42\n")
  with pytest.raises(ValueError, match=r"string\.py: a module named 'string' is already "
                     r"imported .*rename the file"):  # fmt: skip
    import_modules("--import-modules", [str(tmp_path / "string.py")])
  assert sys.modules["string"] is string
  (tmp_path / "plugin_again.py").write_text("ANSWER = 42\n")
  for _ in range(2):  # the same file again is the module it imported
    import_modules("--import-modules", [str(tmp_path / "plugin_again.py")])
  assert sys.modules.pop("plugin_again").ANSWER == 42


def test_an_atari_video_plays_at_real_time_by_default():
  """One video frame per env step: an Atari game at 60 emulator frames a second plays at
  60 / frame skip (15 for the presets' 4; 30, the other tasks' default, was twice real
  time); `--fps` still sets any rate."""
  from offpolicy_ac.training import TrainConfig

  module = load_script("evaluate")
  assert module.video_fps(TrainConfig.of(env_id="Pong-v5", atari=True)) == 15.0
  assert module.video_fps(TrainConfig.of(env_id="CartPole-v1")) == 30.0
  assert module.Args(run_dir="r").fps is None
