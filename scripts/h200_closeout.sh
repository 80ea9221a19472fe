#!/usr/bin/env bash
# The closeout call on a Hopper box (the lent H200s), at most 8 files back. Phase 1: the release sweep of
# manifests/h200.yaml, one worker per visible GPU (each cell pinned to one GPU), while the GPU tests of the CUDA
# attention and RL kernels (small shapes, not yet in the release manifest) share the last GPU. Phase 2, once the
# sweep is done: `gradsweep bench` for the ops of each --bench-ops group, until the deadline (seconds from the
# start; the sweep may use all but 15 of them). Timing never overlaps the sweep.
# Usage (repo root, on the GPU machine):
#   bash scripts/h200_closeout.sh OUTDIR KEY [--deadline S] [--bench-ops "OP OP ..."]...   (one bench per group)
# Files: h200.evidence.json, h200.test-result.json, h200.bench-<ops>.evidence.json and .png per bench group,
# logs.tar.gz (build, tests, sweep, verify, reports, bench logs), summary.txt (at most 8 with two groups).
set -uo pipefail
out=${1:?OUTDIR}; key=${2:?signing key}; shift 2
deadline=560; groups=()
while [ $# -gt 0 ]; do
  case "$1" in --bench-ops) groups+=("$2"); shift 2;; --deadline) deadline=$2; shift 2;; *) shift;; esac
done
t_start=$(date +%s)
pub="${key%.pem}.pub.pem"
logs=$(mktemp -d)
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
last=$(( gpus - 1 ))

(  # phase 1a: the release sweep on every GPU
  t0=$(date +%s)
  timeout $(( deadline - 15 )) python3 -m gradsweep.cli sweep manifests/h200.yaml -o "$out/h200.evidence.json" \
    --key "$key" --no-progress > "$logs/sweep.log" 2>&1
  echo "sweep rc=$? in $(( $(date +%s) - t0 )) s on $gpus GPU(s)" >> "$logs/summary.txt"
  python3 -m gradsweep.cli verify "$out/h200.evidence.json" --trusted-key "$pub" > "$logs/verify.log" 2>&1
  echo "verify rc=$?" >> "$logs/summary.txt"
  python3 -m gradsweep.cli report "$out/h200.evidence.json" --format md -o "$logs/h200.md" --trusted-key "$pub"
  python3 -m gradsweep.cli report "$out/h200.evidence.json" --trusted-key "$pub" > "$logs/h200.table.txt" 2>&1
) &
sweep_pid=$!

(  # phase 1b, beside the sweep on the last GPU: GPU tests of kernels not in the release manifest
  export CUDA_VISIBLE_DEVICES=$last
  t0=$(date +%s)
  timeout 240 python3 -m pytest -q -m gpu tests/test_cuda_ops.py tests/test_cuda_build.py tests/test_cuda_attention.py tests/test_cuda_rl.py -p no:cacheprovider \
    > "$logs/gpu_tests.log" 2>&1
  echo "gpu tests (cuda ops, attention, rl) rc=$? in $(( $(date +%s) - t0 )) s" >> "$logs/summary.txt"
) &
side_pid=$!

wait $sweep_pid
wait $side_pid
# phase 2: the bench, alone on the GPUs once the sweep is done, one evidence file per group of ops, until the
# deadline (a group that cannot finish in time is cut by `timeout` and leaves no evidence)
for group in "${groups[@]}"; do
  left=$(( deadline - ( $(date +%s) - t_start ) ))
  if [ "$left" -lt 45 ]; then echo "bench group [$group] skipped: $left s left" >> "$logs/summary.txt"; continue; fi
  name=h200.bench-$(echo "$group" | tr ' ' '-')
  ops=(); for op in $group; do ops+=(--op "$op"); done
  t0=$(date +%s)
  timeout "$left" python3 -m gradsweep.cli bench manifests/h200.yaml -o "$out/$name.evidence.json" \
    --chart "$out/$name.png" --key "$key" "${ops[@]}" > "$logs/$name.log" 2>&1
  echo "bench [$group] rc=$? in $(( $(date +%s) - t0 )) s (budget $left s)" >> "$logs/summary.txt"
  python3 -m gradsweep.cli report "$out/$name.evidence.json" --format md -o "$logs/$name.md" \
    --trusted-key "$pub" >> "$logs/$name.log" 2>&1
done
wait
cp "$logs/summary.txt" "$out/summary.txt"
tar -czf "$out/logs.tar.gz" -C "$logs" .
cat "$out/summary.txt"; tail -6 "$logs/sweep.log"; tail -3 "$logs/gpu_tests.log"
