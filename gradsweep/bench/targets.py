"""The speed targets: one versioned data file (manifests/bench_targets.yaml), never code.

Each entry names an op, one of its bench cases, a family (or every family), a metric the case reports and a
bound (``max`` for ratios and memory, ``min`` for fractions of a ceiling), with the issue that set it. Loading
checks every entry against the catalog: an unknown op, case, family or a metric the case cannot produce is a
one-line error naming the entry and the fix (exit 2), so a renamed case never leaves a target silently unread.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gradsweep.bench.cases import Case
from gradsweep.families import KERNEL_FAMILIES

TARGETS_VERSION = 1
DEFAULT_TARGETS = Path(__file__).resolve().parents[2] / "manifests" / "bench_targets.yaml"
FAMILY_NAMES = KERNEL_FAMILIES


class TargetsError(ValueError):
    """A targets file that cannot be used; ``str()`` is one line naming the entry, the field and the fix."""


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    op: str = Field(min_length=1)
    case: str = Field(min_length=1)
    metric: str = Field(min_length=1)
    family: str | None = Field(None, description="triton or cuda; omitted: every family of the case")
    max: float | None = Field(None, gt=0, description="the metric must be at most this (ratios, memory, time)")
    min: float | None = Field(None, gt=0, description="the metric must be at least this (fractions of a ceiling)")
    issue: str = Field(min_length=1, description="where the target was set, e.g. '12'")
    note: str = ""

    @model_validator(mode="after")
    def _one_bound(self) -> Target:
        if (self.max is None) == (self.min is None):
            raise ValueError("give exactly one of max or min")
        if self.family is not None and self.family not in FAMILY_NAMES:
            raise ValueError(f"family {self.family!r} is not one of {', '.join(FAMILY_NAMES)}")
        return self

    @property
    def bound(self) -> float:
        return float(self.max if self.max is not None else self.min)  # type: ignore[arg-type]

    @property
    def sense(self) -> str:
        return "max" if self.max is not None else "min"

    def describe(self) -> str:
        return f"{self.metric} {'<=' if self.sense == 'max' else '>='} {self.bound:g}"

    def met_by(self, value: float) -> bool:
        return value <= self.bound if self.sense == "max" else value >= self.bound

    def applies(self, op: str, case: str, family: str) -> bool:
        return self.op == op and self.case == case and (self.family is None or self.family == family)


class TargetsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(description="version of this file's content (bump when a target changes)")
    format: int = TARGETS_VERSION
    targets: list[Target] = Field(default_factory=list)


def _where(path: Path, exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"targets {path}: field '{loc}': {err['msg'].removeprefix('Value error, ')}"


def load_targets(path: Path, catalog: Iterable[Case]) -> TargetsFile:
    """Read and validate a targets file against the catalog's cases (every case of every op, full shapes)."""
    try:
        data = yaml.safe_load(path.read_text())
    except IsADirectoryError:
        raise TargetsError(f"targets {path}: is a directory; pass a YAML file") from None
    except OSError as exc:
        raise TargetsError(f"targets {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError:
        raise TargetsError(f"targets {path}: malformed YAML; fix the syntax") from None
    if not isinstance(data, dict):
        raise TargetsError(f"targets {path}: top level must be a mapping with version and targets")
    if data.get("format", TARGETS_VERSION) != TARGETS_VERSION:
        raise TargetsError(f"targets {path}: field 'format': {data.get('format')!r} is not supported; this "
                           f"gradsweep reads format {TARGETS_VERSION}")
    try:
        parsed = TargetsFile.model_validate(data)
    except ValidationError as exc:
        raise TargetsError(_where(path, exc)) from None
    cases = {c.id: c for c in catalog}
    ops = sorted({c.op for c in cases.values()})
    seen: set[tuple] = set()
    for i, t in enumerate(parsed.targets):
        where = f"targets {path}: targets.{i} ({t.op}/{t.case} {t.metric})"
        if t.op not in ops:
            raise TargetsError(f"{where}: unknown op {t.op!r}; ops with bench cases: {', '.join(ops)}")
        case = cases.get(f"{t.op}/{t.case}")
        if case is None:
            names = ", ".join(c.name for c in cases.values() if c.op == t.op)
            raise TargetsError(f"{where}: {t.op} has no bench case {t.case!r}; its cases: {names}")
        if t.family is not None and t.family not in case.families:
            raise TargetsError(f"{where}: family {t.family!r} does not run this case; it runs "
                               f"{', '.join(case.families)}")
        if t.metric not in case.metric_names():
            raise TargetsError(f"{where}: the case does not report {t.metric!r}; it reports "
                               f"{', '.join(case.metric_names())}")
        key = (t.op, t.case, t.metric, t.family)
        if key in seen:
            raise TargetsError(f"{where}: a second target for the same op, case, metric and family; keep one")
        seen.add(key)
    return parsed
