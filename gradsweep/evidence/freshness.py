"""Is evidence still about this checkout? Every input of a verdict is compared, one by one.

Inputs: the source tree (csrc/ and gradsweep/), the manifest, the contract, the tracked-reds file
(all by the repository-relative path the evidence records), the built CUDA extension and the compiled fold
planner. A changed, missing or unrecorded input makes the evidence stale. The two builds are per-machine build
products: each is compared only when this checkout has one built, and a difference is reported on its own
line ("extension differs", "fold planner differs") so a verifier on another machine can accept exactly that
difference (``--allow-other-build``) without accepting changed sources. See docs/evidence.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gradsweep.evidence.extension import extension_digest, planner_digest
from gradsweep.evidence.paths import is_external, resolve_recorded
from gradsweep.evidence.predicate import ExtensionRef, Predicate, SourceRef
from gradsweep.evidence.source_digest import file_sha256, tree_digest
from gradsweep.tracked_reds import TRACKED_FILE_NAME

SAME = "same"
DIFFERS = "differs"
MISSING = "missing"
NOT_RECORDED = "not recorded"
NOT_COMPARED = "not compared"
EXTENSION = "extension"
PLANNER = "fold planner"
BUILDS = (EXTENSION, PLANNER)  # the per-machine build products: what --allow-other-build accepts
_STALE = (DIFFERS, MISSING, NOT_RECORDED)


@dataclass(frozen=True)
class InputCheck:
    """One input of the verdicts: its state here versus the evidence, in words."""

    name: str
    state: str
    detail: str

    @property
    def stale(self) -> bool:
        return self.state in _STALE

    def line(self) -> str:
        return f"{self.name} {self.state}: {self.detail}" if self.detail else f"{self.name} {self.state}"


def file_check(name: str, recorded_path: str | None, recorded_sha: str | None, root: Path,
               run: str = "sweep") -> InputCheck:
    """A recorded input file (repository-relative path and digest) against the checkout at ``root``; ``run`` names
    what produced the evidence (sweep, bench) in the advice."""
    if recorded_path is None and recorded_sha is None:
        return InputCheck(name, NOT_COMPARED, "the run used none")
    if recorded_sha is None:
        return InputCheck(name, NOT_RECORDED, f"the evidence has no digest of {recorded_path}; rerun the {run}")
    if recorded_path is None or is_external(recorded_path):
        return InputCheck(name, NOT_COMPARED, f"{recorded_path or 'file'} was outside the repository when the "
                                              f"{run} ran")
    current = resolve_recorded(recorded_path, root)
    if current is None or not current.is_file():
        return InputCheck(name, MISSING, f"{recorded_path} is not in this checkout")
    digest = file_sha256(current)
    if digest != recorded_sha:
        return InputCheck(name, DIFFERS, f"{recorded_path} is {digest[:16]}, the evidence used {recorded_sha[:16]}")
    return InputCheck(name, SAME, recorded_path)


def source_check(source: SourceRef, root: Path) -> InputCheck:
    """The recorded source-tree digest against the checkout at ``root``."""
    current = tree_digest(root, tuple(source.roots)).sha256
    roots = "+".join(source.roots)
    if current != source.sha256:
        return InputCheck("source tree", DIFFERS, f"{roots} is {current[:16]}, the evidence is for "
                                                   f"{source.sha256[:16]}")
    return InputCheck("source tree", SAME, f"{roots} {current[:16]}")


def _build_check(name: str, rec: ExtensionRef | None, here: tuple[Path, str] | None, root: Path) -> InputCheck:
    """A recorded build product against this checkout's (compared only when one is built here)."""
    if here is None:
        if rec is None:
            return InputCheck(name, NOT_COMPARED, "not built for the run, not built here")
        return InputCheck(name, NOT_COMPARED, f"not built in this checkout (the run used {rec.sha256[:16]})")
    path, digest = here
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    if rec is None:
        return InputCheck(name, DIFFERS, f"this checkout has {rel} ({digest[:16]}); the run recorded no built "
                                         f"{name}")
    if digest != rec.sha256:
        return InputCheck(name, DIFFERS, f"{rel} is {digest[:16]}, the evidence measured {rec.path} "
                                         f"{rec.sha256[:16]} (a rebuild, another machine's build, or an edited "
                                         "binary)")
    return InputCheck(name, SAME, f"{rel} {digest[:16]}")


def extension_check(rec: ExtensionRef | None, root: Path) -> InputCheck:
    """The recorded CUDA extension build against this checkout's (compared only when one is built here)."""
    return _build_check(EXTENSION, rec, extension_digest(root), root)


def planner_check(rec: ExtensionRef | None, root: Path) -> InputCheck:
    """The recorded compiled fold planner against this checkout's (compared only when one is built here)."""
    return _build_check(PLANNER, rec, planner_digest(root), root)


def _tracked_check(pred: Predicate, root: Path) -> InputCheck:
    """A run without a tracked-reds file is stale once the default one beside the manifest appears."""
    if pred.tracked_file is None:
        manifest = resolve_recorded(pred.manifest.path, root)
        beside = manifest.parent / TRACKED_FILE_NAME if manifest is not None else None
        if beside is not None and beside.is_file():
            rel = beside.relative_to(root).as_posix()
            return InputCheck("tracked reds", DIFFERS, f"{rel} exists now; the run had no tracked-reds file")
    return file_check("tracked reds", pred.tracked_file, pred.tracked_sha256, root)


def check_inputs(pred: Predicate, root: Path) -> list[InputCheck]:
    """Compare every recorded input of ``pred`` with the checkout at ``root``."""
    checks = [source_check(pred.source, root),
              file_check("manifest", pred.manifest.path, pred.manifest.sha256, root)]
    if pred.schema_version < 2:
        old = "evidence format 1 records no digest of it; rerun the sweep"
        checks += [InputCheck("contract", NOT_RECORDED, old), InputCheck("tracked reds", NOT_RECORDED, old),
                   InputCheck(EXTENSION, NOT_RECORDED, old)]
        return checks
    checks.append(file_check("contract", pred.contract.path, pred.contract.sha256, root))
    checks.append(_tracked_check(pred, root))
    checks.append(extension_check(pred.extension, root))
    checks.append(planner_check(pred.planner, root))
    return checks


def stale_checks(checks: list[InputCheck], allow_other_build: bool = False) -> list[InputCheck]:
    """The checks that make the evidence stale (the extension's only unless another build is allowed)."""
    return [c for c in checks if c.stale and not (allow_other_build and c.name in BUILDS)]
