"""A bench case as data: which op, at which shape and token lengths, which phase is timed, against what.

Cases are declared in ``gradsweep.bench.catalog`` (one module per op family); the suite selects them by the
manifest's ops and profiles. Every number a case reports is named by a metric (``metric_names``); the targets
file refers to cases and metrics by these names, so a target for a metric a case cannot produce is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from gradsweep.families import KERNEL_FAMILIES

Phase = Literal["fwd", "bwd", "fwd_bwd"]
Grads = Literal["all", "inputs", "params"]
Split = Literal["rows", "chunks", "none"]

# Phases as measured: "fwd" runs the forward under no_grad (inference); "bwd" is derived as the forward +
# backward step minus the forward that records the graph (both measured the same way); "fwd_bwd" is one step.
MEASURED: dict[str, tuple[str, ...]] = {"fwd": ("fwd",), "bwd": ("fwd_train", "fwd_bwd"), "fwd_bwd": ("fwd_bwd",)}
STOCK = "stock"
FAMILY_BASE = ("e2e_vs_kernels", "host_vs_e2e")  # host_vs_e2e: host issue time / e2e (~1: host-bound)
SCALAR_METRICS = ("copy_fraction", "copy_fraction_kernels", "gemm_fraction", "peak_extra_gib", "host_us")


@dataclass(frozen=True)
class Case:
    """One timed measurement of one op.

    ``shape`` is the op's shape (validated by the op's own shape model); ``lengths`` the token counts of the
    step's samples (one packed call: the layout a trainer uses). ``grads`` says which gradients the backward
    computes: ``inputs`` freezes the parameters (dX alone), ``params`` the inputs (dW alone).
    ``baselines`` are timed in the same run: ``stock`` is the op's declared stock path, other names are the
    reference paths of ``gradsweep.bench.baselines`` (``gemm``: one cuBLAS lm_head GEMM; ``sdpa``: batched
    flash SDPA; ``fp32_wgrad``: cuBLAS dW added into an FP32 main grad). ``anchors`` are third-party kernels,
    timed when installed.
    ``split`` is the timed-data bitwise check: ``rows`` computes the first token alone and the rest as
    another batch, ``chunks`` cuts every sample in two calls inside a canonical tile (backward in reverse
    call order); both must give the timed step's bits. ``check_shape`` is the shape of the contract check
    (None: ``shape``); a vocabulary-wide parameter is checked at a smaller vocabulary, since drawing it on the
    host would take longer than the whole bench (the sweep's release evidence covers the full shape).
    ``runner`` is ``op`` (the op's candidates through its declaration, as the sweep calls them) or the name
    of a custom runner in the catalog (attention decode, fold planning).
    """

    op: str
    name: str
    title: str
    shape: dict[str, Any]
    lengths: tuple[int, ...]
    phase: Phase
    grads: Grads = "all"
    baselines: tuple[str, ...] = (STOCK,)
    anchors: tuple[str, ...] = ()
    traffic: Callable[[dict[str, Any], int], float] | None = None
    flops: Callable[[dict[str, Any], int], float] | None = None
    memory: bool = False
    split: Split = "chunks"
    check_shape: dict[str, Any] | None = None
    check_layouts: tuple[str, ...] = ("b1_singleton", "bn_chunked")
    runner: str = "op"
    families: tuple[str, ...] = KERNEL_FAMILIES
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.op}/{self.name}"

    @property
    def tokens(self) -> int:
        return int(sum(self.lengths))

    @property
    def host_only(self) -> bool:
        """A case that times host work alone (no device figure, no baseline)."""
        return self.runner == "fold_plan"

    def references(self) -> tuple[str, ...]:
        """Everything a family is compared with: the baselines, then the anchors."""
        return (*self.baselines, *self.anchors)

    def metric_names(self) -> tuple[str, ...]:
        """Every metric this case can report for a family (what a target may name)."""
        if self.host_only:
            return ("host_us",)
        names = [f"{kind}_vs_{ref}" for ref in self.references() for kind in ("e2e", "kernels")]
        names += list(FAMILY_BASE)
        if self.traffic is not None:
            names += ["copy_fraction", "copy_fraction_kernels"]
        if self.flops is not None:
            names.append("gemm_fraction")
        if self.memory:
            names.append("peak_extra_gib")
        return tuple(names)

    def traffic_bytes(self) -> float | None:
        return None if self.traffic is None else float(self.traffic(self.shape, self.tokens))

    def flop_count(self) -> float | None:
        return None if self.flops is None else float(self.flops(self.shape, self.tokens))


def irregular(total: int, pieces: int, seed: int = 5) -> tuple[int, ...]:
    """``pieces`` sample lengths summing to ``total``, irregular (a deterministic function of the seed), the
    way a trainer's packed step holds samples of different lengths."""
    if pieces <= 1 or total <= pieces:
        return (total,)
    weights = [1 + ((seed * 7919 + 104729 * (i + 1)) % 97) for i in range(pieces)]
    scale = total / sum(weights)
    lengths = [max(1, int(w * scale)) for w in weights]
    lengths[-1] += total - sum(lengths)
    while lengths[-1] < 1:  # the floor of 1 overdrew: take it back from the longest sample
        longest = lengths.index(max(lengths[:-1]))
        lengths[longest] -= 1
        lengths[-1] += 1
    return tuple(lengths)
