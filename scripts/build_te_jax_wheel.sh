#!/usr/bin/env bash
# Build the transformer_engine_jax wheel that `make setup` installs (scripts/wheels/), from PyPI's sdist.
#
#   bash scripts/build_te_jax_wheel.sh [SCRATCH]      # ~7 min on 2 cores; SCRATCH defaults to a temp folder
#
# Why a committed wheel: transformer-engine-jax is published as a source package only; building it is one
# pybind11 extension compiled by g++ (no nvcc, ~7 min on 2 cores), which a cold CI run must not pay on every
# clone. The wheel is small (a few MB); its sha256 sits beside it and `make setup` checks it before installing.
# Run this script again when a pin below changes, then commit the wheel and its .sha256.
#
# Pins: the same as pyproject's `te` extra (jax/jaxlib/flax/cuda12 plugin, cudnn-frontend, TE itself); the XLA
# FFI headers come from jaxlib, the CUDA/cuDNN/NCCL/NVTX headers from the nvidia-*-cu12 wheels. cudnn-frontend is
# header-only for this build and unused by TE-JAX's Python at run time; 1.28.0 is the newest release that does not
# pull in nvidia-cutlass-dsl (~0.5 GB) and satisfies TE's >= 1.25.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
SCRATCH=${1:-$(mktemp -d)}
PYTHON=${PYTHON:-python3}
TE_VERSION=2.20.2
OUT="$HERE/scripts/wheels"

"$PYTHON" -m venv "$SCRATCH/venv"
PIP="$SCRATCH/venv/bin/pip"
"$PIP" install --quiet --upgrade pip
# Everything the sdist's build needs, pinned; no build isolation below (its build-requires name an unpinned
# jax[cuda12], which would pull the newest jax and its CUDA wheels).
"$PIP" install --quiet "jax[cuda12]==0.12.0.1" "jaxlib==0.12.0.1" "flax==0.12.12" \
  "nvidia-cudnn-frontend==1.28.0" "nvidia-nvtx-cu12==12.9.79" "pybind11==3.1.0" "setuptools==80.9.0" "wheel==0.45.1"
"$PIP" download --quiet --no-deps --no-build-isolation --no-binary :all: -d "$SCRATCH/dl" "transformer-engine-jax==$TE_VERSION"
# NVTE_BUILD_USE_NVIDIA_WHEELS=1: headers from the nvidia-* wheels, never a host nvcc's toolkit (a CUDA 13 one here
# made the build include the wrong headers). MAX_JOBS=2: the build machine has two cores.
NVTE_FRAMEWORK=jax NVTE_BUILD_USE_NVIDIA_WHEELS=1 MAX_JOBS=2 \
  "$PIP" wheel --no-build-isolation --no-deps -w "$SCRATCH/wheel" "$SCRATCH/dl/transformer_engine_jax-$TE_VERSION.tar.gz"
mkdir -p "$OUT"
rm -f "$OUT"/transformer_engine_jax-*.whl "$OUT"/transformer_engine_jax-*.whl.sha256
cp "$SCRATCH"/wheel/transformer_engine_jax-"$TE_VERSION"-*.whl "$OUT/"
(cd "$OUT" && for w in transformer_engine_jax-*.whl; do sha256sum "$w" > "$w.sha256"; done)
ls -l "$OUT"
