#!/usr/bin/env bash
# Set up gradsweep on a fresh machine: a virtualenv in .venv with pinned torch / triton and an
# editable install that compiles csrc/ (gradsweep._C) when nvcc is present.
#   CPU box:     bash scripts/setup.sh             (torch 2.13.0 CPU build, triton 3.6.0)
#   Hopper box:  GRADSWEEP_SYSTEM_TORCH=1 bash scripts/setup.sh
#                (reuses the box's CUDA torch and triton through --system-site-packages)
# torch is pinned exactly, never a range: a range could pull a multi-GB CUDA build onto a CPU box.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "${GRADSWEEP_SYSTEM_TORCH:-0}" = "1" ]; then
  "$PY" -m venv --system-site-packages .venv
else
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ "${GRADSWEEP_SYSTEM_TORCH:-0}" != "1" ]; then
  python -m pip install -q torch==2.13.0 triton==3.6.0
fi
python -m pip install -q "setuptools>=68" wheel "pybind11>=2.12"
# CUTLASS / CuTe headers for the Hopper GEMMs of csrc/ (headers only: its Python tooling deps are not needed)
python -m pip install -q --no-deps nvidia-cutlass==4.2.0.0
python -m pip install -q --no-build-isolation -e ".[test]"
python - <<'PY'
import torch, triton
try:
    import gradsweep._C  # noqa: F401
    ext = "built"
except ImportError as exc:
    ext = f"not built ({exc})"
print(f"gradsweep set up: torch {torch.__version__}, triton {triton.__version__}, CUDA extension {ext}")
PY
