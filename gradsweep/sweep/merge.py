"""Merge shard evidence into one signed evidence equal to the unsharded sweep's.

Refuses (BadInput) shards that do not verify, come from different manifests, trees, contracts,
filters, reruns, tracked-reds lists or extension builds, repeat or miss a shard, or repeat or miss a
cell; and an output that is one of the shards, the key, or evidence of another manifest (without
--force).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from securesystemslib.signer import Signer

from gradsweep.errors import BadInput
from gradsweep.evidence.predicate import Predicate
from gradsweep.evidence.result_statement import result_statement_path
from gradsweep.evidence.trust import Signer as TrustedSigner
from gradsweep.evidence.verify import EvidenceError, check_signature
from gradsweep.sweep.assemble import assemble_predicate
from gradsweep.sweep.outputs import check_not_input, check_replace_evidence, check_writable
from gradsweep.sweep.shard import cells_digest, parse_shard


def _same(preds: list[tuple[Path, Predicate]], what: str, get: Callable[[Predicate], Any]) -> None:
    first_path, first = preds[0]
    for path, pred in preds[1:]:
        if get(pred) != get(first):
            raise BadInput(f"merge: {path} and {first_path} differ in {what}; "
                           "shards must come from one sweep")


def _check_shards(preds: list[tuple[Path, Predicate]]) -> list[str]:
    seen: dict[str, Path] = {}
    count = None
    for path, pred in preds:
        if not pred.selection.shards:
            raise BadInput(f"merge: {path} is not a shard (it was not run with --shard)")
        for spec in pred.selection.shards:
            shard = parse_shard(spec)
            if count is not None and shard.count != count:
                raise BadInput(f"merge: {path} is shard {spec} but other shards are of {count}")
            count = shard.count
            if spec in seen:
                raise BadInput(f"merge: shard {spec} given twice ({seen[spec]} and {path})")
            seen[spec] = path
    assert count is not None
    missing = [f"{k}/{count}" for k in range(1, count + 1) if f"{k}/{count}" not in seen]
    if missing:
        raise BadInput(f"merge: missing shard(s) {', '.join(missing)}")
    return sorted(seen, key=lambda s: parse_shard(s).index)


def merge_shards(paths: list[Path], trusted: list[TrustedSigner], signer: Signer, out: Path,
                 strict: bool = False, force: bool = False, key_path: Path | None = None) -> Predicate:
    """Verify each shard, check they add up to exactly one sweep, write re-signed merged evidence."""
    from gradsweep.sweep.api import write_evidence

    if not paths:
        raise BadInput("merge: give the shard evidence files")
    check_writable(out)
    inputs: dict[str, Path | None] = {f"shard {p}": p for p in paths}
    inputs["signing key"] = key_path
    check_not_input({"output": out, "test result": result_statement_path(out)}, inputs)
    preds: list[tuple[Path, Predicate]] = []
    for path in paths:
        try:
            pred, _ = check_signature(path, trusted)
        except EvidenceError as exc:
            raise BadInput(f"merge: {exc}") from None
        preds.append((path, pred))
    _same(preds, "manifest", lambda p: p.manifest)
    _same(preds, "source tree", lambda p: p.source)
    _same(preds, "contract", lambda p: p.contract)
    _same(preds, "filters", lambda p: (p.selection.ops, p.selection.profiles, p.selection.layouts,
                                       p.selection.cells_total, p.selection.cells_digest))
    _same(preds, "reruns", lambda p: p.selection.reruns)
    _same(preds, "tracked reds", lambda p: (p.tracked_file, p.tracked_sha256, p.tracked_entries))
    _same(preds, "built extension (build it once and share it, or run shards without one)",
          lambda p: (p.extension.sha256 if p.extension else None))
    _same(preds, "compiled fold planner (build it once and share it)",
          lambda p: (p.planner.sha256 if p.planner else None))
    _same(preds, "evidence format", lambda p: p.schema_version)
    check_replace_evidence(out, preds[0][1].manifest.name, force)
    shards = _check_shards(preds)
    owner: dict[str, Path] = {}
    results = []
    for path, pred in preds:
        for rec in pred.cells:
            cid = rec.result.key.id
            if cid in owner:
                raise BadInput(f"merge: cell {cid} appears in both {owner[cid]} and {path}")
            owner[cid] = path
            results.append(rec.result)
    first = preds[0][1]
    if len(results) != first.selection.cells_total or \
            cells_digest([r.key for r in results]) != first.selection.cells_digest:
        raise BadInput(f"merge: the shards hold {len(results)} cells, the sweep has "
                       f"{first.selection.cells_total}; cells are missing or foreign")
    selection = first.selection.model_copy(update={"shards": shards})
    runs = [run for _, pred in preds for run in pred.runs]
    runs.sort(key=lambda r: parse_shard(r.shard).index if r.shard else 0)
    merged = assemble_predicate(manifest=first.manifest, contract=first.contract, source=first.source,
                                selection=selection, runs=runs, results=results,
                                tracked=first.tracked_entries, tracked_file=first.tracked_file,
                                tracked_sha256=first.tracked_sha256, extension=first.extension,
                                planner=first.planner, strict=strict)
    write_evidence(out, merged, signer)
    return merged
