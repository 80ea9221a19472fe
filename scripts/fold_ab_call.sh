#!/usr/bin/env bash
# One device call: a candidate `_C` against a reference `_C` on the CUDA dW fold (a diagnostic, never evidence).
#   bash scripts/fold_ab_call.sh REF_DIR CAND_DIR OUT [ROUNDS]
# REF_DIR / CAND_DIR hold a py3.12 `_C*.so` (and REF_DIR the `_fold_plan*.so`), carried in .devtmp/. Installs .whl,
# runs the fold's GPU tests on the candidate (gputest.txt: its bits must hold before its time means anything), then
# `scripts/fold_io_probe.py --plain` with each build swapped into gradsweep/, reference first, ROUNDS times (A B A B:
# each file times cuBLAS's bf16 and FP32-C references too, so compare the fold's ratios, not raw microseconds across
# processes). Text files only (the tool hands back a few files; JSON would double them). With GAIN (say 0.03) the
# exit status is scripts/fold_ab_verdict.py's: 0 only if the candidate passed its tests and is GAIN faster at T = 4096
# (closeout_call.sh's GATE: an unproven fold patch is reversed before the sweep).
set -u
ref=$1; cand=$2; out=$3; rounds=${4:-2}
export PYTHONPATH=$HOME/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$HOME/site" .whl/*.whl
cp "$ref"/_fold_plan*.so gradsweep/
mkdir -p "$out"
nvidia-smi --query-gpu=name --format=csv,noheader
cp "$cand"/_C*.so gradsweep/
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_fold_carried.py tests/test_cuda_ops.py \
  tests/test_cuda_stage_copy.py > "$out/gputest.txt" 2>&1
echo "gputest rc=$?"; tail -1 "$out/gputest.txt"
for i in $(seq 1 "$rounds"); do
  cp "$ref"/_C*.so gradsweep/ && timeout 60 python3 scripts/fold_io_probe.py --plain > "$out/ref$i.txt" 2>&1
  cp "$cand"/_C*.so gradsweep/ && timeout 60 python3 scripts/fold_io_probe.py --plain > "$out/cand$i.txt" 2>&1
done
grep -h "default\|^T=" "$out"/ref*.txt "$out"/cand*.txt
if [ -n "${GAIN:-}" ]; then python3 scripts/fold_ab_verdict.py "$out" --gain "$GAIN" | tee "$out/verdict.txt"; exit "${PIPESTATUS[0]}"; fi
