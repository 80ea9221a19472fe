"""The numbers a bench case runs on, drawn on the device from the op's own declarations.

Speed does not depend on which values flow, so a case draws them with a seeded device generator (seconds
faster than the sweep's host-hashed workload for vocabulary-wide tables); the contract check draws its own
through the harness. When one call's data fits in L2, the case gets several copies and the timed loop rotates
over them, so a kernel never reads its operands from a warm cache that a trainer's step would not have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gradsweep.ops.base import OpSpec, Shape

L2_BYTES = 60 * 2**20  # H200 (50 MiB on H100): the rotation sizes for the larger one
MAX_COPIES = 8


@dataclass
class OpData:
    """One copy of a step's data: logical-row inputs, parameters, upstream gradients, FP32 main grads."""

    inputs: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]
    upstream: dict[str, torch.Tensor]
    main_grads: dict[str, torch.Tensor]

    def nbytes(self) -> int:
        tensors = [*self.inputs.values(), *self.params.values()]
        return int(sum(t.numel() * t.element_size() for t in tensors))


def _gen(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def draw(op: OpSpec, shape: Shape, tokens: int, device: torch.device, seed: int) -> OpData:
    """Inputs [tokens, *feature] in bf16 (ids in [0, high)), parameters offset + scale * U(-sqrt3, sqrt3) in
    bf16, upstream gradients in each output's declared dtype, and zeroed FP32 main grads."""
    gen = _gen(device, seed)
    inputs: dict[str, torch.Tensor] = {}
    for spec in op.inputs:
        if spec.is_index:
            high = int(spec.index_high(shape))  # type: ignore[misc]
            inputs[spec.name] = torch.randint(0, high, (tokens,), generator=gen, device=device)
        else:
            x = torch.randn((tokens, *spec.feature(shape)), generator=gen, device=device)
            inputs[spec.name] = x.mul_(spec.scale).to(torch.bfloat16)
    params: dict[str, torch.Tensor] = {}
    for p in op.params:
        u = torch.rand(p.shape(shape), generator=gen, device=device).mul_(2).sub_(1)
        params[p.name] = u.mul_(math.sqrt(3) * p.scale(shape)).add_(p.offset).to(torch.bfloat16)
    upstream: dict[str, torch.Tensor] = {}
    for out in op.outputs:
        g = torch.randn((tokens, *out.feature(shape)), generator=gen, device=device)
        if out.upstream != "drawn":  # a loss term: its upstream is the loss reduction's weight
            g = g.abs_().div_(max(tokens, 1))
        upstream[out.name] = g.to(out.dtype)
    main_grads = {p.name: torch.zeros(p.shape(shape), dtype=torch.float32, device=device) for p in op.params}
    return OpData(inputs, params, upstream, main_grads)


def copies_for(one_copy_bytes: int, device: torch.device) -> int:
    """How many copies the timed loop rotates over: enough that a sweep over them exceeds twice the L2."""
    if device.type != "cuda" or one_copy_bytes <= 0:
        return 1
    return max(1, min(MAX_COPIES, math.ceil(2 * L2_BYTES / one_copy_bytes)))


def rotated(op: OpSpec, shape: Shape, tokens: int, device: torch.device, seed: int) -> list[OpData]:
    """The copies a case's timed loop rotates over (the first is the one the checks use)."""
    first = draw(op, shape, tokens, device, seed)
    count = copies_for(first.nbytes(), device)
    return [first] + [draw(op, shape, tokens, device, seed + 1000 * i) for i in range(1, count)]
