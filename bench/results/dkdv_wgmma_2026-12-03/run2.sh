#!/bin/bash
# A/B of the wgmma dK/dV fold with cp.async Q/dO tiles (side cpasync, 7421a6b) against TMA-fed whole tiles (side tma).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $HOME/site .whl/*.whl
export PYTHONPATH=$HOME/site PYTHONUNBUFFERED=1
python3 scripts/ab_builds.py $OUT --side cpasync=.devtmp/ab/c --side tma=.devtmp/ab/d \
  --op attention --family cuda --case fwd_bwd --tests tests/test_cuda_attention.py --rounds 1 2>&1 | tail -40
