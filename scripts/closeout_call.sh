#!/usr/bin/env bash
# One closeout device call with its set-up, for `run`:
#   KEY=.keys/K.pem [PRETEST=1 | GATE="command"] [REVERT="a.patch b.patch ..."] [BUDGET=s] \
#     bash scripts/closeout_call.sh STATE [closeout args...]
# (installs .whl, puts the carried _C / _fold_plan in place; PRETEST=1 first runs the dW fold GPU test (its output in
# OUT/gputest.txt), GATE runs any command (an A/B that must show its gain, say; OUT/gate.txt), and if either fails,
# reverses the REVERT patches (given in the order they were applied) before the sweep, so that unproven patches
# never reach signed evidence; where STATE/reverted/ holds .so files, they replace the carried ones (an extension
# built from the patched csrc/ must not be signed with the reverted source); then scripts/h200_closeout.sh)
set -u
: "${KEY:?KEY=the signing key (.pem)}"
t0=$(date +%s)
export PYTHONPATH=$HOME/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $HOME/site .whl/*.whl
cp "$1"/_C.cpython-*.so "$1"/_fold_plan.cpython-*.so gradsweep/
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
# run_gate LOG LINES CMD...: CMD (at most 170 s) with its output in OUT/LOG; if it fails, the REVERT patches are
# reversed (last applied first) and STATE/reverted/*.so, where present, replace the carried builds
run_gate() {
  local log=$1 lines=$2 rc p; shift 2
  timeout -k 5 170 "$@" > "$OUT/$log" 2>&1; rc=$?
  echo "${log%.txt} rc=$rc $(( $(date +%s)-t0 )) s" | tee -a "$OUT/$log"; tail -"$lines" "$OUT/$log"
  if [ $rc != 0 ] && [ -n "${REVERT:-}" ]; then
    for p in $(printf '%s\n' $REVERT | tac); do patch -R -p1 -s < "$p"; done
    if ls "$STATE"/reverted/*.so > /dev/null 2>&1; then cp "$STATE"/reverted/*.so "$STATE"/ && cp "$STATE"/reverted/*.so gradsweep/; fi
    echo "REVERTED: $REVERT" | tee -a "$OUT/$log"
  fi
}
STATE=$1
if [ "${PRETEST:-0}" = 1 ]; then
  run_gate gputest.txt 4 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_triton_gemm_vocab.py -k "dw_tma_fold"
fi
if [ -n "${GATE:-}" ]; then run_gate gate.txt 12 bash -c "$GATE"; fi
dl=$(( ${BUDGET:-585} - ($(date +%s) - t0) ))
bash scripts/h200_closeout.sh "$1" $OUT "$KEY" --deadline $dl "${@:2}" > $OUT/closeout.txt 2>&1
tail -c 6000 $OUT/closeout.txt
