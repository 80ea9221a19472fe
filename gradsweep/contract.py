"""The tolerance contract (C1): one versioned file, one resolver, no tolerance anywhere else.

Invariance always resolves to bitwise. Accuracy resolves to a ratio rule against the op's stock path,
per accumulation class: an output a candidate stores in bf16 is bounded by stock bf16 torch's error; an
output it accumulates and stores in FP32 (main grads, logp) by the error of stock FP32 math on the same
bf16 values (TF32 off). The contract records which outputs of which candidate family are FP32-class.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gradsweep.families import Family


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
    """Invariance: raw bits equal (NaN-aware); never a tolerance."""

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


AccumulationClass = Literal["bf16", "fp32"]


class _AccuracyRuleEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: CheckKind | None = None
    op: str | None = None
    tensor: str | None = None
    dtype: str | None = None
    profile: str | None = None
    accumulation: AccumulationClass | None = None
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
        return sum(v is not None for v in (self.kind, self.op, self.tensor, self.dtype, self.profile,
                                           self.accumulation))


class _Fp32Output(BaseModel):
    """An output that candidates of these families accumulate and store in FP32."""

    model_config = ConfigDict(extra="forbid")
    op: str
    tensor: str
    families: list[Family] = Field(min_length=1)


class _AccuracySection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default: RatioRule
    rules: list[_AccuracyRuleEntry] = Field(default_factory=list)


class _AccumulationSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fp32: list[_Fp32Output] = Field(default_factory=list)


class Contract(BaseModel):
    """A loaded contract; ``resolve`` is the single source of every threshold."""

    model_config = ConfigDict(extra="forbid")
    contract_version: str
    invariance: _InvarianceSection
    accuracy: _AccuracySection
    accumulation: _AccumulationSection = Field(default_factory=_AccumulationSection)

    def accumulation_class(self, op: str, tensor: str, family: str) -> AccumulationClass:
        """'fp32' when candidates of ``family`` accumulate and store ``op``'s ``tensor`` in FP32, else 'bf16'."""
        hit = any(e.op == op and e.tensor == tensor and family in e.families for e in self.accumulation.fp32)
        return "fp32" if hit else "bf16"

    @property
    def version(self) -> str:
        return self.contract_version

    def resolve(self, kind: CheckKind, op: str, tensor: str, dtype: str, profile: str,
                accumulation: AccumulationClass = "bf16") -> BitwiseRule | RatioRule:
        """The rule for one check; invariance is always bitwise."""
        if kind.is_invariance:
            return BitwiseRule()
        query = {"kind": kind, "op": op, "tensor": tensor, "dtype": dtype, "profile": profile,
                 "accumulation": accumulation}
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
