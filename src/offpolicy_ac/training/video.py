"""MP4 videos of rendered frames (imageio with imageio-ffmpeg's own ffmpeg binary).

episode = RenderedEpisode(env, greedy, acting)   # training.evaluation
write_video("greedy.mp4", episode, fps=30)      # frames encoded as they are rendered
"""

from __future__ import annotations

import contextlib
import numbers
import os
import pathlib
import shutil
import types
from typing import Iterable
from typing import Iterator
import warnings

import numpy as np


def check_video_path(path: str | os.PathLike) -> None:
  """Refuses a video path `write_video` does not write (it writes .mp4 files)."""
  if pathlib.Path(path).suffix.lower() != ".mp4":
    raise ValueError(f"videos are written as H.264 MP4: give a path ending in .mp4, got {path}")


def video_writer() -> types.ModuleType:
  """imageio.v2, once imageio-ffmpeg's ffmpeg binary is found (both are dependencies of the
  package); an ImportError that names what is missing otherwise (an install broken since).
  Slow to import: `write_video` calls it, and a script checks with it before long work."""
  fix = "pip install 'imageio>=2.34,<3' 'imageio-ffmpeg>=0.5,<1'"
  try:
    import imageio.v2 as imageio
    import imageio_ffmpeg

    exe = imageio_ffmpeg.get_ffmpeg_exe()  # IMAGEIO_FFMPEG_EXE, its own binary, the system's
  except (ImportError, RuntimeError) as e:
    raise ImportError(f"writing a video needs imageio and imageio-ffmpeg with its ffmpeg "
                      f"binary ({type(e).__name__}: {e}): {fix}") from e  # fmt: skip
  if os.environ.get("IMAGEIO_FFMPEG_EXE") and shutil.which(exe) is None:  # taken untested
    raise ImportError(f"writing a video needs ffmpeg, and IMAGEIO_FFMPEG_EXE is {exe}, which is "
                      "not an executable file: point it at ffmpeg, or unset it (imageio-ffmpeg "
                      "then uses its own)")  # fmt: skip
  return imageio


MIN_FPS, MAX_FPS = 1e-3, 1e6
"""The frame rates `write_video` takes: ffmpeg wrote no file at 1e-9 or 3e9 frames/s, and an
empty video at 1e-6."""


def check_fps(fps: float, name: str = "fps") -> None:
  """Refuses a frame rate outside [MIN_FPS, MAX_FPS] (and NaN), naming it `name`."""
  if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not MIN_FPS <= fps <= MAX_FPS:
    raise ValueError(f"{name} must be a number from {MIN_FPS:g} to {MAX_FPS:,.0f}, got {fps!r}")


def write_video(path: str | os.PathLike, frames: Iterable[np.ndarray],
                fps: float = 30.0) -> pathlib.Path:  # fmt: skip
  """Writes frames as an H.264 MP4, one video frame per frame: an array [N, H, W, 3] uint8,
  or any iterable of [H, W, 3] uint8 frames (`training.RenderedEpisode`), encoded as they
  come, so that only one frame is held at a time.

  Odd heights and widths are padded by one black row / column (the yuv420p pixel
  format needs even sizes). The file is written next to `path`, read back by ffmpeg (its
  frames counted: ffmpeg that could not finish the file, on a full disk say, still exits
  quietly), then renamed onto it; a failure (a bad frame, one the iterable raises, or
  ffmpeg's: an OSError naming `path`) leaves no file.
  """
  check_fps(fps)
  check_video_path(path)
  imageio = video_writer()

  path = pathlib.Path(path).expanduser()
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
  shape = writer = None
  try:
    with warnings.catch_warnings():
      # ffmpeg runs in a subprocess, which it execs at once: JAX's warning about
      # os.fork() in a multithreaded process does not apply.
      warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
      writer = imageio.get_writer(tmp, fps=fps, codec="libx264", macro_block_size=2,
                                  ffmpeg_log_level="error")  # fmt: skip
      for k, frame in enumerate(frames):
        frame = np.asarray(frame)
        shape = frame.shape if shape is None else shape
        if frame.shape != shape or len(shape) != 3 or shape[-1] != 3 or frame.dtype != np.uint8:
          first = f", frame 0 {shape}" if k else ""
          raise ValueError(f"frames must be [H, W, 3] uint8, all of one size: frame {k} is "
                           f"{frame.shape} {frame.dtype}{first}")  # fmt: skip
        height, width, _ = shape
        with _ffmpeg_errors(path):
          writer.append_data(np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0))))
      if shape is None:
        raise ValueError("frames must be [N >= 1, H, W, 3] uint8, got no frame")
      with _ffmpeg_errors(path):
        writer.close()
      _check_read_back(tmp, path, num_frames=k + 1)
  except BaseException:
    # Closed first: ffmpeg still running would write the file again once it is removed.
    if writer is not None:
      try:
        writer.close()
      except Exception:  # pylint: disable=broad-except  (the first error is the one to raise)
        pass
    tmp.unlink(missing_ok=True)
    raise
  os.replace(tmp, path)
  return path


@contextlib.contextmanager
def _ffmpeg_errors(path: pathlib.Path) -> Iterator[None]:
  """An OSError of imageio's ffmpeg pipe (ffmpeg stopped: a path it could not open, a full
  disk), raised again as one line naming the video; ffmpeg printed its reason above (unless
  it could not start: FileNotFoundError)."""
  try:
    yield
  except OSError as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    said = "" if isinstance(e, FileNotFoundError) else "; its own message is printed above"
    raise OSError(f"writing the video {path} failed: ffmpeg stopped ({first}){said}") from e


def _check_read_back(tmp: pathlib.Path, path: pathlib.Path, num_frames: int) -> None:
  """Refuses (OSError naming `path`) a video file ffmpeg did not finish: one it cannot read
  back, or that holds other than the `num_frames` frames written."""
  import imageio_ffmpeg

  try:
    frames_read, _ = imageio_ffmpeg.count_frames_and_secs(str(tmp))
  except (RuntimeError, OSError) as e:
    reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    raise OSError(f"writing the video {path} failed: ffmpeg did not finish the file, which "
                  f"does not read back ({reason}); a full disk?") from e  # fmt: skip
  if frames_read != num_frames:
    raise OSError(f"writing the video {path} failed: it holds {frames_read} frames of the "
                  f"{num_frames} written; a full disk?")  # fmt: skip
