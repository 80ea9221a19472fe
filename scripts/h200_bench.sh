#!/usr/bin/env bash
# One device call on a Hopper box (the lent H200): build csrc/, run `gradsweep bench` on the release manifest,
# verify the signed bench evidence, render it as markdown.
# Usage (repo root, on the GPU machine): bash scripts/h200_bench.sh OUTDIR KEY [BENCH ARGS...]
#   KEY: the release signing key (PEM), kept out of git (e.g. .keys/h200-release.pem, carried explicitly).
#   BENCH ARGS: e.g. --quick (a minute: the machinery on tiny shapes), or --op det_gemm --op linear_logp.
#   Wheels in .whl/ (e.g. liger-kernel, for the anchors) are installed first when present.
# Writes into OUTDIR (at most 5 files, the device tool returns 8): build.log, bench.log, h200.bench.evidence.json,
# h200.bench.png, h200.bench.md.
set -uo pipefail
out=${1:?OUTDIR}; key=${2:?signing key}; shift 2
pub="${key%.pem}.pub.pem"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:$PWD"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$HOME/site" .whl/*.whl \
    && export PYTHONPATH="$HOME/site:$PYTHONPATH"
fi
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  time python3 setup.py build_ext --inplace
} > "$out/build.log" 2>&1
tail -3 "$out/build.log"
start=$(date +%s)
python3 -m gradsweep.cli bench manifests/h200.yaml -o "$out/h200.bench.evidence.json" --chart "$out/h200.bench.png" \
  --key "$key" "$@" > "$out/bench.log" 2>&1
rc=$?
echo "bench rc=$rc in $(( $(date +%s) - start )) s"
tail -80 "$out/bench.log"
python3 -m gradsweep.cli verify "$out/h200.bench.evidence.json" --trusted-key "$pub"; echo "verify rc=$?"
python3 -m gradsweep.cli report "$out/h200.bench.evidence.json" --format md -o "$out/h200.bench.md" --trusted-key "$pub"
echo "report rc=$?"
exit $rc
