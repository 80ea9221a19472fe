#!/bin/bash
# Diagnostic A/B of the dK / dV split (old = HEAD's csrc, new = the working tree's), one device call.
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target $HOME/site .whl/*.whl
export PYTHONPATH=$HOME/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
lscpu | grep -E "Model name|^CPU\(s\)" >> $OUT/gpu.txt
use() { cp .devtmp/ab/$1/_C.cpython-312-x86_64-linux-gnu.so gradsweep/; echo "== $1 $(sha256sum gradsweep/_C.cpython-312-x86_64-linux-gnu.so | cut -c1-12)"; }
{
use new
timeout 240 python3 -m pytest -q -m gpu tests/test_cuda_attention.py 2>&1 | tail -15
echo "tests done at $(( $(date +%s) - t0 )) s"
python3 scripts/bits_dump.py dump /tmp/new.pt --op attention --family cuda 2>&1 | tail -8
use old
python3 scripts/bits_dump.py dump /tmp/old.pt --op attention --family cuda 2>&1 | tail -8
python3 scripts/bits_dump.py compare /tmp/old.pt /tmp/new.pt 2>&1; echo "compare rc=$?"
echo "bits done at $(( $(date +%s) - t0 )) s"
python3 -m gradsweep.cli keygen -o /tmp/k.pem > /dev/null 2>&1
for b in old new old new; do
  use $b
  timeout 150 python3 -m gradsweep.cli bench manifests/h200.yaml --op attention --family cuda -o /tmp/ab_$b.json --key /tmp/k.pem --force 2>&1 | grep -E "attention|ceiling|copy|cuBLAS" | head -30
  echo "bench $b done at $(( $(date +%s) - t0 )) s"
done
use new
timeout 150 ncu --profile-from-start off --clock-control none -k regex:dkdv --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats python3 scripts/ncu_step.py attention/fwd_bwd_8x1024 cuda 2>&1 | grep -vE "^==PROF==" | tail -150
echo "ncu done at $(( $(date +%s) - t0 )) s"
} > $OUT/ab.txt 2>&1
