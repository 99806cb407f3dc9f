#!/bin/bash
# Here (no GPU): build what tools/gpu/check.sh installs on a lent GPU machine, into .whl/
# (git-ignored; carry it with the run). The GPU machine's image has Python 3.12 with torch,
# pytest, hypothesis, but not msgspec, cryptography, trio nor this project.
set -e
cd "$(dirname "$0")/../.."
mkdir -p .whl && rm -f .whl/*.whl
python3 -m pip wheel -q --no-deps -w .whl packages/monarch-transport packages/monarch-core \
  packages/monarch-rdma packages/monarch-tensor
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl msgspec cryptography cffi pycparser anyio \
  typing_extensions trio outcome sniffio
ls .whl
