"""The harness: runs cells, restores layouts to logical identity, judges invariance and accuracy."""

from gradsweep.harness.cell import run_cell
from gradsweep.harness.execute import AdapterError, LayoutRun, MissingBackward, run_layout, run_reference
from gradsweep.harness.invariance import (
    ForwardInvarianceReport,
    GradientInvarianceReport,
    InvarianceError,
    LayoutConfig,
    assert_forward_batch_invariant,
    assert_gradient_batch_invariant,
)

__all__ = [
    "AdapterError", "ForwardInvarianceReport", "GradientInvarianceReport", "InvarianceError", "LayoutConfig",
    "LayoutRun", "MissingBackward", "assert_forward_batch_invariant", "assert_gradient_batch_invariant",
    "run_cell", "run_layout", "run_reference",
]
