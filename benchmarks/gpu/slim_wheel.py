"""Rewrites envpool's and envpool-assets' wheels with only the environment families kept.

    python benchmarks/gpu/slim_wheel.py WHEEL... --out-dir .whl [--keep atari,classic_control]

envpool 1.2.5's wheel is 53 MB and envpool-assets' 62 MB, more than the device machine's
64 MiB working tree holds beside the project; Atari needs about 4 MB of them. For
`envpool-*.whl` this drops the compiled modules and data of every family not in `--keep`
and rewrites `envpool/entry.py` (which imports every family's registration, and so its
compiled module) to import only the kept ones; for `envpool_assets-*.whl` it keeps only the
kept families' asset folders (Atari's ROMs). RECORD lists what is left, with new hashes for
rewritten files. Other wheels are copied unchanged. Same file names, so
`pip install .whl/*.whl` installs them as the originals.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import pathlib
import re
import shutil
import zipfile

_FAMILY = re.compile(r"^envpool/([a-z_0-9]+)/")
_ASSET = re.compile(r"^envpool_assets/([a-z_0-9]+)/")


def _record_line(name: str, data: bytes) -> str:
  digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
  return f"{name},sha256={digest},{len(data)}"


def _families(zin: zipfile.ZipFile) -> set[str]:
  """envpool's environment families: the folders holding a registration.py."""
  found = set()
  for name in zin.namelist():
    m = re.match(r"^envpool/([a-z_0-9]+)/(?:[a-z_0-9]+/)?registration\.py$", name)
    if m and m.group(1) != "python":
      found.add(m.group(1))
  return found


def _entry(keep: set[str], original: str) -> str:
  """envpool/entry.py importing only the registrations of the kept families."""
  lines = []
  for line in original.splitlines():
    m = re.match(r"^import envpool\.([a-z_0-9]+)\.", line)
    if m and m.group(1) not in keep:
      continue
    lines.append(line)
  return "\n".join(lines) + "\n"


def slim(wheel: pathlib.Path, out_dir: pathlib.Path, keep: set[str]) -> pathlib.Path:
  """Writes the slimmed (or copied) wheel into `out_dir`; returns its path."""
  out = out_dir / wheel.name
  if wheel.name.startswith("envpool-"):
    pattern = _FAMILY
  elif wheel.name.startswith("envpool_assets-"):
    pattern = _ASSET
  else:
    if wheel.resolve() != out.resolve():
      shutil.copyfile(wheel, out)
    return out
  tmp = out.with_name(out.name + ".tmp")
  with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:  # fmt: skip
    if pattern is _FAMILY:
      unknown = keep - _families(zin)
      if unknown:
        raise ValueError(f"{wheel.name} has no environment family {sorted(unknown)}")
    record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
    records = []
    for info in zin.infolist():
      name = info.filename
      if name == record_name:
        continue
      m = pattern.match(name)
      if m and m.group(1) not in keep and m.group(1) != "python":
        # a dropped family: its registration stays importable only where entry.py imports it
        continue
      data = zin.read(info)
      if name == "envpool/entry.py":
        data = _entry(keep, data.decode()).encode()
      zout.writestr(info, data)
      records.append(_record_line(name, data))
    records.append(f"{record_name},,")
    zout.writestr(record_name, "\n".join(records) + "\n")
  tmp.replace(out)
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("wheels", nargs="+", type=pathlib.Path)
  parser.add_argument("--out-dir", type=pathlib.Path, required=True)
  parser.add_argument(
      "--keep",
      default="atari,classic_control",
      help="environment families to keep (comma-separated; default: %(default)s)",
  )
  args = parser.parse_args()
  keep = {k for k in args.keep.split(",") if k}
  args.out_dir.mkdir(parents=True, exist_ok=True)
  for wheel in args.wheels:
    out = slim(wheel, args.out_dir, keep)
    print(f"{out.name}: {wheel.stat().st_size / 2**20:.1f} -> {out.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
  main()
