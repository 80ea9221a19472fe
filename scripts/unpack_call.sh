#!/usr/bin/env bash
# Unpack a closeout call's OUT (the run tool's files_at) into .devtmp/stateN, the folder the next call carries
# (`scripts/closeout_call.sh .devtmp/stateN ...`, carry [".whl", ".keys", ".devtmp/stateN"]); print its summary.
# Do it at once: a warm device machine is kept only ~30 s after a call.
#   bash scripts/unpack_call.sh /work/.device/3 4
set -eu
src=$1; n=$2
d=.devtmp/state$n
rm -rf "$d"; mkdir -p "$d"
tar -xzf "$src/state.tar.gz" -C "$d"
# the call hands its Triton cache back only when it packs to 15 MiB or less; otherwise the previous state's goes on
prev=.devtmp/state$((n - 1))
if [ -f "$src/triton-cache.tar.gz" ]; then cp "$src/triton-cache.tar.gz" "$d"/
elif [ -f "$prev/triton-cache.tar.gz" ]; then cp "$prev/triton-cache.tar.gz" "$d"/; echo "triton cache: $prev's"; fi
tail -20 "$d/summary.txt"
du -sh "$d"
