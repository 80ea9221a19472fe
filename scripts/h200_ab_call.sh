#!/usr/bin/env bash
# One device call of A/B probes for the prepared patches and the open diagnostics (notes/wip/README.md, "Next
# session's first device call"), on the lent H200, before a closeout. Every step runs under its own `timeout`
# (a persistent kernel that deadlocks must cost its step's limit, not the call's ten minutes) and writes its
# output under one folder, packed into OUT/ab.tar.gz after each step (a call cut by its limit still brings back
# what finished), with OUT/summary.txt listing each step's exit code and seconds.
#
# Usage (repo root on the GPU machine: the patched tree, its extension built for the device's Python in STATE):
#   [BASE=<rev>] [DEADLINE=<s>] [SKIP="step ..."] bash scripts/h200_ab_call.sh STATE OUT
# STATE holds _C.cpython-*.so (required: the patched csrc/ build) and, optionally, triton-cache.tar.gz.
# The base tree is the device copy's HEAD (the last landed commit; `git stash` reaches it) for the host figures
# that need a before / after (the fold plan); the kernel A/Bs switch inside one process.
set -uo pipefail
t_start=$(date +%s); deadline=${DEADLINE:-560}  # the call's own limit is 600 s: stop in time to pack
state=${1:?STATE}; out=${2:?OUT}
mkdir -p "$out"
res=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH="$HOME/site:$PWD"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$HOME/site" .whl/*.whl
fi
tcache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
[ -f "$state/triton-cache.tar.gz" ] && mkdir -p "$tcache" && tar -xzf "$state/triton-cache.tar.gz" -C "$tcache"
so=$(ls "$state"/_C.cpython-*.so 2>/dev/null | head -1)
[ -n "$so" ] || { echo "no extension in $state" | tee "$out/summary.txt"; exit 2; }
cp "$so" gradsweep/
for plan in "$state"/_fold_plan.cpython-*.so; do [ -f "$plan" ] && cp "$plan" gradsweep/; done
{ echo "extension $(basename "$so") $(sha256sum "$so" | cut -c1-12)"; git log -1 --format='HEAD %h %s'
  git diff --stat | tail -1; nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader
} > "$res/context.txt" 2>&1

step() {  # step NAME SECONDS CMD...: output to NAME.txt, exit code and time to the summary, results packed
  local name=$1 limit=$2; shift 2
  case " ${SKIP:-} " in *" $name "*) echo "$name skipped: SKIP" | tee -a "$res/summary.txt"; return;; esac
  local t0; t0=$(date +%s)
  local left=$(( deadline - (t0 - t_start) - 10 ))
  if [ "$left" -lt 20 ]; then echo "$name skipped: the call's deadline" | tee -a "$res/summary.txt"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout -k 10 "$limit" "$@" > "$res/$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$res/summary.txt"
  cp "$res/summary.txt" "$out/summary.txt"
  tar -czf "$out/.ab.tar.gz" -C "$res" . && mv "$out/.ab.tar.gz" "$out/ab.tar.gz"
}

# 1. the memoised Triton dW fold (notes/wip/triton-dw-memo.patch): the TMA fold against the gather fold on the
#    GPU, and the M-independence checks of the Triton GEMM family
step dw_test 300 python3 -m pytest -q -m gpu tests/test_triton_gemm_vocab.py -k "dw_tma_fold or m_independence_gpu"
# 2. the dW step's host before / after: the backward split per engine thread, and host_probe with the fold plan
step bt_new 120 python3 scripts/backward_thread_probe.py "$res/bt_new" --op det_gemm --case dw_t4096 \
  --profile triton --steps 100
step host_new 120 python3 scripts/host_probe.py "$res/host_new" --op det_gemm --case dw_t4096 --fold-plan
g() { git -c user.name=ab -c user.email=ab@localhost "$@"; }  # a stash is a commit: it needs an identity
base_steps() {  # step 2's figures on the base tree
  step bt_base 120 python3 scripts/backward_thread_probe.py "$res/bt_base" --op det_gemm --case dw_t4096 \
    --profile triton --steps 100
  step host_base 120 python3 scripts/host_probe.py "$res/host_base" --op det_gemm --case dw_t4096 --fold-plan
}
# the base tree: BASE=<rev> swaps gradsweep/ for that revision's (the patches already committed), else `git stash`
# (the patches still in the working tree); either way restored before step 3
if [ -n "${BASE:-}" ]; then
  if g checkout -q "$BASE" -- gradsweep; then
    base_steps
    g checkout -q HEAD -- gradsweep && g clean -qfd gradsweep \
      || echo "restore failed: the tree is the base tree from here" | tee -a "$res/summary.txt"
  fi
elif g stash -q; then
  base_steps
  g stash pop -q || echo "stash pop failed: the tree is the base tree from here" | tee -a "$res/summary.txt"
fi
# 3. the signed fold_plan rows' gap (notes/triton_rowwise.md, "Twenty-fourth session"): the fold-plan cases before
#    and after linear_logp's T = 16384 steps in one process, then the bench's fold_plan group alone (signed with the
#    box's default key, made on first use: not release evidence)
step plan_after_llp 200 python3 scripts/host_probe.py "$res/plan_after_llp" --op linear_logp --case fwd_bwd_t16384 \
  --fold-plan --steps 30
step plan_bench 150 python3 -m gradsweep.cli bench manifests/h200.yaml --op fold_plan \
  -o "$res/plan_bench.evidence.json"
# 4. the CUDA dW fold's ~107 us a call that does not grow with T (notes/kernels_cuda.md): one step under Nsight
#    Compute, the fold and cuBLAS's dY^T X side by side
ncu_args=(ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy
  --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis)
step ncu_fold 150 "${ncu_args[@]}" python3 scripts/ncu_step.py det_gemm/dw_t4096 cuda
step ncu_cublas 150 "${ncu_args[@]}" python3 scripts/ncu_step.py det_gemm/dw_t4096 stock
cp "$res/context.txt" "$out/context.txt"
