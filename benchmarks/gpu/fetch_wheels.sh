#!/usr/bin/env bash
# Downloads, here, the wheels that the device machine's image lacks for benchmarks/gpu/atari.sh
# into DEST (default .whl, git-ignored), for Python 3.12 on x86-64 Linux.
#
#   bash benchmarks/gpu/fetch_wheels.sh            # -> .whl/ (about 8 MiB)
#   PYTHON_VERSION=3.11 bash benchmarks/gpu/fetch_wheels.sh /tmp/whl311   # for a check here
#
# The image ('cuda', /work/.library/device/KINDS.md) already holds jax 0.11.2 with CUDA 13,
# flax, optax, orbax-checkpoint, numpy, matplotlib, tqdm, protobuf, absl-py, attrs, wrapt,
# cloudpickle, typing-extensions, packaging, pillow, scipy, pandas, statsmodels and seaborn.
# Missing: envpool (with dm-env, dm-tree, optree, gymnasium, farama-notifications and
# envpool-assets), tyro (docstring-parser, typeguard), tensorboardX, and for
# experiments/plot.py rliable and arch (they may not import with the image's pandas: atari.sh
# then returns the run's own plot). The project itself is not a wheel: atari.sh puts the
# tree's src/ on PYTHONPATH. envpool's and envpool-assets' wheels (53 + 62 MB) are rewritten
# with only the Atari and classic-control environments (slim_wheel.py): about 5.6 MB.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEST=${1:-.whl}
PYTHON=${PYTHON:-python3}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
KEEP=${KEEP:-atari,classic_control}
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
  manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
# One version of each (two stop the install). The versions this project's tests run with.
BINARY=(
  envpool==1.2.5 envpool-assets==0.3.0 dm-env==1.6 dm-tree==0.1.10 optree==0.20.0
  gymnasium==1.3.0 farama-notifications==0.0.6 tyro==1.0.17 docstring-parser==0.18.0
  typeguard==4.6.1 tensorboardX==2.6.5 arch==7.2.0
)
SOURCE_ONLY=(rliable==1.2.0) # no wheel on PyPI: built here (pure Python)

platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
  --implementation cp "${platform_args[@]}" -d "$raw" "${BINARY[@]}"
"$PYTHON" -m pip wheel -q --no-deps -w "$raw" "${SOURCE_ONLY[@]}"
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PYTHON" "$HERE/slim_wheel.py" "$raw"/*.whl --out-dir "$DEST" --keep "$KEEP"
du -ch "$DEST"/*.whl | tail -1
