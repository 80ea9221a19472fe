#!/bin/bash
# Diagnostic A/B of the dK / dV pipeline depth (old = HEAD's csrc; stages = working tree, GRADSWEEP_DKDV_STAGES).
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target $HOME/site .whl/*.whl
export PYTHONPATH=$HOME/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)" >> $OUT/gpu.txt
use() { cp .devtmp/ab/$1/_C.cpython-312-x86_64-linux-gnu.so gradsweep/; echo "== $1 $(sha256sum gradsweep/_C.cpython-312-x86_64-linux-gnu.so | cut -c1-12) stages=${GRADSWEEP_DKDV_STAGES:-default}"; }
{
use stages
for n in 2 3 4; do
  export GRADSWEEP_DKDV_STAGES=$n
  timeout 120 python3 -m pytest -q -m gpu tests/test_cuda_attention.py 2>&1 | tail -3
  python3 scripts/bits_dump.py dump /tmp/s$n.pt --op attention --family cuda --case fwd_bwd 2>&1 | tail -1
done
unset GRADSWEEP_DKDV_STAGES
use old
python3 scripts/bits_dump.py dump /tmp/old.pt --op attention --family cuda --case fwd_bwd 2>&1 | tail -1
for n in 2 3 4; do echo "-- old vs stages=$n"; python3 scripts/bits_dump.py compare /tmp/old.pt /tmp/s$n.pt 2>&1; echo "compare rc=$?"; done
echo "tests + bits done at $(( $(date +%s) - t0 )) s"
python3 -m gradsweep.cli keygen -o /tmp/k.pem > /dev/null 2>&1
for b in old 2 3 4 old 4 3 2; do
  if [ $b = old ]; then unset GRADSWEEP_DKDV_STAGES; use old; else export GRADSWEEP_DKDV_STAGES=$b; use stages; fi
  timeout 150 python3 -m gradsweep.cli bench manifests/h200.yaml --op attention --family cuda -o /tmp/ab_$b.json --key /tmp/k.pem --force 2>&1 | grep -E "│ attention|ceilings" | head -30
  echo "bench $b done at $(( $(date +%s) - t0 )) s"
done
for n in 2 4; do
  export GRADSWEEP_DKDV_STAGES=$n; use stages
  timeout 100 ncu --profile-from-start off --clock-control none -k regex:dkdv --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats python3 scripts/ncu_step.py attention/fwd_bwd_8x1024 cuda 2>&1 | grep -vE "^==PROF==" | grep -E "dkdv_kernel|Duration|Registers Per|Warp Cycles Per Issued|Compute \(SM\)|Memory Throughput|Achieved Occupancy|Dynamic Shared|stalled|This stall type|L2 Cache|L1/TEX"
  echo "ncu $n done at $(( $(date +%s) - t0 )) s"
done
} > $OUT/ab.txt 2>&1
