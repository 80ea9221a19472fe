#!/usr/bin/env bash
# A closeout STATE folder rebuilt from committed signed files, for when .devtmp/ did not survive: the signed files of
# evidence/ that are fresh for this checkout go in under the names h200_closeout.sh gives them, so a closeout call on
# it skips the sweep and every bench group (and drift) already signed for this tree, and runs the rest. With PARKED
# (a folder scripts/park_resign.sh wrote: a re-sign that one session could not finish), its fresh files are taken
# first, and its partial sweep log(s) too (the sweep resumes them: their header pins the tree, the builds and the GPU
# model, so a log from another tree, build or card is refused by the sweep itself).
# The py3.12 `_C` / `_fold_plan` the files pin must be given (built from this tree with the reproducible setup.py:
# the closeout refuses nothing, but a state whose builds differ from the sweep's would sign bench files against
# other bytes than the sweep's, so their hashes are checked here against the sweep's provenance, else the partial
# log's header).
#   [PARKED=notes/wip/resign] bash scripts/state_from_evidence.sh .devtmp/stateN BUILD_DIR   (BUILD_DIR: the two .so)
set -euo pipefail
d=${1:?STATE folder to create}; build=${2:?folder with the py3.12 _C and _fold_plan builds}
parked=${PARKED:-}
[ -e "$d" ] && { echo "$d exists: give a fresh folder" >&2; exit 2; }
[ -z "$parked" ] || [ -d "$parked" ] || { echo "PARKED=$parked is not a folder" >&2; exit 2; }
fresh() { python3 -m gradsweep.cli verify "$1" --allow-other-build > /dev/null 2>&1; }
# the file whose pins the builds must match, each file verified once: the parked sweep where fresh, else the
# committed one where fresh, else a parked partial log's header, else the committed sweep
pins=evidence/h200.evidence.json
if [ -n "$parked" ] && [ -f "$parked/h200.evidence.json" ] && fresh "$parked/h200.evidence.json"; then
  pins=$parked/h200.evidence.json
elif [ -n "$parked" ] && [ -f "$parked/h200.evidence.json.partial.jsonl" ] && ! fresh evidence/h200.evidence.json; then
  pins=$parked/h200.evidence.json.partial.jsonl
fi
want() {  # the sha256 a build must have ("extension" or "planner"), from $pins
  python3 - "$1" "$pins" <<'PY'
import base64, json, sys
kind, pins = sys.argv[1:]
if pins.endswith(".partial.jsonl"):
    print(json.loads(open(pins).readline())["header"].get(f"{kind}_sha256") or "")
else:
    p = json.loads(base64.b64decode(json.load(open(pins))["payload"]))["predicate"]
    print((p[kind] or {}).get("sha256", ""))
PY
}
mkdir -p "$d"
for kind in extension:_C planner:_fold_plan; do
  so=$(ls "$build"/${kind#*:}.cpython-312-*.so)
  have=$(sha256sum "$so" | cut -d' ' -f1); pinned=$(want "${kind%%:*}")
  if [ "$have" != "$pinned" ]; then echo "$so is ${have:0:12}, the evidence pins ${pinned:0:12}" >&2; rm -rf "$d"; exit 1; fi
  cp "$so" "$d"/
done
take() {  # take FILE DIR...: the first DIR whose FILE (a signed file) is fresh
  local file=$1; shift
  for dir in "$@"; do
    [ -n "$dir" ] && [ -f "$dir/$file" ] && fresh "$dir/$file" || continue
    echo "$dir"; return 0
  done
  return 1
}
if src=$(take h200.evidence.json ${parked:+"$parked"} evidence); then
  for f in h200.evidence.json h200.test-result.json h200.md h200.table.txt; do
    [ -f "$src/$f" ] && cp "$src/$f" "$d"/
  done
  echo "sweep: fresh in $src, taken as done"
elif [ -n "$parked" ] && [ -f "$parked/h200.evidence.json.partial.jsonl" ]; then
  cp "$parked"/h200*.partial.jsonl "$d"/
  echo "sweep: $(( $(wc -l < "$parked/h200.evidence.json.partial.jsonl") - 1 )) cell(s) parked, the closeout resumes"
else
  echo "sweep: stale, the closeout will run it"
fi
names=$(for f in ${parked:+"$parked"/h200.bench-*.evidence.json} evidence/bench/h200.bench-*.evidence.json; do
  [ -f "$f" ] && basename "$f" .evidence.json; done | sort -u)
for name in $names; do
  if src=$(take "$name.evidence.json" ${parked:+"$parked"} evidence/bench); then
    cp "$src/$name".{evidence.json,md,png} "$d"/ && echo "$name: fresh in $src, taken as done"
  else echo "$name: stale, the closeout will run it"; fi
done
if src=$(take drift.evidence.json ${parked:+"$parked/drift"} evidence/drift); then
  mkdir -p "$d/drift" && cp -a "$src"/. "$d/drift"/ && echo "drift: fresh in $src"
else echo "drift: stale, the closeout will run it"; fi
