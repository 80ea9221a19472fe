#!/usr/bin/env bash
# One device call: where the CUDA dW fold's time over cuBLAS goes (a diagnostic, never evidence).
#   bash scripts/fold_traffic_call.sh DIAG_DIR
# DIAG_DIR holds a py3.12 `_C*.so` built with notes/wip/fold-traffic-knobs-DIAGNOSTIC.patch and the `_fold_plan*.so`
# (carried in .devtmp/). Times, beside cuBLAS bf16, cuBLAS with an FP32 C and the Triton fold, the chunked-store fold
# with and without its main-grad load / store (`fold_io_probe.py --traffic`) at T = 1024, 4096 and 16384 in the
# bench's 13 irregular samples, then at 4096 and 16384 with every sample a whole number of 64-token tiles
# (`--aligned`). Text into OUT (traffic.txt, traffic_aligned.txt).
set -u
diag=$1
export PYTHONPATH=$HOME/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$HOME/site" .whl/*.whl
cp "$diag"/_C*.so "$diag"/_fold_plan*.so gradsweep/
timeout 200 python3 scripts/fold_io_probe.py --traffic --t 1024,4096,16384 > "$OUT/traffic.txt" 2>&1
echo "traffic rc=$?"
timeout 150 python3 scripts/fold_io_probe.py --traffic --aligned --t 4096,16384 > "$OUT/traffic_aligned.txt" 2>&1
echo "aligned rc=$?"
cat "$OUT/traffic.txt" "$OUT/traffic_aligned.txt"
