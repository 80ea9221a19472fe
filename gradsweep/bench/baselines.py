"""What a case is compared with, besides the op's stock path: reference paths and third-party anchors.

- ``gemm``: one cuBLAS lm_head GEMM (``hidden @ W.T``), the unit of the linear_logp targets.
- ``sdpa``: ``F.scaled_dot_product_attention`` on the whole batch with the flash backend, K/V expanded to the
  query heads beforehand (the attention targets' baseline; samples of equal length only).
- ``fp32_wgrad``: a linear layer whose backward accumulates dW into the FP32 main grad by one cuBLAS GEMM with
  beta = 1 (``addmm(G, dY^T, X, out_dtype=float32, out=G)``), dX by cuBLAS: what a trainer with FP32 main grads
  runs without gradsweep (Megatron's gradient-accumulation fusion). The stock path's bf16 ``dY^T X`` neither reads
  nor writes an FP32 main grad, so this is the fair ceiling of a canonical fold into one; shown beside the stock
  ratio, never a target's baseline in place of it.
- anchors, timed only when installed (recorded as absent otherwise, never an error): ``liger`` (Liger-Kernel:
  RMSNorm, SwiGLU, fused linear cross-entropy) and ``bio`` (Thinking Machines' batch_invariant_ops: the stock
  path run inside ``set_batch_invariant_mode()``, which swaps aten's mm / log_softmax / mean for its kernels).

A reference is a list of callables (one per data copy) and an optional context held around its timing.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import torch
import torch.nn.functional as F

from gradsweep.bench.backward_mark import backward_section
from gradsweep.bench.cases import Case
from gradsweep.bench.data import OpData

Fn = Callable[[], object]
ANCHORS: dict[str, tuple[str, str, str]] = {  # name -> (import module, distribution, how to install it)
    "liger": ("liger_kernel", "liger-kernel", "pip install liger-kernel"),
    "bio": ("batch_invariant_ops", "batch_invariant_ops",
            "pip install it from github.com/thinking-machines-lab/batch_invariant_ops"),
}


@dataclass
class Reference:
    """Callables of one reference path (one per data copy) and the context its timing runs inside."""

    calls: list[Fn]
    context: Callable[[], contextlib.AbstractContextManager[Any]] = field(default=contextlib.nullcontext)


@dataclass(frozen=True)
class AnchorStatus:
    installed: bool
    version: str | None
    reason: str


def anchor_status(name: str) -> AnchorStatus:
    """Whether an anchor's package is importable here, and its version (never imports it)."""
    module, dist, how = ANCHORS[name]
    if importlib.util.find_spec(module) is None:
        return AnchorStatus(False, None, f"{dist} is not installed ({how} to time it)")
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = None
    return AnchorStatus(True, version, "installed")


def function_step(forward: Callable[[dict[str, torch.Tensor]], list[torch.Tensor]], tensors: dict[str, torch.Tensor],
                  trainable: tuple[str, ...], upstream: list[torch.Tensor], mode: str) -> Fn:
    """A step of a plain torch function: ``fwd`` under no_grad, ``fwd_train`` recording the graph,
    ``fwd_bwd`` with the backward of the upstream gradients (leaves' grads reset each step)."""
    train = mode != "fwd"
    leaves = {n: t.detach().requires_grad_(train and n in trainable) for n, t in tensors.items()}

    def step() -> None:
        for t in leaves.values():
            t.grad = None
        with torch.set_grad_enabled(train):
            outs = forward(leaves)
            if mode == "fwd_bwd":
                with backward_section():
                    torch.autograd.backward(outs, upstream[: len(outs)])

    return step


# ------------------------------------------------------------------------------------------------ baselines
def _gemm(case: Case, data: OpData, mode: str) -> Fn:
    hidden, weight = data.inputs["hidden"], data.params["W"]
    return lambda: torch.mm(hidden, weight.t())  # one lm_head GEMM, whatever the phase


def _heads_4d(t: torch.Tensor, batch: int, seq: int) -> torch.Tensor:
    return t.view(batch, seq, t.shape[1], t.shape[2]).transpose(1, 2)


def _sdpa(case: Case, data: OpData, mode: str) -> Fn:
    lengths = case.lengths
    if len(set(lengths)) != 1:
        raise ValueError(f"{case.id}: the sdpa baseline needs samples of equal length, got {list(lengths)}")
    batch, seq = len(lengths), lengths[0]
    q, k, v = data.inputs["q"], data.inputs["k"], data.inputs["v"]
    group = q.shape[1] // k.shape[1]
    tensors = {"q": q, "k": k.repeat_interleave(group, dim=1), "v": v.repeat_interleave(group, dim=1)}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def forward(t: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(*(_heads_4d(t[n], batch, seq) for n in ("q", "k", "v")),
                                               is_causal=True)
        return [o.transpose(1, 2).reshape(q.shape)]

    return function_step(forward, tensors, ("q", "k", "v"), [data.upstream["o"]], mode)


class _Fp32Wgrad(torch.autograd.Function):
    """y = x @ W.T by cuBLAS; the backward's dW added into ``main_grad`` (FP32) by one GEMM with beta = 1."""

    @staticmethod
    def forward(ctx, x, weight, main_grad):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.main_grad = main_grad
        return torch.mm(x, weight.t())

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        dx = torch.mm(dy, weight) if ctx.needs_input_grad[0] else None
        if ctx.needs_input_grad[1]:
            g = ctx.main_grad
            if g.is_cuda:  # bf16 operands, FP32 accumulate and C: the one kernel a trainer runs
                torch.addmm(g, dy.t(), x, out_dtype=torch.float32, out=g)
            else:  # (CPU torch has no bf16 -> FP32 GEMM: the same sum on FP32 copies; a CPU run times nothing)
                g.addmm_(dy.t().float(), x.float())
        return dx, None, None


def _fp32_wgrad(case: Case, data: OpData, mode: str) -> Fn:
    if set(data.params) != {"W"} or len(data.inputs) != 1 or len(data.upstream) != 1:
        raise ValueError(f"{case.id}: the fp32_wgrad baseline needs a linear layer (one input, W, one output)")
    (x_name, x), = data.inputs.items()
    main_grad = torch.zeros_like(data.main_grads["W"])  # its own: the families' folds and checks use theirs

    def forward(t: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [_Fp32Wgrad.apply(t[x_name], t["W"], main_grad)]

    trainable = {"inputs": (x_name,), "params": ("W",)}.get(case.grads, (x_name, "W"))
    return function_step(forward, {x_name: x, "W": data.params["W"]}, trainable, list(data.upstream.values()), mode)


BASELINES: dict[str, Callable[[Case, OpData, str], Fn]] = {"gemm": _gemm, "sdpa": _sdpa, "fp32_wgrad": _fp32_wgrad}


# ------------------------------------------------------------------------------------------------ anchors
def _liger_step(case: Case, data: OpData, mode: str) -> Fn | None:
    i, p, up = data.inputs, data.params, data.upstream
    if case.op == "rms_norm":
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        eps = case.shape.get("eps", 1e-6)
        fn = function_step(lambda t: [LigerRMSNormFunction.apply(t["x"], t["weight"], eps, 0.0, "llama", False)],
                           {"x": i["x"], "weight": p["weight"]}, ("x", "weight"), [up["y"]], mode)
    elif case.op == "swiglu":
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        fn = function_step(lambda t: [LigerSiLUMulFunction.apply(t["gate"], t["up"])],
                           {"gate": i["gate"], "up": i["up"]}, ("gate", "up"), [up["y"]], mode)
    elif case.op == "linear_logp":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        loss_fn = LigerFusedLinearCrossEntropyLoss()

        def flce(t: dict[str, torch.Tensor]) -> list[torch.Tensor]:
            loss = loss_fn(t["W"], t["hidden"], i["targets"])
            return [loss[0] if isinstance(loss, tuple) else loss]

        fn = function_step(flce, {"hidden": i["hidden"], "W": p["W"]}, ("hidden", "W"),
                           [torch.ones((), device=i["hidden"].device)], mode)
    else:
        return None
    return fn


def _liger(case: Case, copies: list[OpData], mode: str, stock_steps: Callable[[str], list[Fn]]) -> Reference | None:
    steps = [_liger_step(case, d, mode) for d in copies]
    return None if any(s is None for s in steps) else Reference([s for s in steps if s is not None])


def _bio(case: Case, copies: list[OpData], mode: str, stock_steps: Callable[[str], list[Fn]]) -> Reference | None:
    from batch_invariant_ops import set_batch_invariant_mode

    return Reference(stock_steps(mode), context=set_batch_invariant_mode)


_ANCHOR_BUILDERS = {"liger": _liger, "bio": _bio}


def anchor_reference(name: str, case: Case, copies: list[OpData], mode: str,
                     stock_steps: Callable[[str], list[Fn]]) -> Reference | None:
    """The anchor's steps for this case and mode, one per data copy (None: nothing for this op)."""
    return _ANCHOR_BUILDERS[name](case, copies, mode, stock_steps)
