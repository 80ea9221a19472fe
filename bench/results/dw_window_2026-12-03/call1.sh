#!/usr/bin/env bash
# Device call 1: the row-window TMA fold (win) against the session's base build, on the dW bench cases.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $HOME/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$HOME/site:. PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
python3 .devtmp/p12/tma_encode_check.py
cp .devtmp/ab/win/_C*.so gradsweep/
python3 -m pytest -q -m gpu tests/test_cuda_ops.py -k "hopper_fold or gpu_check" 2>&1 | tail -4
python3 scripts/bits_dump.py dump /tmp/win.pt --op det_gemm --case dw_t --family cuda 2>&1 | tail -2
python3 scripts/timeline_probe.py $OUT/win --op det_gemm --case dw_t --sustain 3 2>&1 | grep -v Warning
cp .devtmp/ab/base/_C*.so gradsweep/
python3 scripts/bits_dump.py dump /tmp/base.pt --op det_gemm --case dw_t --family cuda 2>&1 | tail -2
python3 scripts/bits_dump.py compare /tmp/base.pt /tmp/win.pt 2>&1 | tail -8
python3 scripts/timeline_probe.py $OUT/base --op det_gemm --case dw_t --sustain 3 2>&1 | grep -v Warning
