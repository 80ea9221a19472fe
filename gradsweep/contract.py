"""The tolerance contract (C1): one versioned file, one resolver, no tolerance anywhere else.

Invariance always resolves to bitwise; accuracy resolves to a ratio rule against stock bf16 torch.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class CheckKind(str, Enum):
    FORWARD_ACCURACY = "forward_accuracy"
    GRADIENT_ACCURACY = "gradient_accuracy"
    FORWARD_INVARIANCE = "forward_invariance"
    GRADIENT_INVARIANCE = "gradient_invariance"

    @property
    def is_invariance(self) -> bool:
        return self in (CheckKind.FORWARD_INVARIANCE, CheckKind.GRADIENT_INVARIANCE)


class ContractError(ValueError):
    """A contract file that cannot be used; the message names the field and the fix."""


class BitwiseRule(BaseModel):
    """Invariance: raw bits equal (NaN-aware); atol = rtol = 0."""

    model_config = ConfigDict(frozen=True)
    rule: str = "bitwise"


class RatioRule(BaseModel):
    """Accuracy: error <= k * stock_error + floor."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    k: float = Field(ge=1.0)
    floor: float = Field(ge=0.0)

    def bound(self, stock_error: float) -> float:
        return self.k * stock_error + self.floor


class _InvarianceSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rule: str

    @field_validator("rule")
    @classmethod
    def _only_bitwise(cls, value: str) -> str:
        if value != "bitwise":
            raise ValueError(f"invariance.rule must be 'bitwise' (got {value!r}): invariance never takes a "
                             "tolerance; move any tolerance to an accuracy rule")
        return value


class _AccuracyRuleEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: CheckKind | None = None
    op: str | None = None
    tensor: str | None = None
    dtype: str | None = None
    profile: str | None = None
    k: float = Field(ge=1.0)
    floor: float = Field(ge=0.0)

    @field_validator("kind")
    @classmethod
    def _accuracy_only(cls, value: CheckKind | None) -> CheckKind | None:
        if value is not None and value.is_invariance:
            raise ValueError(f"a tolerance on an invariance check ({value.value}) is not allowed: "
                             "invariance is bitwise; use forward_accuracy or gradient_accuracy")
        return value

    def specificity(self) -> int:
        return sum(v is not None for v in (self.kind, self.op, self.tensor, self.dtype, self.profile))


class _AccuracySection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default: RatioRule
    rules: list[_AccuracyRuleEntry] = Field(default_factory=list)


class Contract(BaseModel):
    """A loaded contract; ``resolve`` is the single source of every threshold."""

    model_config = ConfigDict(extra="forbid")
    contract_version: str
    invariance: _InvarianceSection
    accuracy: _AccuracySection

    @property
    def version(self) -> str:
        return self.contract_version

    def resolve(self, kind: CheckKind, op: str, tensor: str, dtype: str, profile: str
                ) -> BitwiseRule | RatioRule:
        """The rule for one check; invariance is always bitwise."""
        if kind.is_invariance:
            return BitwiseRule()
        query = {"kind": kind, "op": op, "tensor": tensor, "dtype": dtype, "profile": profile}
        matches = [r for r in self.accuracy.rules
                   if all(getattr(r, f) is None or getattr(r, f) == v for f, v in query.items())]
        if not matches:
            return self.accuracy.default
        best = max(matches, key=_AccuracyRuleEntry.specificity)
        return RatioRule(k=best.k, floor=best.floor)


def load_contract(path: str | Path) -> Contract:
    """Read and validate a contract file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ContractError(f"contract {path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ContractError(f"contract {path}: malformed YAML ({exc})") from exc
    try:
        return Contract.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ContractError(f"contract {path}: field '{loc}': {err['msg']}") from exc
