"""How an op is declared as data (OpInfo style): inputs, parameters, outputs, reference, candidates.

The harness drives every op through these declarations alone; it never special-cases an op.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt, model_validator

from gradsweep.canonical import CanonicalFold, RowIdentity, device_positions
from gradsweep.families import STOCK_FAMILY, Family, impl_id, kernel_families, kernel_module
from gradsweep.layouts import LAYOUT_NAMES, Call

Shape = dict[str, Any]
ROW_LAYOUTS: tuple[str, ...] = LAYOUT_NAMES


class HeadsShape(BaseModel):
    """Shape of a per-head op: heads x head_dim, checked against hidden when that is given too."""

    model_config = ConfigDict(extra="forbid")
    heads: PositiveInt = 3
    head_dim: PositiveInt = 32
    hidden: PositiveInt | None = None

    @model_validator(mode="after")
    def _hidden_matches(self) -> HeadsShape:
        if self.hidden is not None and self.hidden != self.heads * self.head_dim:
            raise ValueError(f"hidden {self.hidden} != heads {self.heads} x head_dim {self.head_dim}; "
                             "make head_dim = hidden / heads")
        return self


def head_feature(shape: Shape) -> tuple[int, ...]:
    """Per-row shape [heads, head_dim] of a per-head tensor."""
    return (shape["heads"], shape["head_dim"])


@dataclass(frozen=True)
class TokenInput:
    """A per-token input; ``feature(shape)`` is its per-row shape; ``grad`` names its gradient."""

    name: str
    feature: Callable[[Shape], tuple[int, ...]]
    grad: str | None = None
    scale: float = 1.0
    index_high: Callable[[Shape], int] | None = None  # integer inputs (token ids, targets)

    @property
    def is_index(self) -> bool:
        return self.index_high is not None


@dataclass(frozen=True)
class ParamSpec:
    """A parameter shared by every token; drawn from (seed, name): value = offset + scale * u."""

    name: str
    shape: Callable[[Shape], tuple[int, ...]]
    grad: str
    scale: Callable[[Shape], float] = lambda s: 1.0
    offset: float = 0.0


@dataclass(frozen=True)
class OutputSpec:
    """A per-token output (its upstream gradient is drawn from logical identity).

    ``dtype`` is the dtype every candidate must return: the harness draws the upstream gradient in it,
    so candidates, the stock baselines and the FP64 reference all consume the same values.
    ``upstream``: ``"drawn"`` (values x loss mask / active-token denominator), or, for a per-token loss term
    (feature ``()``), the harness's loss reduction itself: ``"token_mean"`` (mask / active-token denominator)
    or ``"sequence_mean"`` (mask / (samples with an active token x the sample's active tokens)).
    """

    name: str
    feature: Callable[[Shape], tuple[int, ...]]
    dtype: torch.dtype = torch.bfloat16
    upstream: Literal["drawn", "token_mean", "sequence_mean"] = "drawn"


@dataclass
class CallContext:
    """What a candidate sees for one call: physical rows, parameters, folds, cross-call state."""

    call: Call
    inputs: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]
    folds: dict[str, CanonicalFold]
    state: dict[str, Any]
    shape: Shape
    lengths: tuple[int, ...]

    @property
    def rows(self) -> RowIdentity:
        return self.call.rows

    def fold(self, param: str) -> CanonicalFold | None:
        return self.folds.get(param)


@dataclass
class CallOutput:
    """A candidate's outputs; ``rows`` is their identity when it differs from the call's rows."""

    tensors: dict[str, torch.Tensor]
    rows: RowIdentity | None = None


@dataclass(frozen=True)
class Candidate:
    """One implementation of an op, belonging to one backend family.

    ``param_grads='fold'``: the kernel folds parameter gradients into FP32 main-grad buffers by the
    canonical protocol (``fold_tiles()`` gives each parameter's tile); ``'autograd'``: they land
    in ``param.grad`` as stock torch does.
    """

    impl_id: str
    family: Family
    run: Callable[[CallContext], CallOutput]
    param_grads: Literal["autograd", "fold"] = "autograd"
    fold_tiles: Callable[[], dict[str, int]] = field(default=lambda: {})
    # Input gradients a kernel folds across calls itself (attention's dK/dV over queries): after the
    # layout's backward, ``folded_input_grads(state)`` returns them in logical token order by name.
    folded_input_grads: Callable[[dict[str, Any]], dict[str, torch.Tensor]] | None = None


@dataclass(frozen=True)
class OpSpec:
    """An op as data."""

    name: str
    description: str
    shape_model: type[BaseModel]
    inputs: tuple[TokenInput, ...]
    params: tuple[ParamSpec, ...]
    outputs: tuple[OutputSpec, ...]
    reference: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor], Shape, RowIdentity],
                        dict[str, torch.Tensor]]
    # The op's stock PyTorch path, declared once: the accuracy baseline (run in bf16, and in FP32 with TF32
    # off for outputs a candidate accumulates in FP32) and the ``torch.<op>`` candidate. Never a kernel.
    stock: Callable[[CallContext], CallOutput]
    candidates: dict[str, Candidate]
    layouts: tuple[str, ...] = ROW_LAYOUTS
    differentiable: bool = True
    padded_input: bool = False
    backward_scope: Literal["call", "layout"] = "call"

    def __post_init__(self) -> None:
        stock_id = impl_id(STOCK_FAMILY, self.name)
        if stock_id not in self.candidates:  # the status-quo candidate always exists and is the stock path
            self.candidates[stock_id] = Candidate(stock_id, STOCK_FAMILY, self.stock)
        elif self.candidates[stock_id].run is not self.stock:
            raise ValueError(f"op {self.name}: candidate {stock_id} must be the op's declared stock path")

    def gradient_names(self) -> list[str]:
        return [i.grad for i in self.inputs if i.grad] + [p.grad for p in self.params]

    def output(self, name: str) -> OutputSpec:
        return next(o for o in self.outputs if o.name == name)


def kernel_candidates(op: str, module: str, run: Callable[[ModuleType, CallContext], CallOutput],
                      fold_params: tuple[str, ...] = ()) -> dict[str, Candidate]:
    """``<family>.<op>`` for every kernel family that ships ``module`` (their APIs are identical).

    The families follow from the files (``gradsweep.families.kernel_families``): adding a family's kernel
    module declares its candidate; nothing is imported until a candidate runs.
    """
    out = {}
    for fam in kernel_families(module):
        def _run(ctx: CallContext, _fam: Family = fam) -> CallOutput:
            return run(kernel_module(_fam, module), ctx)

        def _tiles(_fam: Family = fam) -> dict[str, int]:
            return {p: int(kernel_module(_fam, module).TILE) for p in fold_params}

        out[impl_id(fam, op)] = Candidate(impl_id(fam, op), fam, _run,
                                          param_grads="fold" if fold_params else "autograd", fold_tiles=_tiles)
    return out


def positions_on(ctx: CallContext, device: torch.device) -> torch.Tensor:
    """Absolute positions of the call's rows, from logical identity (never the physical row index)."""
    return device_positions(ctx.rows, device)
