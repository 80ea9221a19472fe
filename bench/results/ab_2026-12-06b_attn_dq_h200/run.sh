#!/usr/bin/env bash
# One device call: three waiting patches (CUDA piece copy, wgmma attention forward, wgmma attention dQ) applied to the
# carried tree with their combined py3.12 build; the CUDA family's GPU tests, the attention A/B and bench.
# A diagnostic: nothing here is signed evidence.
set -u
t0=$(date +%s)
D=.devtmp/abx2
export PYTHONPATH=$HOME/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $HOME/site .whl/*.whl
for p in piece fwd dq; do patch -p1 -s < $D/$p.patch || { echo "patch $p failed"; exit 1; }; done
cp $D/_C.cpython-*.so $D/_fold_plan.cpython-*.so gradsweep/
echo "-- _C $(sha256sum gradsweep/_C.cpython-*.so | cut -c1-12)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
step() {  # step NAME SECONDS CMD...
  local name=$1 lim=$2; shift 2
  timeout -k 5 "$lim" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name rc=$? at $(( $(date +%s) - t0 )) s"; tail -${TAILN:-8} "$OUT/$name.txt"
}
TAILN=14 step tests_attention 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_attention.py
TAILN=10 step attn_ab 90 python3 scripts/attn_ab.py $OUT/attn_ab.json
python3 -m gradsweep.cli keygen -o /tmp/ab.pem --force > /dev/null 2>&1
TAILN=16 step bench_attention 90 python3 -m gradsweep.cli bench manifests/h200.yaml --op attention --family cuda \
  -o /tmp/bench_attention.json --key /tmp/ab.pem --force
left=$(( ${BUDGET:-400} - ($(date +%s) - t0) ))
if [ $left -gt 40 ]; then
  TAILN=10 step tests_cuda $(( left - 5 )) python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py \
    tests/test_cuda_stage_copy.py tests/test_cuda_build.py tests/test_cuda_rl.py
fi
echo "done in $(( $(date +%s) - t0 )) s"
