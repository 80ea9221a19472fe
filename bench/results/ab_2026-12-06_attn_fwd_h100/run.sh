#!/usr/bin/env bash
# One device call: the two waiting patches (CUDA piece copy, wgmma attention forward) applied to the carried tree with
# their combined py3.12 builds (v1: K / V blocks by cp.async; v2: whole blocks by TMA); their GPU tests and A/Bs.
# A diagnostic: nothing here is signed evidence.
set -u
t0=$(date +%s)
D=.devtmp/abx
export PYTHONPATH=$HOME/site:$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $HOME/site .whl/*.whl
patch -p1 -s < $D/piece.patch && patch -p1 -s < $D/attn.patch || { echo "patch failed"; exit 1; }
cp $D/_fold_plan.cpython-*.so gradsweep/
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv,noheader
step() {  # step NAME SECONDS CMD...
  local name=$1 lim=$2; shift 2
  timeout -k 5 "$lim" "$@" > "$OUT/$name.txt" 2>&1
  echo "== $name rc=$? at $(( $(date +%s) - t0 )) s"; tail -${TAILN:-8} "$OUT/$name.txt"
}
use() { cp $D/$1/_C.cpython-*.so gradsweep/; echo "-- build $1: $(sha256sum gradsweep/_C.cpython-*.so | cut -c1-12)"; }
use v1
TAILN=12 step v1_tests_attention 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_attention.py
TAILN=6 step v1_attn_fwd_ab 80 python3 scripts/attn_fwd_ab.py $OUT/v1_attn_fwd_ab.json
use v2
TAILN=6 step v2_tests_wgmma 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_attention.py -k "wgmma or decode_narrow"
TAILN=6 step v2_attn_fwd_ab 80 python3 scripts/attn_fwd_ab.py $OUT/v2_attn_fwd_ab.json
TAILN=8 step tests_stage_copy 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_stage_copy.py tests/test_cuda_build.py
TAILN=8 step stage_copy_ab 90 python3 scripts/stage_copy_ab.py $OUT/stage_copy_ab.json
best=$(python3 - "$OUT" <<'PY'
import json, sys
t = {}
for v in ("v1", "v2"):
    try:
        rows = json.load(open(f"{sys.argv[1]}/{v}_attn_fwd_ab.json"))["results"]
        t[v] = rows[0]["path2_us"] if all(r["bits_equal"] for r in rows) else float("inf")
    except Exception:
        t[v] = float("inf")
print(min(t, key=t.get))
PY
)
use $best
python3 -m gradsweep.cli keygen -o /tmp/ab.pem --force > /dev/null 2>&1
left=$(( ${BUDGET:-560} - ($(date +%s) - t0) ))
if [ $left -gt 60 ]; then
  TAILN=30 step bench_attention_$best $(( left - 10 )) python3 -m gradsweep.cli bench manifests/h200.yaml --op attention \
    --family cuda -o $OUT/bench_attention.json --key /tmp/ab.pem --force
fi
echo "done in $(( $(date +%s) - t0 )) s"
