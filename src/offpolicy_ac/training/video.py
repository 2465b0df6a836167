"""MP4 videos of rendered frames (imageio with imageio-ffmpeg's own ffmpeg binary).

frames, episode_return = render_episode(env, greedy, acting)   # training.evaluation
write_video("greedy.mp4", frames, fps=30)
"""

from __future__ import annotations

import os
import pathlib
import warnings

import numpy as np


def check_video_path(path: str | os.PathLike) -> None:
  """Refuses a video path `write_video` does not write (it writes .mp4 files)."""
  if pathlib.Path(path).suffix.lower() != ".mp4":
    raise ValueError(f"videos are written as H.264 MP4: give a path ending in .mp4, got {path}")


def write_video(path: str | os.PathLike, frames: np.ndarray, fps: float = 30.0) -> pathlib.Path:
  """Writes frames [N, H, W, 3] uint8 as an H.264 MP4, one video frame per frame.

  Odd heights and widths are padded by one black row / column (the yuv420p pixel
  format needs even sizes). The file is written next to `path`, then renamed onto it.
  """
  frames = np.asarray(frames)
  if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
    raise ValueError(f"frames must be [N >= 1, H, W, 3] uint8, got {frames.shape} {frames.dtype}")
  if not fps > 0:
    raise ValueError(f"fps must be > 0, got {fps}")
  check_video_path(path)
  import imageio.v2 as imageio  # slow to import: only when writing a video

  _, height, width, _ = frames.shape
  frames = np.pad(frames, ((0, 0), (0, height % 2), (0, width % 2), (0, 0)))
  path = pathlib.Path(path).expanduser()
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
  with warnings.catch_warnings():
    # ffmpeg runs in a subprocess, which it execs at once: JAX's warning about
    # os.fork() in a multithreaded process does not apply.
    warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
    with imageio.get_writer(tmp, fps=fps, codec="libx264", macro_block_size=2,
                            ffmpeg_log_level="error") as writer:  # fmt: skip
      for frame in frames:
        writer.append_data(frame)
  os.replace(tmp, path)
  return path
