"""Batch-invariant causal attention with grouped-query heads in CUDA C++ (gradsweep._C): forward, dQ, and dK / dV
folded over canonical query tiles once the step's last backward has run. Same public API and semantics as
``gradsweep.triton_kernels.attention``.

Why each piece looks the way it does (kernels: csrc/attention*.cu, argument in csrc/attention.cuh):
- **Key blocks** of ``ATTN_BLOCK_N`` keys aligned to absolute position 0, folded in increasing order by an online
  softmax on mma.sync tensor cores. A row's max and sum over a block are taken by the four lanes that hold it
  in an order fixed by the block size alone, so the rows per program and the warps per CTA never reach a row's
  bits: prefill programs (128 rows on 8 warps forward, 64 rows on 4 warps dQ) and narrow programs (16 rows on one
  warp: decode steps and short tails; the narrow forward's other three warps only load keys) give the same bits
  for the same row (the GPU tests check it). A block after a row's
  position leaves its state exactly as it was (a select restores it).
- **Programs** hold consecutive tokens of one sample times the ``group`` query heads that share one K/V head
  (each K/V block is read once for the group). Plans (``_Plan``): a call's rows -> runs -> programs, in
  vectorised numpy once per ``RowIdentity`` object (every layer of a step reuses it); a call is then an O(samples)
  write check and launches.
- **Logical stores**: K / V (and Q, dO, lse, delta for the fold) live at token = sample start + position. A call
  that holds every token of the step in logical order is its own store (no copy); otherwise one scatter launch.
- **dK / dV**: once every token of the step has had its backward, one launch: a program per (64 keys, K/V head)
  loads the FP32 accumulator (the main grad, or zero), adds the canonical query tiles of its sample for each
  query head of the group in head order, stores it. Inputs are the logical stores, loop bounds follow the
  sample's length: any split into calls and any backward order give the same bits. No atomics.
- **FP32-class dK / dV** (``AttnConfig.fp32_grads``, default, the contract's class): P and dS enter the dV / dK
  products as hi + lo bf16 pairs and the fold's delta is rowsum(P * dP) summed in FP32 by the dQ kernel.
- **Hostile rows**: pads and fillers (sample < 0) are in no program and no store; keys past a program's last row
  (possibly unwritten slots) are never loaded; o and dq are stored through -0 -> +0 (a masked key adds 0 * v,
  whose sign depends on whether its slot was written yet).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from gradsweep import attention_host as host
from gradsweep.canonical import RowIdentity
from gradsweep.cuda_kernels import runtime as rt

LOG2E = host.LOG2E
TILE = 32           # canonical query tile of the dK / dV fold (csrc/attention.cuh kFoldTile; checked at launch)
MAX_HEAD_DIM = 128  # csrc/attention.cuh kMaxHeadDim: head_dim 1..128 (padded to 32, 64 or 128 columns)


@dataclass(frozen=True)
class AttnConfig:
    """What the host decides about a launch (block sizes are compiled in: csrc/attention.cuh).

    ``fp32_grads`` (default): dK / dV FP32-class (hi + lo bf16 operands, FP32 delta); off: bf16 operands as in
    FlashAttention (bf16-class). ``narrow``: programs of at most 16 rows (decode steps, short tails) run on the
    narrow kernels; off, every program runs on the wide kernels. Bits depend on ``fp32_grads`` only."""

    fp32_grads: bool = True
    narrow: bool = True


DEFAULT_CONFIG = AttnConfig()


@dataclass(frozen=True)
class _Geometry:
    """Sizes compiled into gradsweep._C (read once: plans depend on them)."""

    fwd_rows: int
    dq_rows: int
    narrow_rows: int
    fold_keys: int


def _geometry() -> _Geometry:
    """The compiled sizes (read per plan and per fold: both are rare)."""
    ext = rt.ext()
    if not hasattr(ext, "ATTN_FWD_ROWS"):
        raise RuntimeError("attention: gradsweep._C has no attention kernels; rebuild it "
                           "(python setup.py build_ext --inplace)")
    if int(ext.ATTN_FOLD_TILE) != TILE or int(ext.ATTN_MAX_HEAD_DIM) != MAX_HEAD_DIM:
        raise RuntimeError("attention: gradsweep._C was built from other sources; rebuild it "
                           "(python setup.py build_ext --inplace)")
    return _Geometry(int(ext.ATTN_FWD_ROWS), int(ext.ATTN_DQ_ROWS), int(ext.ATTN_NARROW_ROWS),
                     int(ext.ATTN_FOLD_KEYS))


def _upload(a: np.ndarray, cols: int, device: torch.device) -> torch.Tensor:
    """int32 table of ``cols`` columns to the device (done once per plan)."""
    return host.upload(np.asarray(a).reshape(-1, cols), device)


# ------------------------------------------------------------------------------------------------ plans
@dataclass(frozen=True)
class _Programs:
    """One kernel's programs for one call: int32 [n, 4] rows (first row, first token, first position, tokens)."""

    wide: torch.Tensor
    narrow: torch.Tensor


def _pack(group: int, narrow_rows: int) -> int:
    """Rows per token in a program: the group's query heads (they read the same keys), if a narrow program
    holds them; else one query head per program."""
    return group if group <= narrow_rows else 1


def _programs(row0: np.ndarray, tok0: np.ndarray, pos0: np.ndarray, n: np.ndarray, rows: int, narrow_rows: int,
              pack: int, narrow: bool, device: torch.device) -> _Programs:
    """Split runs into programs of rows // pack tokens; a piece of at most narrow_rows rows goes narrow."""
    table = host.chunk_runs(row0, tok0, pos0, n, rows // pack)
    cnt = table[:, 3]
    small = (cnt * pack <= narrow_rows) if narrow else np.zeros(len(cnt), dtype=bool)
    return _Programs(*host.program_tables(table, small, device))


@dataclass(frozen=True)
class _Plan:
    """Everything about one call's rows that does not depend on the data: runs, programs, scatter indices."""

    n_rows: int
    n_real: int
    has_pads: bool
    full: bool                 # the rows are every token of the step in logical order (the call is its own store)
    chain_sample: np.ndarray   # per sample of the call: its first position and the end of its last run
    chain_first: np.ndarray
    chain_end: np.ndarray
    pack: int
    fwd: _Programs
    dq: _Programs
    rows: torch.Tensor         # int32 [n_real]: physical row of each real row (run order)
    toks: torch.Tensor         # int32 [n_real]: its logical token


_PLANS: OrderedDict = OrderedDict()


def _build_plan(rows: RowIdentity, lengths: np.ndarray, starts: np.ndarray, cfg: AttnConfig, group: int,
                device: torch.device) -> _Plan:
    geo = _geometry()
    pack = _pack(group, geo.narrow_rows)
    sample = rows.sample.cpu().numpy().astype(np.int64)
    position = rows.position.cpu().numpy().astype(np.int64)
    r = host.runs(sample, position, lengths, starts)
    row_index, tok_index = r.scatter_index()
    return _Plan(len(sample), r.n_real, r.n_real < len(sample), r.full, *r.chain, pack,
                 _programs(r.first, r.tok0, r.p0, r.n, geo.fwd_rows, geo.narrow_rows, pack, cfg.narrow, device),
                 _programs(r.first, r.tok0, r.p0, r.n, geo.dq_rows, geo.narrow_rows, pack, cfg.narrow, device),
                 _upload(row_index, 1, device).view(-1), _upload(tok_index, 1, device).view(-1))


# ------------------------------------------------------------------------------------------------ launches
def _scatter(plan: _Plan, *pairs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """dst[token] = src[row] for every real row of the call (one launch for one or two equal-shaped pairs)."""
    if plan.n_real == 0:
        return
    (src_a, dst_a) = pairs[0]
    src_b, dst_b = pairs[1] if len(pairs) == 2 else (None, None)
    dev, stream = rt.launch(src_a)
    rt.ext().attn_scatter(rt.ptr(src_a), rt.ptr(dst_a), rt.ptr(src_b), rt.ptr(dst_b), rt.ptr(plan.rows),
                          rt.ptr(plan.toks), plan.n_real, math.prod(src_a.shape[1:]), dev, stream)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: RowIdentity, cache: AttentionCache,
             need_grad: bool) -> tuple[torch.Tensor, _Plan]:
    plan, o = cache._begin_forward(rows, q, k, v, need_grad)
    if plan.n_real:
        _launch_fwd(q, o, plan, cache)
    return o, plan


def _launch_fwd(q: torch.Tensor, o: torch.Tensor, plan: _Plan, cache: AttentionCache, path: int = 0) -> None:
    """The forward programs of one call into ``o`` and ``cache.lse``. ``path``: 0 the kernels the GPU picks, 1 the
    mma.sync programs, 2 the wide programs on wgmma (sm_90, head_dim 65 .. 128; the GPU test runs both on one
    call and compares their bits)."""
    dev, stream = rt.launch(q)
    fwd = plan.fwd
    rt.ext().attn_fwd(rt.ptr(q), rt.ptr(cache.k), rt.ptr(cache.v), rt.ptr(o), rt.ptr(cache.lse),
                      rt.ptr(fwd.wide), fwd.wide.shape[0], rt.ptr(fwd.narrow), fwd.narrow.shape[0], plan.pack,
                      cache.heads, cache.kv_heads, cache.head_dim, cache.total,
                      LOG2E / math.sqrt(cache.head_dim), dev, stream, path)


def _backward(q: torch.Tensor, o: torch.Tensor, do: torch.Tensor, plan: _Plan, cache: AttentionCache) -> torch.Tensor:
    do, dq = cache._begin_backward(plan, q, o, do)
    if plan.n_real:
        _launch_dq(q, o, do, dq, plan, cache)
    cache._end_backward(plan, do)
    return dq


def _launch_dq(q: torch.Tensor, o: torch.Tensor, do: torch.Tensor, dq: torch.Tensor, plan: _Plan,
               cache: AttentionCache, path: int = 0) -> None:
    """The dQ programs of one call into ``dq`` and ``cache.delta``. ``path``: as ``_launch_fwd``'s (the GPU test
    runs the mma.sync and the wgmma programs on one call and compares their bits)."""
    dev, stream = rt.launch(q)
    sm_scale = 1.0 / math.sqrt(cache.head_dim)
    progs = plan.dq
    rt.ext().attn_dq(rt.ptr(q), rt.ptr(cache.k), rt.ptr(cache.v), rt.ptr(o), rt.ptr(do), rt.ptr(dq),
                     rt.ptr(cache.lse), rt.ptr(cache.delta), rt.ptr(progs.wide), progs.wide.shape[0],
                     rt.ptr(progs.narrow), progs.narrow.shape[0], plan.pack, cache.heads, cache.kv_heads,
                     cache.head_dim, cache.total, sm_scale * LOG2E, sm_scale, cache.config.fp32_grads, dev, stream,
                     path)


def _launch_dkdv(cache: AttentionCache) -> None:
    """Fold every canonical query tile into dK / dV (one launch, after the step's last backward)."""
    if not cache._fold_outputs():
        return
    fold_kv(cache, cache.dk, cache.dv, cache._load_acc)


def fold_kv(cache: AttentionCache, dk: torch.Tensor, dv: torch.Tensor, load_acc: bool, path: int = 0) -> None:
    """The dK / dV fold of the cache's stores into ``dk`` / ``dv`` (fp32 [total, kv_heads, head_dim]; loaded first
    when ``load_acc``). ``path``: 0 the kernel the GPU picks, 1 the mma.sync fold, 2 the wgmma fold (sm_90; the GPU
    test launches both on one step's stores and compares their bits)."""
    work = host.kv_work(cache.lengths, cache.starts, _geometry().fold_keys, cache.device)
    sm_scale = 1.0 / math.sqrt(cache.head_dim)
    dev, stream = rt.launch(cache.k)
    rt.ext().attn_dkdv(rt.ptr(cache.k), rt.ptr(cache.v), rt.ptr(cache.q), rt.ptr(cache.do), rt.ptr(cache.lse),
                       rt.ptr(cache.delta), rt.ptr(dk), rt.ptr(dv), rt.ptr(work), work.shape[0],
                       cache.heads, cache.kv_heads, cache.head_dim, cache.total, sm_scale * LOG2E, sm_scale,
                       load_acc, cache.config.fp32_grads, dev, stream, path)


# ------------------------------------------------------------------------------------------------ the cache
class AttentionCache(host.HostAttentionCache):
    """State of one layer over one step (``HostAttentionCache``: stores, dK / dV accumulators, bookkeeping) with
    the CUDA C++ family's plans and launches."""

    _plans = _PLANS
    _default_config = DEFAULT_CONFIG
    _build_plan = staticmethod(_build_plan)
    _scatter = staticmethod(_scatter)
    _launch_dkdv = staticmethod(_launch_dkdv)

    def _check_head_dim(self) -> None:
        if not 1 <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f"attention: head_dim {self.head_dim} is not supported by the CUDA kernels; supported "
                             f"head_dims: 1 to {MAX_HEAD_DIM}")

    def _new_fold(self) -> host.QueryFold:
        return host.QueryFold(self.total, TILE)


_AttentionFn = host.autograd_function(_forward, _backward)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: RowIdentity,
              cache: AttentionCache) -> torch.Tensor:
    """Causal attention of one call's rows (q [R, heads, d], k / v [R, kv_heads, d], bf16 CUDA tensors) over their
    samples' keys so far: this call's and every earlier call's, through the cache.

    Differentiable wrt q; k / v gradients are folded into ``cache.dk`` / ``cache.dv`` (autograd gives None) once
    every token of the step has had its backward (``cache.finish()``). Pad and filler rows (sample < 0) output
    zeros and touch neither the store nor the gradients.
    """
    host.check_call(q, k, v, rows, cache)
    for name, t in (("q", q), ("k", k), ("v", v)):
        rt.check_tensor(f"attention {name}", t)
    return host.run_call(_AttentionFn, _forward, q, k, v, rows, cache)
