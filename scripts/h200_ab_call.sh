#!/usr/bin/env bash
# One device call of A/B probes for the prepared patches and the open diagnostics (notes/wip/README.md, "Next
# session's first device call"), on the lent H200, before a closeout. Every step runs under its own `timeout`
# (a persistent kernel that deadlocks must cost its step's limit, not the call's ten minutes) and writes its
# output under one folder, packed into OUT/ab.tar.gz after each step (a call cut by its limit still brings back
# what finished), with OUT/summary.txt listing each step's exit code and seconds.
#
# Usage (repo root on the GPU machine: the patched tree, its extension built for the device's Python in STATE):
#   bash scripts/h200_ab_call.sh STATE OUT
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
  local t0; t0=$(date +%s)
  local left=$(( deadline - (t0 - t_start) - 10 ))
  if [ "$left" -lt 20 ]; then echo "$name skipped: the call's deadline" | tee -a "$res/summary.txt"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout -k 10 "$limit" "$@" > "$res/$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$res/summary.txt"
  cp "$res/summary.txt" "$out/summary.txt"
  tar -czf "$out/.ab.tar.gz" -C "$res" . && mv "$out/.ab.tar.gz" "$out/ab.tar.gz"
}

# 1. the CUDA dW fold schedules: every schedule's bits against the mma.sync fold, then their times
step fold_test 240 python3 -m pytest -q -m gpu tests/test_cuda_ops.py -k hopper_fold
step fold_probe 150 python3 scripts/fold_schedule_probe.py "$res/fold.json"
# 2. the Triton RoPE launch ladder by graph replay (issue 4's 90% of copy)
step rope 200 python3 scripts/rope_configs.py "$res/rope.json"
# 3. host figures: the fold plan and the rms_norm step with the compiled planner and the one upload, then on
#    the base tree
step host_new 90 python3 scripts/host_probe.py "$res/host_new" --op rms_norm --case bwd --fold-plan
g() { git -c user.name=ab -c user.email=ab@localhost "$@"; }  # a stash is a commit: it needs an identity
if g stash -q; then
  step host_base 90 python3 scripts/host_probe.py "$res/host_base" --op rms_norm --case bwd --fold-plan
  g stash pop -q || echo "stash pop failed: the tree is the base tree from here" | tee -a "$res/summary.txt"
fi
# 4. where the device thread's backward time goes (Triton dW at T = 4096: host-bound on the worker thread only)
step backward_thread 150 python3 scripts/backward_thread_probe.py "$res/backward_thread" --op det_gemm \
  --case dw_t4096 --op rms_norm --case bwd --profile triton --profile cuda --steps 100
# 5. SiLU forward: why end to end reads 87% of copy where kernels-only reads 98% (gaps, or clocks)
step silu_timeline 120 python3 scripts/timeline_probe.py "$res/silu_timeline" --op silu --case fwd --sustain 3
step silu_audit 120 python3 scripts/host_probe.py "$res/silu_audit" --op silu --case fwd --audit
cp "$res/context.txt" "$out/context.txt"
