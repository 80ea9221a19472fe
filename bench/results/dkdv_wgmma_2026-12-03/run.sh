#!/bin/bash
# A/B of the mma.sync dK/dV fold (side mma = the signed build) against the wgmma fold (side wgmma).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $HOME/site .whl/*.whl
export PYTHONPATH=$HOME/site PYTHONUNBUFFERED=1
python3 scripts/ab_builds.py $OUT --side mma=.devtmp/ab/a --side wgmma=.devtmp/ab/b --side overlap=.devtmp/ab/c \
  --op attention --family cuda --case fwd_bwd --tests tests/test_cuda_attention.py --rounds 1 2>&1 | tail -60
