"""The workload manifest: ops, backend profiles, physical layouts, samples, candidates (pydantic v2).

Strict (unknown keys are refused), versioned (``manifest_version``) and exportable as JSON Schema.
Every error names the field, the bad value and what is allowed.

Version 2: a profile names its family and lists only its exceptions (``missing_required``, ``skipped``,
``optional``, or another implementation); every other op of the manifest runs ``<family>.<op>``, the
candidate the op declares for each kernel module its family ships (``gradsweep.families``). Version 1 files
still load unchanged: their profiles list every candidate, and an op a profile omits is undeclared.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gradsweep.contract import load_contract
from gradsweep.env_policy import check_profile_env
from gradsweep.families import KERNEL_PACKAGES, Family, impl_id
from gradsweep.results import CellKey

MANIFEST_VERSION = 2  # what new manifests declare
MANIFEST_VERSIONS = (1, 2)  # what this gradsweep reads
MANIFEST_DIR = Path(__file__).resolve().parent.parent / "manifests"
DEFAULT_MANIFEST = MANIFEST_DIR / "default.yaml"
ALLOW_PLUGINS = "allow_plugins"  # validation-context key: import the manifest's plugin modules


class ManifestError(ValueError):
    """A manifest that cannot be used; ``str()`` is one line naming the field and the fix."""


class CandidateStatus(str, Enum):
    """How a profile declares its candidate for an op."""

    REQUIRED = "required"
    OPTIONAL = "optional"
    SKIPPED = "skipped"
    MISSING_REQUIRED = "missing_required"


class CandidateDecl(BaseModel):
    """One profile's implementation of one op (``impl`` is an id from that op's registry entry)."""

    model_config = ConfigDict(extra="forbid")
    impl: str | None = None
    status: CandidateStatus = CandidateStatus.REQUIRED
    reason: str = ""
    tracking: str = ""

    @model_validator(mode="after")
    def _impl_when_runnable(self) -> CandidateDecl:
        runnable = self.status in (CandidateStatus.REQUIRED, CandidateStatus.OPTIONAL)
        if runnable and not self.impl:
            raise ValueError(f"a {self.status.value} candidate needs 'impl' (an implementation id); "
                             "declare status: missing_required with a reason if none exists")
        if not runnable and not self.reason:
            raise ValueError(f"status {self.status.value} needs a 'reason'")
        return self


class ProfileSpec(BaseModel):
    """A backend family and the candidates it declares."""

    model_config = ConfigDict(extra="forbid")
    family: Family
    device: Literal["cpu", "cuda", "auto"] = "auto"
    requires: list[Literal["cuda", "cuda-sm90", "triton", "triton-interpret", "cuda-ext"]] = Field(
        default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="set in the worker before any import; only "
                                "allowlisted names (TRITON_*, CUDA_*, GRADSWEEP_*, ...: gradsweep.env_policy)")
    release_evidence: bool = Field(True, description="false for CI-only views such as triton_interpret")
    deterministic_logp: bool = Field(False, description="advertises same-backend, same-build deterministic logp: "
                                     "gradsweep drift re-runs this profile's roles and checks the bits")
    candidates: dict[str, CandidateDecl] = Field(
        default_factory=dict, description="manifest_version 2: only the exceptions (every other op runs "
        "'<family>.<op>'); version 1: every op's candidate (an op left out is undeclared)")

    @field_validator("env")
    @classmethod
    def _env_is_data(cls, env: dict[str, str]) -> dict[str, str]:
        check_profile_env(env)
        return env


class SampleSpec(BaseModel):
    """The logical samples: irregular lengths, a per-token active-loss probability."""

    model_config = ConfigDict(extra="forbid")
    lengths: list[PositiveInt] = Field(min_length=1)
    active_fraction: float = Field(0.85, gt=0.0, le=1.0)


class LayoutSpec(BaseModel):
    """Parameters of one physical layout (only the ones that layout uses)."""

    model_config = ConfigDict(extra="forbid")
    chunks: list[list[PositiveInt]] | None = Field(None, description="bn_chunked: chunk sizes per sample")
    order: list[int] | None = Field(None, description="bn_permuted: sample order (default: seeded)")
    filler_lengths: list[PositiveInt] | None = Field(
        None, description="bn_mask_density: lengths of fully loss-masked filler samples interleaved")
    groups: list[list[int]] | None = Field(
        None, description="bn_neighbors: samples of each call (every sample once; default: seeded regrouping)")
    prefix: list[int] | None = Field(
        None, description="prefix_cache: prefix length per sample, written by the first call (default: seeded)")


class OpEntry(BaseModel):
    """An op in the sweep, with its shape (validated by the op's own shape model)."""

    model_config = ConfigDict(extra="forbid")
    shape: dict[str, Any] = Field(default_factory=dict)
    layouts: list[str] | None = Field(None, description="restrict to these layouts")


class Manifest(BaseModel):
    """A sweep: which cells exist and how each is run."""

    model_config = ConfigDict(extra="forbid")
    manifest_version: Literal[1, 2]
    name: str = Field(min_length=1)
    contract: str = Field("contract.yaml", description="contract file, relative to the manifest")
    seed: int = 0
    cell_timeout_s: PositiveInt = 900
    reruns: PositiveInt = Field(1, description="how many times the reference layout is re-run to detect "
                                               "nondeterminism (sweep/check --reruns overrides it)")
    plugins: list[str] = Field(default_factory=list, description="extra op modules to register (tests); "
                               "imported only when the command is given --allow-plugins")
    samples: SampleSpec
    layouts: dict[str, LayoutSpec]
    ops: dict[str, OpEntry]
    profiles: dict[str, ProfileSpec]

    _source: Path | None = PrivateAttr(None)

    @property
    def source_path(self) -> Path:
        if self._source is None:
            raise ManifestError("manifest was not loaded from a file")
        return self._source

    @property
    def contract_path(self) -> Path:
        base = self._source.parent if self._source is not None else MANIFEST_DIR
        return (base / self.contract).resolve()

    @property
    def contract_version(self) -> str:
        """The version of the contract file (ValueError, one line, when it cannot be read)."""
        return str(load_contract(self.contract_path).version)

    @model_validator(mode="after")
    def _cross_check(self, info: ValidationInfo) -> Manifest:
        from gradsweep.layouts import LAYOUT_NAMES, validate_layout
        from gradsweep.ops.registry import get_op, load_plugins, op_names

        if self.plugins:
            if not (info.context or {}).get(ALLOW_PLUGINS):
                raise ValueError(f"plugins: this manifest imports code ({', '.join(self.plugins)}); pass "
                                 "--allow-plugins to allow it")
            load_plugins(self.plugins)
        for name, spec in self.layouts.items():
            if name not in LAYOUT_NAMES:
                raise ValueError(f"layouts: unknown layout {name!r}; allowed: {', '.join(LAYOUT_NAMES)}")
            validate_layout(name, spec, self.samples.lengths)
        for op_name, entry in self.ops.items():
            if op_name not in op_names():
                raise ValueError(f"ops: unknown op {op_name!r}; allowed: {', '.join(op_names())}")
            op = get_op(op_name)
            try:
                entry.shape = op.shape_model.model_validate(entry.shape).model_dump(exclude_none=True)
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(p) for p in err["loc"])
                raise ValueError(f"ops.{op_name}.shape.{loc}: {err['msg']}") from None
            for lay in entry.layouts or []:
                if lay not in self.layouts:
                    raise ValueError(f"ops.{op_name}.layouts: {lay!r} is not a layout of this manifest")
        for prof_name, prof in self.profiles.items():
            for op_name, decl in prof.candidates.items():
                if op_name not in self.ops:
                    raise ValueError(f"profiles.{prof_name}.candidates: {op_name!r} is not an op of this "
                                     f"manifest; add it under ops or remove the declaration")
                if decl.impl is None:
                    continue
                cands = get_op(op_name).candidates
                if decl.impl not in cands:
                    raise ValueError(f"profiles.{prof_name}.candidates.{op_name}.impl: unknown implementation "
                                     f"{decl.impl!r}; allowed: {', '.join(sorted(cands))}")
                family = cands[decl.impl].family
                if family != prof.family:
                    raise ValueError(f"profiles.{prof_name}.candidates.{op_name}.impl: {decl.impl!r} belongs "
                                     f"to the {family!r} family but the profile is {prof.family!r}: a profile "
                                     "never borrows another family's implementation")
        if self.manifest_version >= 2:
            for prof_name, prof in self.profiles.items():
                for op_name in self.ops:
                    if op_name not in prof.candidates:
                        prof.candidates[op_name] = family_candidate(prof_name, prof.family, op_name)
        return self

    def layouts_for(self, op_name: str) -> list[str]:
        """The manifest's layouts that apply to an op, in manifest order."""
        from gradsweep.ops.registry import get_op

        op = get_op(op_name)
        chosen = self.ops[op_name].layouts
        return [lay for lay in self.layouts
                if lay in op.layouts and (chosen is None or lay in chosen)]

    def cells(self) -> list[CellKey]:
        """Every op x profile x layout cell, in deterministic (manifest) order."""
        return [CellKey(op=op, profile=prof, layout=lay)
                for prof in self.profiles for op in self.ops for lay in self.layouts_for(op)]

    def shape(self, op_name: str) -> dict[str, Any]:
        return dict(self.ops[op_name].shape)


def family_candidate(profile: str, family: Family, op_name: str) -> CandidateDecl:
    """A version-2 profile's candidate for an op it does not list: its family's ``<family>.<op>``, required."""
    from gradsweep.ops.registry import get_op

    impl = impl_id(family, op_name)
    if impl not in get_op(op_name).candidates:
        where = f" (no gradsweep/{KERNEL_PACKAGES[family]}/ module of {op_name})" if family in KERNEL_PACKAGES else ""
        raise ValueError(f"profiles.{profile}.candidates.{op_name}: op {op_name} has no {impl!r} implementation"
                         f"{where}; declare the exception, e.g. {{status: missing_required, reason: ...}}")
    return CandidateDecl(impl=impl)


def _format_error(path: Path, exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    bad = err.get("input")
    shown = "" if isinstance(bad, (dict, list)) or bad is None else f" (got {bad!r})"
    where = f"field '{loc}': " if loc else ""
    return f"manifest {path}: {where}{msg}{shown}"


def load_manifest(path: str | Path, allow_plugins: bool = False) -> Manifest:
    """Read, validate and cross-check a manifest file; its plugins are imported only if ``allow_plugins``."""
    path = Path(path)
    try:
        text = path.read_text()
    except IsADirectoryError:
        raise ManifestError(f"manifest {path}: is a directory; pass a YAML file") from None
    except OSError as exc:
        raise ManifestError(f"manifest {path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" at line {line + 1}" if line is not None else ""
        raise ManifestError(f"manifest {path}: malformed YAML{where}; fix the syntax") from None
    if not isinstance(data, dict):
        raise ManifestError(f"manifest {path}: top level must be a mapping with manifest_version, name, ...")
    if "manifest_version" in data and data["manifest_version"] not in MANIFEST_VERSIONS:
        raise ManifestError(f"manifest {path}: field 'manifest_version': {data['manifest_version']!r} is not "
                            f"supported; this gradsweep reads versions {', '.join(map(str, MANIFEST_VERSIONS))}")
    try:
        manifest = Manifest.model_validate(data, context={ALLOW_PLUGINS: allow_plugins})
    except ValidationError as exc:
        raise ManifestError(_format_error(path, exc)) from None
    manifest._source = path.resolve()
    return manifest
