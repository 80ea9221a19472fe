#!/usr/bin/env bash
# One device call on a Hopper box (the lent H200): build csrc/, GPU tests (the CUDA family's checks go through
# check_kernel there), release sweep, verify, report.
# Usage (repo root, on the GPU machine): bash scripts/h200_release.sh OUTDIR KEY [SWEEP ARGS...]
#   KEY: the release signing key (PEM), kept out of git: e.g. .keys/h200-release.pem (.keys/ is ignored;
#   carry it to the device explicitly). Its public key must have an entry in evidence/trust.yaml allowing
#   manifest h200 for the evidence to verify by default (see docs/evidence.md, "Adding a key").
# Writes at most 8 files into OUTDIR (the device tool returns no more): build.log, gpu_tests.log, sweep.log,
# h200.evidence.json, h200.test-result.json, h200.md.
# With several GPUs visible the sweep places one worker on each (docs/sharding.md).
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
python3 -m pytest -q -m gpu tests/ 2>&1 | tee "$out/gpu_tests.log" | tail -15; echo "gpu tests rc=${PIPESTATUS[0]}"
python3 -m gradsweep.cli sweep manifests/h200.yaml -o "$out/h200.evidence.json" --key "$key" --no-progress "$@" \
  > "$out/sweep.log" 2>&1; echo "sweep rc=$?"
tail -60 "$out/sweep.log"
python3 -m gradsweep.cli verify "$out/h200.evidence.json" --trusted-key "$pub"; echo "verify rc=$?"
python3 -m gradsweep.cli report "$out/h200.evidence.json" --format md -o "$out/h200.md" --trusted-key "$pub"
echo "report rc=$?"
