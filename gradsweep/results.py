"""The result of one cell (op x profile x layout): its status, why, and per-tensor metrics.

These models are what workers return, what evidence stores and what reports read.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


class Status(str, Enum):
    """Classification of one cell; see DESIGN.md."""

    GREEN = "green"
    RED_VERDICT = "red_verdict"
    RED_NO_BACKWARD = "red_no_backward"
    BLOCKED_HARDWARE = "blocked_hardware"
    BLOCKED_C2 = "blocked_c2"
    SKIPPED = "skipped"
    ERROR = "error"

    @property
    def is_red(self) -> bool:
        return self in (Status.RED_VERDICT, Status.RED_NO_BACKWARD)

    @property
    def is_blocked(self) -> bool:
        return self in (Status.BLOCKED_HARDWARE, Status.BLOCKED_C2)


class CellKey(BaseModel):
    """Identity of a cell; ``id`` is its stable string form ``op/profile/layout``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    op: str
    profile: str
    layout: str

    @property
    def id(self) -> str:
        return f"{self.op}/{self.profile}/{self.layout}"

    @staticmethod
    def parse(text: str) -> CellKey:
        parts = text.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"cell id must be op/profile/layout, got {text!r}")
        return CellKey(op=parts[0], profile=parts[1], layout=parts[2])


class TensorMetrics(BaseModel):
    """Comparison of one named tensor (an output or a gradient) in one cell."""

    model_config = ConfigDict(extra="forbid")
    name: str
    kind: str = Field(description="'forward' or 'gradient'")
    invariance_check: str = Field(description="what this tensor was compared with bitwise")
    bitwise_equal: bool | None = None
    mismatched_elements: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    accuracy_error: float | None = Field(None, description="normwise relative error vs FP64 reference")
    stock_error: float | None = Field(None, description="the stock path's error vs the same reference, in the "
                                      "tensor's accumulation class (bf16, or FP32 math with TF32 off)")
    accuracy_bound: float | None = None
    accuracy_ok: bool | None = None
    accuracy_class: str | None = Field(None, description="'bf16', 'fp32' (accumulated and stored in FP32) or "
                                       "'baseline' (the stock path itself on the reference layout: not judged)")


class CellResult(BaseModel):
    """Everything a sweep records about one cell."""

    model_config = ConfigDict(extra="forbid")
    key: CellKey
    status: Status
    reason: str = ""
    candidate: str | None = None
    first_failure: str | None = Field(None, description="first failing tensor and check")
    tensors: list[TensorMetrics] = Field(default_factory=list)
    shape: dict[str, int | float | list[int]] = Field(default_factory=dict)
    duration_s: float = 0.0
