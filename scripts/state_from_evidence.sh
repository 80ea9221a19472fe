#!/usr/bin/env bash
# A closeout STATE folder rebuilt from the committed evidence, for when .devtmp/ did not survive: the signed files
# of evidence/ that are fresh for this checkout go in under the names h200_closeout.sh gives them, so a closeout
# call on it skips the sweep and every bench group (and drift) already signed for this tree, and runs the rest.
# The py3.12 `_C` / `_fold_plan` the evidence pins must be given (built from this tree with the reproducible
# setup.py: the closeout refuses nothing, but a state whose builds differ from the sweep's would sign bench files
# against other bytes than the sweep's, so their hashes are checked here against the sweep's provenance).
#   bash scripts/state_from_evidence.sh .devtmp/stateN BUILD_DIR   (BUILD_DIR holding the two py3.12 .so files)
set -euo pipefail
d=${1:?STATE folder to create}; build=${2:?folder with the py3.12 _C and _fold_plan builds}
[ -e "$d" ] && { echo "$d exists: give a fresh folder" >&2; exit 2; }
fresh() { python3 -m gradsweep.cli verify "$1" --allow-other-build > /dev/null 2>&1; }
want() {  # the sha256 prefix the sweep's provenance pins for a build ("extension" or "planner")
  python3 - "$1" <<'PY'
import base64, json, sys
p = json.loads(base64.b64decode(json.load(open("evidence/h200.evidence.json"))["payload"]))["predicate"]
print((p[sys.argv[1]] or {}).get("sha256", ""))
PY
}
mkdir -p "$d"
for kind in extension:_C planner:_fold_plan; do
  so=$(ls "$build"/${kind#*:}.cpython-312-*.so)
  have=$(sha256sum "$so" | cut -d' ' -f1); pinned=$(want "${kind%%:*}")
  if [ "$have" != "$pinned" ]; then echo "$so is ${have:0:12}, the evidence pins ${pinned:0:12}" >&2; rm -rf "$d"; exit 1; fi
  cp "$so" "$d"/
done
if fresh evidence/h200.evidence.json; then
  cp evidence/h200.evidence.json evidence/h200.test-result.json evidence/h200.md evidence/h200.table.txt "$d"/
  echo "sweep: fresh, taken as done"
else
  echo "sweep: stale, the closeout will run it"
fi
for f in evidence/bench/h200.bench-*.evidence.json; do
  name=$(basename "$f" .evidence.json)
  if fresh "$f"; then cp "evidence/bench/$name".{evidence.json,md,png} "$d"/ && echo "$name: fresh, taken as done"
  else echo "$name: stale, the closeout will run it"; fi
done
if fresh evidence/drift/drift.evidence.json; then mkdir -p "$d/drift" && cp -a evidence/drift/. "$d/drift"/ && echo "drift: fresh"
else echo "drift: stale, the closeout will run it"; fi
