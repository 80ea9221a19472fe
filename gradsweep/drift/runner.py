"""One role of a drift pair: the Qwen3 chain of one kernel family, forward only, over one layout's calls.

Every value is the same in every role: weights are drawn once per plan from the seed, token ids and targets
are the workload's ``in:ids`` / ``in:targets`` streams (pure functions of logical identity, as in the chain
cell), and every boundary is restored to logical token order. A role either captures every boundary, or
re-runs with one boundary's rows replaced by another run's tensor (the dlogp attribution).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gradsweep.drift.boundaries import CHAIN_OPS, Boundary, BoundaryHooks, CallRows, chain_boundaries
from gradsweep.layouts import Call
from gradsweep.nn.context import ChainContext
from gradsweep.nn.qwen3 import LAYERED, WEIGHTS, Qwen3Decoder, Qwen3Shape
from gradsweep.workload import Workload, stream_key


@dataclass
class ChainSetup:
    """What every role of a plan shares: shape, workload, weights (bf16 on the device), device."""

    shape: Qwen3Shape
    workload: Workload
    weights: dict[str, Tensor]
    device: torch.device
    boundaries: list[Boundary] = field(default_factory=list)
    ids: Tensor | None = None  # token ids / targets of every logical token (the workload's streams)
    targets: Tensor | None = None

    def __post_init__(self) -> None:
        if not self.boundaries:
            self.boundaries = chain_boundaries(self.shape.layers)
        rows = self.workload.logical_rows()
        self.ids = self.workload.indices("in:ids", rows, self.shape.vocab, self.device)
        self.targets = self.workload.indices("in:targets", rows, self.shape.vocab, self.device)

    def call_inputs(self, call: Call, rows: CallRows) -> tuple[Tensor, Tensor]:
        """A call's ids and targets: gathered from the logical ones, or drawn for rows that include pads."""
        if rows.all_real:
            return self.ids.index_select(0, rows.target), self.targets.index_select(0, rows.target)
        w, v = self.workload, self.shape.vocab
        return w.indices("in:ids", call.rows, v, self.device), w.indices("in:targets", call.rows, v, self.device)


def draw_weights(shape: Qwen3Shape, seed: int, device: torch.device) -> dict[str, Tensor]:
    """bf16 weights from (seed, weight name), drawn on ``device`` (a 151936 x 4096 table in milliseconds, not the
    seconds a host draw takes); the same for every role of a plan. Draws on CPU and GPU differ: a drift run
    compares roles with each other, never with a run on another device."""
    out = {}
    for w in WEIGHTS:
        gen = torch.Generator(device=device).manual_seed(stream_key(seed, f"drift:weight:{w.name}"))
        u = torch.rand(w.full_shape(shape), generator=gen, dtype=torch.float32, device=device)
        out[w.name] = (w.offset + w.scale(shape) * ((u * 2 - 1) * 3.0 ** 0.5)).to(torch.bfloat16)
    return out


def missing_kernels(family: str) -> dict[str, str]:
    """Chain ops the family has no kernel for, with the reason (stock torch has every op)."""
    if family == "torch":
        return {}
    from gradsweep.nn.kernels import kernel_module

    missing = {}
    for op in CHAIN_OPS:
        try:
            kernel_module(family, op)
        except (ModuleNotFoundError, ImportError, RuntimeError) as exc:
            missing[op] = str(exc).splitlines()[0]
    return missing


@dataclass
class RoleRun:
    """Logical boundary tensors of one role (``logp`` among them) and how long the forward took."""

    family: str
    layout: str
    calls: int
    tensors: dict[str, Tensor]
    seconds: float

    @property
    def logp(self) -> Tensor:
        return self.tensors["logp"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_role(setup: ChainSetup, family: str, layout: str, calls: Sequence[Call], capture: bool = True,
             substitute: tuple[str, Tensor] | None = None,
             weights: Mapping[str, Tensor] | None = None) -> RoleRun:
    """Forward the chain over ``calls`` (no gradients); capture every boundary, or only logp when ``capture`` is off.

    ``weights`` overrides the setup's (the FP32 stock baseline runs on the same bf16 values upcast).
    """
    s, w = setup.shape, setup.workload
    model = Qwen3Decoder(s, family, dict(weights if weights is not None else setup.weights))
    ctx = ChainContext(w.lengths, setup.device, None, LAYERED, s.layers,
                       mode="ordinary" if family == "torch" else "auto")
    hooks = BoundaryHooks(model, setup.boundaries, w.num_tokens, capture, substitute)
    logp = torch.zeros(w.num_tokens, dtype=torch.float32, device=setup.device)
    _sync(setup.device)
    started = time.perf_counter()
    try:
        with torch.no_grad():
            for call in calls:
                rows = CallRows(w.logical_index(call.rows), setup.device)
                ctx.begin_call(call.rows)
                hooks.begin_call(rows)
                ids, targets = setup.call_inputs(call, rows)
                rows.scatter_into(logp, model(ids, targets, ctx).float())
    finally:
        hooks.remove()
    _sync(setup.device)
    tensors = dict(hooks.tensors) if capture else {}
    tensors["logp"] = logp
    if capture:
        short = {n: c for n, c in hooks.seen.items() if c != w.num_tokens}
        if short or len(hooks.tensors) != len(setup.boundaries):
            missing = [b.name for b in setup.boundaries if b.name not in hooks.tensors]
            raise RuntimeError(f"drift: boundaries not seen once per token: {short or missing}")
    return RoleRun(family, layout, len(calls), tensors, time.perf_counter() - started)
