"""Batch-invariant causal attention with grouped-query heads in CUDA C++ (gradsweep._C): forward, dQ, and dK / dV
folded over canonical query tiles once the step's last backward has run. Same public API and semantics as
``gradsweep.triton_kernels.attention``.

Why each piece looks the way it does (kernels: csrc/attention*.cu, argument in csrc/attention.cuh):
- **Key blocks** of ``ATTN_BLOCK_N`` keys aligned to absolute position 0, folded in increasing order by an online
  softmax on mma.sync tensor cores. A row's max and sum over a block are taken by the four lanes that hold it
  in an order fixed by the block size alone, so the rows per program and the warps per CTA never reach a row's
  bits: prefill programs (4 warps, 128 rows forward / 64 rows dQ) and narrow programs (one warp, 16 rows: decode
  steps and short tails) give the same bits for the same row (the GPU tests check it). A block after a row's
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
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gradsweep.canonical import RowIdentity
from gradsweep.cuda_kernels import runtime as rt

LOG2E = 1.4426950408889634
TILE = 32           # canonical query tile of the dK / dV fold (csrc/attention.cuh kFoldTile; checked at launch)
MAX_HEAD_DIM = 128  # csrc/attention.cuh kMaxHeadDim: head_dim 1..128 (padded to 32, 64 or 128 columns)


@dataclass(frozen=True)
class AttnConfig:
    """What the host decides about a launch (block sizes are compiled in: csrc/attention.cuh).

    ``fp32_grads`` (default): dK / dV FP32-class (hi + lo bf16 operands, FP32 delta); off: bf16 operands as in
    FlashAttention (bf16-class). ``narrow``: programs of at most 16 rows (decode steps, short tails) run on the
    one-warp kernels; off, every program runs on the wide kernels. Bits depend on ``fp32_grads`` only."""

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
    """int32 table to the device without stalling behind queued GPU work (done once per plan)."""
    host = torch.from_numpy(np.ascontiguousarray(np.asarray(a).reshape(-1, cols), dtype=np.int32))
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


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
    per = rows // pack
    chunks = (n + per - 1) // per
    idx = np.repeat(np.arange(len(n)), chunks)
    k = np.arange(len(idx)) - np.repeat(np.cumsum(chunks) - chunks, chunks)
    cnt = np.minimum(per, n[idx] - k * per)
    table = np.stack([row0[idx] + k * per, tok0[idx] + k * per, pos0[idx] + k * per, cnt], axis=1)
    small = (cnt * pack <= narrow_rows) if narrow else np.zeros(len(cnt), dtype=bool)
    out = []
    for sel in (~small, small):
        t = table[sel]
        t = t[np.argsort(-(t[:, 2] + t[:, 3]), kind="stable")]  # most key blocks first (load balance only)
        out.append(_upload(t, 4, device))
    return _Programs(*out)


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
_PLAN_SLOTS = 64


def _build_plan(rows: RowIdentity, lengths: np.ndarray, starts: np.ndarray, cfg: AttnConfig, group: int,
                device: torch.device) -> _Plan:
    geo = _geometry()
    pack = _pack(group, geo.narrow_rows)
    sample = rows.sample.cpu().numpy().astype(np.int64)
    position = rows.position.cpu().numpy().astype(np.int64)
    n_rows = len(sample)
    if n_rows:
        brk = np.flatnonzero((sample[1:] != sample[:-1]) | (position[1:] != position[:-1] + 1)) + 1
        first = np.concatenate([[0], brk])
        n = np.diff(np.concatenate([first, [n_rows]]))
        real = sample[first] >= 0
        first, n = first[real], n[real]
    else:
        first = n = np.zeros(0, dtype=np.int64)
    s = sample[first]
    p0 = position[first]
    if len(s) and int(s.max()) >= len(lengths):
        raise ValueError(f"attention: sample id {int(s.max())} outside the step's {len(lengths)} samples")
    if ((p0 < 0) | (p0 + n > lengths[s])).any():
        raise ValueError("attention: a row's position lies outside its sample")
    tok0 = starts[s] + p0
    n_real = int(n.sum())
    chain = _chains(s, p0, n)
    nonempty = np.flatnonzero(lengths > 0)
    full = (n_real == n_rows == int(lengths.sum()) and len(s) == len(nonempty) and bool((s == nonempty).all())
            and bool((p0 == 0).all()) and bool((n == lengths[s]).all()) and bool((first == starts[s]).all()))
    run_of = np.repeat(np.arange(len(n)), n)
    off = np.arange(n_real) - np.repeat(np.cumsum(n) - n, n)
    return _Plan(n_rows, n_real, n_real < n_rows, full, *chain, pack,
                 _programs(first, tok0, p0, n, geo.fwd_rows, geo.narrow_rows, pack, cfg.narrow, device),
                 _programs(first, tok0, p0, n, geo.dq_rows, geo.narrow_rows, pack, cfg.narrow, device),
                 _upload(first[run_of] + off, 1, device).view(-1), _upload(tok0[run_of] + off, 1, device).view(-1))


def _chains(s: np.ndarray, p0: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample of a call: (sample, first position, end); its runs must tile one range (no gap, no repeat)."""
    if len(s) == 0:
        return s, p0, p0
    order = np.lexsort((p0, s))
    s, p0, n = s[order], p0[order], n[order]
    new = np.concatenate([[True], s[1:] != s[:-1]])
    follows = np.concatenate([[0], p0[:-1] + n[:-1]])
    bad = ~new & (p0 != follows)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        what = "a token's K / V was written twice" if p0[i] < follows[i] else "some keys before it are in no call"
        raise ValueError(f"attention: sample {int(s[i])} position {int(p0[i])} of one call: {what}")
    last = np.concatenate([np.flatnonzero(new[1:]), [len(s) - 1]])
    return s[new], p0[new], p0[last] + n[last]


_STEPS: OrderedDict = OrderedDict()
_WORK: OrderedDict = OrderedDict()


def _step(lengths: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int, tuple[int, ...]]:
    """Lengths, start tokens and total of a step's samples (cached: every layer's cache of a step shares them)."""
    hit = _STEPS.get(lengths)
    if hit is None:
        arr = np.asarray(lengths, dtype=np.int64)
        if (arr < 0).any():
            raise ValueError("attention: sample lengths must be >= 0")
        starts = np.concatenate([[0], np.cumsum(arr)])[:-1].astype(np.int64)
        hit = _STEPS[lengths] = (arr, starts, int(arr.sum()), lengths)
        while len(_STEPS) > 16:
            _STEPS.popitem(last=False)
    return hit


def _kv_work(lengths: np.ndarray, starts: np.ndarray, keys: int, device: torch.device) -> torch.Tensor:
    """Rows of the dK / dV launch (sample start token, first key, length), heaviest first; once per lengths."""
    key = (lengths.tobytes(), keys, str(device))
    if key not in _WORK:
        blocks = (lengths + keys - 1) // keys
        s = np.repeat(np.arange(len(lengths)), blocks)
        k0 = (np.arange(len(s)) - np.repeat(np.cumsum(blocks) - blocks, blocks)) * keys
        work = np.stack([starts[s], k0, lengths[s]], axis=1)
        work = work[np.argsort(-(work[:, 2] - work[:, 1]), kind="stable")]
        _WORK[key] = _upload(work, 3, device)
        while len(_WORK) > 16:
            _WORK.popitem(last=False)
    return _WORK[key]


class _QueryFold:
    """Where the dK / dV fold over canonical query tiles stands: done once every token's backward has run."""

    def __init__(self, total: int) -> None:
        self.tile = TILE
        self.total_tokens = total
        self.tokens_in = 0
        self.done = False


# ------------------------------------------------------------------------------------------------ the cache
class AttentionCache:
    """State of one layer over one step: the logical K / V (and Q, dO, lse, delta) stores and FP32 dK / dV.

    ``dk`` / ``dv``: optional FP32 [T, kv_heads, d] accumulators (main grads) the fold adds to; zero otherwise.
    """

    def __init__(self, lengths: Sequence[int], heads: int, head_dim: int, device, *, kv_heads: int | None = None,
                 config: AttnConfig | None = None, dk: torch.Tensor | None = None,
                 dv: torch.Tensor | None = None) -> None:
        self.config = DEFAULT_CONFIG if config is None else config
        self.lengths, self.starts, self.total, lengths_key = _step(tuple(int(n) for n in lengths))
        self.heads, self.head_dim = int(heads), int(head_dim)
        self.kv_heads = self.heads if kv_heads is None else int(kv_heads)
        if self.kv_heads <= 0 or self.heads % self.kv_heads:
            raise ValueError(f"attention: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}; "
                             "use kv_heads that divides heads")
        if not 1 <= self.head_dim <= MAX_HEAD_DIM:
            raise ValueError(f"attention: head_dim {self.head_dim} is not supported by the CUDA kernels; supported "
                             f"head_dims: 1 to {MAX_HEAD_DIM}")
        self.group = self.heads // self.kv_heads
        self.device = torch.device(device)
        self._key = (lengths_key, self.config, self.group, str(self.device))
        shape_kv = (self.total, self.kv_heads, self.head_dim)
        for name, acc in (("dk", dk), ("dv", dv)):
            if acc is not None and (acc.dtype != torch.float32 or tuple(acc.shape) != shape_kv
                                    or not acc.is_contiguous() or acc.device != self.device):
                raise ValueError(f"attention: {name} must be a contiguous float32 tensor {shape_kv} on {self.device}")
        if (dk is None) != (dv is None):
            raise ValueError("attention: pass both dk and dv accumulators, or neither")
        self.dk, self.dv = dk, dv
        self._load_acc = dk is not None
        self.fold = _QueryFold(self.total)
        self._extent = np.zeros(len(self.lengths), dtype=np.int64)  # positions [0, extent) of a sample are written
        self._mode: str | None = None                               # "alias" or "store", fixed by the first call
        self.k = self.v = self.q = self.do = None
        self.lse = torch.empty((self.heads, self.total), dtype=torch.float32, device=self.device)
        self.delta: torch.Tensor | None = None

    # -- plans and bookkeeping (host, O(runs) per call) ---------------------------------------------------------
    def plan(self, rows: RowIdentity) -> _Plan:
        """The call's plan, built once per RowIdentity object and config (every layer of a step reuses it)."""
        key = (id(rows), self._key)
        hit = _PLANS.get(key)
        if hit is not None and hit[0] is rows:
            _PLANS.move_to_end(key)
            return hit[1]
        plan = _build_plan(rows, self.lengths, self.starts, self.config, self.group, self.device)
        _PLANS[key] = (rows, plan)  # holding rows keeps its id from being reused while the entry lives
        while len(_PLANS) > _PLAN_SLOTS:
            _PLANS.popitem(last=False)
        return plan

    def mark(self) -> np.ndarray:
        """Host state of the store (how far each sample is written): ``rewind`` to it to redo later calls."""
        if self._mode == "alias":
            raise ValueError("attention: a cache whose one call held every token cannot be rewound")
        return self._extent.copy()

    def rewind(self, mark: np.ndarray) -> None:
        """Forget the tokens written after ``mark`` (they are written again by the next calls; forward only)."""
        if self.fold.tokens_in:
            raise ValueError("attention: cannot rewind a cache whose backward has started")
        self._extent = np.asarray(mark, dtype=np.int64).copy()

    def _check_writes(self, plan: _Plan) -> None:
        """Each sample's rows of the call continue exactly where its written positions end (no gap, no rewrite)."""
        if plan.n_real == 0:
            return
        written = self._extent[plan.chain_sample]
        bad = written != plan.chain_first
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            s, p = int(plan.chain_sample[i]), int(plan.chain_first[i])
            if p < written[i]:
                raise ValueError(f"attention: sample {s} position {p}: a token's K / V was written twice")
            raise ValueError(f"attention: sample {s} queries position {p} but some earlier keys were never written "
                             "(calls of a sample must come in position order)")
        self._extent[plan.chain_sample] = plan.chain_end

    def _store(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty((self.total, *like.shape[1:]), dtype=like.dtype, device=self.device)

    def _write(self, plan: _Plan, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor | None) -> None:
        """Put the call's K / V (and Q when a backward will follow) where the kernels read them."""
        if plan.n_real == 0:  # a call of pads and fillers only: nothing to keep, and it decides nothing
            return
        if self._mode is None:
            self._mode = "alias" if plan.full else "store"
        if self._mode == "alias":
            if self.k is not None:  # unreachable: the one call held every token, so _check_writes refused this one
                raise ValueError("attention: a cache whose one call held every token takes no other call")
            self.k, self.v, self.q = k, v, q
            return
        if self.k is None:
            self.k, self.v = self._store(k), self._store(v)
        _scatter(plan, (k, self.k), (v, self.v))
        if q is not None:
            if self.q is None:
                self.q = self._store(q)
            _scatter(plan, (q, self.q))

    def _write_do(self, plan: _Plan, do: torch.Tensor) -> None:
        if plan.n_real == 0:
            return
        if self._mode == "alias":
            self.do = do
            return
        if self.do is None:
            self.do = self._store(do)
        _scatter(plan, (do, self.do))

    def _backward_done(self, plan: _Plan) -> None:
        """Count the call's tokens into the fold; the call that completes the step launches dK / dV."""
        self.fold.tokens_in += plan.n_real
        if self.fold.tokens_in > self.total:
            raise ValueError("attention: a token's backward ran twice")
        if self.fold.tokens_in == self.total and not self.fold.done:
            _launch_dkdv(self)
            self.fold.done = True
            self.q = self.do = None  # the fold read them; K / V stay (a cache may still be read)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """FP32 dK, dV [T_total, kv_heads, d] (logical order); raises if some token never had its backward."""
        if not self.fold.done:
            if self.total:
                missing = self.total - self.fold.tokens_in
                raise ValueError(f"attention: {missing} tokens never reached the backward, so the dK / dV fold "
                                 "over canonical query tiles never completed")
            _launch_dkdv(self)
            self.fold.done = True
        return self.dk, self.dv


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
    plan = cache.plan(rows)
    if plan.n_real and cache.fold.done:
        raise ValueError("attention: this cache's dK / dV fold is complete; make a new AttentionCache per step")
    cache._check_writes(plan)
    cache._write(plan, k, v, q if need_grad else None)
    o = torch.zeros_like(q) if plan.has_pads else torch.empty_like(q)
    if plan.n_real:
        dev, stream = rt.launch(q)
        fwd = plan.fwd
        rt.ext().attn_fwd(rt.ptr(q), rt.ptr(cache.k), rt.ptr(cache.v), rt.ptr(o), rt.ptr(cache.lse),
                          rt.ptr(fwd.wide), fwd.wide.shape[0], rt.ptr(fwd.narrow), fwd.narrow.shape[0], plan.pack,
                          cache.heads, cache.kv_heads, cache.head_dim, cache.total,
                          LOG2E / math.sqrt(cache.head_dim), dev, stream)
    return o, plan


def _backward(q: torch.Tensor, o: torch.Tensor, do: torch.Tensor, plan: _Plan, cache: AttentionCache) -> torch.Tensor:
    do = do.contiguous()
    if do.dtype != o.dtype:
        raise ValueError(f"attention: the upstream gradient must be {o.dtype}, got {do.dtype}")
    if cache.delta is None:
        cache.delta = torch.empty((cache.heads, cache.total), dtype=torch.float32, device=cache.device)
    dq = torch.zeros_like(q) if plan.has_pads else torch.empty_like(q)
    if plan.n_real:
        dev, stream = rt.launch(q)
        sm_scale = 1.0 / math.sqrt(cache.head_dim)
        progs = plan.dq
        rt.ext().attn_dq(rt.ptr(q), rt.ptr(cache.k), rt.ptr(cache.v), rt.ptr(o), rt.ptr(do), rt.ptr(dq),
                         rt.ptr(cache.lse), rt.ptr(cache.delta), rt.ptr(progs.wide), progs.wide.shape[0],
                         rt.ptr(progs.narrow), progs.narrow.shape[0], plan.pack, cache.heads, cache.kv_heads,
                         cache.head_dim, cache.total, sm_scale * LOG2E, sm_scale, cache.config.fp32_grads, dev, stream)
    cache._write_do(plan, do)
    cache._backward_done(plan)
    return dq


def _launch_dkdv(cache: AttentionCache) -> None:
    """Fold every canonical query tile into dK / dV (one launch, after the step's last backward)."""
    shape = (cache.total, cache.kv_heads, cache.head_dim)
    if cache.dk is None:  # no accumulator handed in: the kernel starts from zero (same bits as loading zeros)
        cache.dk = torch.empty(shape, dtype=torch.float32, device=cache.device)
        cache.dv = torch.empty(shape, dtype=torch.float32, device=cache.device)
    if cache.total == 0:
        return
    work = _kv_work(cache.lengths, cache.starts, _geometry().fold_keys, cache.device)
    sm_scale = 1.0 / math.sqrt(cache.head_dim)
    dev, stream = rt.launch(cache.k)
    rt.ext().attn_dkdv(rt.ptr(cache.k), rt.ptr(cache.v), rt.ptr(cache.q), rt.ptr(cache.do), rt.ptr(cache.lse),
                       rt.ptr(cache.delta), rt.ptr(cache.dk), rt.ptr(cache.dv), rt.ptr(work), work.shape[0],
                       cache.heads, cache.kv_heads, cache.head_dim, cache.total, sm_scale * LOG2E, sm_scale,
                       cache._load_acc, cache.config.fp32_grads, dev, stream)


class _AttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rows, cache):  # type: ignore[override]
        o, plan = _forward(q, k, v, rows, cache, need_grad=True)
        ctx.save_for_backward(q, o)
        ctx.plan, ctx.cache = plan, cache
        return o

    @staticmethod
    def backward(ctx, do):  # type: ignore[override]
        q, o = ctx.saved_tensors
        dq = _backward(q, o, do, ctx.plan, ctx.cache)
        return (dq if ctx.needs_input_grad[0] else None), None, None, None, None  # dK / dV: cache.finish()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: RowIdentity,
              cache: AttentionCache) -> torch.Tensor:
    """Causal attention of one call's rows (q [R, heads, d], k / v [R, kv_heads, d], bf16 CUDA tensors) over their
    samples' keys so far: this call's and every earlier call's, through the cache.

    Differentiable wrt q; k / v gradients are folded into ``cache.dk`` / ``cache.dv`` (autograd gives None) once
    every token of the step has had its backward (``cache.finish()``). Pad and filler rows (sample < 0) output
    zeros and touch neither the store nor the gradients.
    """
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"attention: q [R, heads, d] and k, v [R, kv_heads, d] expected, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if (q.shape[1], k.shape[1], q.shape[2]) != (cache.heads, cache.kv_heads, cache.head_dim):
        raise ValueError(f"attention: rows have heads, kv_heads, d = {(q.shape[1], k.shape[1], q.shape[2])}, the "
                         f"cache {(cache.heads, cache.kv_heads, cache.head_dim)}")
    if rows.num_rows != q.shape[0]:
        raise ValueError(f"attention: {rows.num_rows} row identities for {q.shape[0]} rows")
    for name, t in (("q", q), ("k", k), ("v", v)):
        rt.check_tensor(f"attention {name}", t)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _AttentionFn.apply(q, k, v, rows, cache)
    return _forward(q, k, v, rows, cache, need_grad=False)[0]
