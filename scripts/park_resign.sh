#!/usr/bin/env bash
# Park an unfinished re-sign for a later session: the signed files and the partial sweep log(s) of a closeout STATE
# (what scripts/unpack_call.sh unpacked) are copied into a committed folder, because .devtmp/ (ignored) does not
# always reach the next session's checkout. The next session applies the same patches to the same main (the same
# tree digest), builds the same py3.12 extension (setup.py is reproducible) and rebuilds its state with
#   PARKED=notes/wip/resign bash scripts/state_from_evidence.sh .devtmp/stateN BUILD_DIR
# which keeps every parked file that verifies fresh for that checkout and the partial log (the sweep resumes it only
# for the same tree, builds and GPU model). Files signed with a key that did not survive stay valid: the key is in
# evidence/trust.yaml.
#   bash scripts/park_resign.sh STATE [DEST]    (DEST: notes/wip/resign; emptied first)
set -euo pipefail
state=${1:?closeout STATE folder}; dest=${2:-notes/wip/resign}
[ -d "$state" ] || { echo "$state is not a folder" >&2; exit 2; }
rm -rf "$dest" && mkdir -p "$dest"
n=0
for f in "$state"/h200.evidence.json "$state"/h200.test-result.json "$state"/h200.md "$state"/h200.table.txt \
         "$state"/h200.verify.txt "$state"/h200.sweep.log "$state"/h200*.partial.jsonl "$state"/h200.shard-*.json \
         "$state"/h200.bench-*.evidence.json "$state"/h200.bench-*.md "$state"/h200.bench-*.png "$state"/summary.txt; do
  [ -f "$f" ] && cp "$f" "$dest"/ && n=$((n + 1))
done
[ -d "$state/drift" ] && cp -a "$state/drift" "$dest"/ && n=$((n + 1))
tree=$(python3 -c "from pathlib import Path; from gradsweep.evidence.source_digest import tree_digest; print(tree_digest(Path('.')).sha256)")
{ echo "# A parked re-sign (scripts/park_resign.sh, $(date -u +%FT%TZ)): tree $tree"
  echo "# main at $(git rev-parse --short HEAD); the patches applied on it (git status):"
  git status --short -- csrc gradsweep | sed 's/^/#   /'
  for so in "$state"/_C.cpython-*.so "$state"/_fold_plan.cpython-*.so; do
    [ -f "$so" ] && echo "# $(basename "$so") sha256 $(sha256sum "$so" | cut -c1-16)"
  done; } > "$dest/PARKED.txt"
echo "parked $n file(s) in $dest ($(du -sh "$dest" | cut -f1)); commit them with the patches' notes"
