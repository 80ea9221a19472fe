#!/usr/bin/env bash
# The closeout call on a 2-GPU Hopper box (the lent nvidia-h200-x2), at most 8 files back:
#   GPU 0: the release sweep of manifests/h200.yaml on ONE H200 (its time is the single-GPU figure), verify, report;
#   GPU 1, at the same time: the GPU tests (pytest -m gpu), the drift run, then `gradsweep bench` (timing never
#   shares a GPU with the sweep; the host's 32 cores are shared).
# Usage (repo root, on the GPU machine): bash scripts/h200_closeout.sh OUTDIR KEY [--bench-op OP]...
# Files: h200.evidence.json, h200.test-result.json, h200.bench.evidence.json, h200.bench.png, drift.tar.gz,
# logs.tar.gz (build, gpu tests, sweep, verify, reports, bench, drift logs), summary.txt.
set -uo pipefail
out=${1:?OUTDIR}; key=${2:?signing key}; shift 2
bench_args=()
while [ $# -gt 0 ]; do case "$1" in --bench-op) bench_args+=(--op "$2"); shift 2;; *) shift;; esac; done
pub="${key%.pem}.pub.pem"
logs=$(mktemp -d); work=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$HOME/site" .whl/*.whl \
    && export PYTHONPATH="$HOME/site:$PYTHONPATH"
fi
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv; lscpu | grep "Model name"
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.device_count())"
  time python3 setup.py build_ext --inplace; } > "$logs/build.log" 2>&1
tail -3 "$logs/build.log"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
bench_gpu=$([ "$gpus" -ge 2 ] && echo 1 || echo 0)

(  # GPU 0: the release sweep
  export CUDA_VISIBLE_DEVICES=0
  t0=$(date +%s)
  timeout 540 python3 -m gradsweep.cli sweep manifests/h200.yaml -o "$out/h200.evidence.json" --key "$key" \
    --no-progress -j 4 > "$logs/sweep.log" 2>&1
  echo "sweep rc=$? in $(( $(date +%s) - t0 )) s on one GPU" >> "$logs/summary.txt"
  python3 -m gradsweep.cli verify "$out/h200.evidence.json" --trusted-key "$pub" > "$logs/verify.log" 2>&1
  echo "verify rc=$?" >> "$logs/summary.txt"
  python3 -m gradsweep.cli report "$out/h200.evidence.json" --format md -o "$logs/h200.md" --trusted-key "$pub"
  python3 -m gradsweep.cli report "$out/h200.evidence.json" --trusted-key "$pub" > "$logs/h200.table.txt" 2>&1
) &
sweep_pid=$!

(  # GPU 1: correctness tests, drift, then the bench
  export CUDA_VISIBLE_DEVICES=$bench_gpu
  t0=$(date +%s)
  timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > "$logs/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? in $(( $(date +%s) - t0 )) s" >> "$logs/summary.txt"
  t0=$(date +%s)
  timeout 120 python3 bench/bench_drift.py "$work/drift" --key "$key" --manifest manifests/h200.yaml --repeat 2 \
    > "$logs/drift.log" 2>&1
  echo "drift rc=$? in $(( $(date +%s) - t0 )) s" >> "$logs/summary.txt"
  t0=$(date +%s)
  timeout 330 python3 -m gradsweep.cli bench manifests/h200.yaml -o "$out/h200.bench.evidence.json" \
    --chart "$out/h200.bench.png" --key "$key" "${bench_args[@]}" > "$logs/bench.log" 2>&1
  echo "bench rc=$? in $(( $(date +%s) - t0 )) s" >> "$logs/summary.txt"
  python3 -m gradsweep.cli report "$out/h200.bench.evidence.json" --format md -o "$logs/h200.bench.md" \
    --trusted-key "$pub" >> "$logs/bench.log" 2>&1
) &
bench_pid=$!

wait $sweep_pid $bench_pid
cp "$logs/summary.txt" "$out/summary.txt"
tar -czf "$out/logs.tar.gz" -C "$logs" .
[ -d "$work/drift" ] && tar -czf "$out/drift.tar.gz" -C "$work" drift
cat "$out/summary.txt"; tail -5 "$logs/sweep.log"; tail -4 "$logs/gpu_tests.log"; tail -25 "$logs/bench.log"
