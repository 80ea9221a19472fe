"""Batch-invariant causal attention (per sample, KV cache across calls), forward, dQ, and folded dK / dV.

Why each piece looks the way it does:
- Key blocks of ``bn`` keys are aligned to absolute position 0 of a sample and folded in increasing
  order with an online softmax, so full prefill, chunked prefill and decode fold the same blocks in
  the same order. A block entirely after a row's position is skipped for that row by a select (an
  exact no-op); the row sum of p goes through the tensor core (``tl.dot(p, ones)``), never ``tl.sum``
  along the key axis, whose order would follow the launch layout.
- Query rows of one call are grouped by sample on the host (sorted by position, ``bm`` rows of one
  sample per program); a row's arithmetic depends on its own position only. Every launch
  configuration is pinned in ``AttnConfig`` (a function of nothing that a layout can change).
- K / V of every call go into a logical store in the cache (token = start of sample + position), so
  later calls' queries see earlier calls' keys. Their gradients cannot be returned per call (later
  queries add to them), so dK / dV are folded by the canonical protocol: ``cache.fold`` (a
  ``CanonicalFold`` over *query* tokens) hands out canonical query tiles; one program per (key block,
  head) loads its FP32 dK / dV rows, adds the tiles of its sample in canonical order and stores them.
  Any layout, and any order of the calls' backward, gives the same bits.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, FoldStep, RowIdentity
from gradsweep.triton_kernels._common import INTERPRET, pow2, to_out

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class AttnConfig:
    """Pinned launch configuration (bits depend on bn, dq_bn, kv_bn and tile; speed on the rest)."""

    bm: int = 128        # query rows per forward program
    bn: int = 64         # forward key block (aligned to position 0)
    fwd_warps: int = 8
    fwd_stages: int = 3
    dq_bm: int = 64      # query rows per dQ program
    dq_bn: int = 64      # dQ key block
    dq_warps: int = 4
    dq_stages: int = 2
    kv_bn: int = 128     # keys per dK / dV program
    tile: int = 32       # canonical query tile of the dK / dV fold
    kv_warps: int = 8
    kv_stages: int = 2


GPU_CONFIG = AttnConfig()
# Small blocks under the interpreter: short test samples still span several key blocks and tiles.
INTERPRET_CONFIG = AttnConfig(bm=32, bn=16, fwd_warps=4, fwd_stages=1, dq_bm=32, dq_bn=16, dq_warps=4,
                              dq_stages=1, kv_bn=16, tile=32, kv_warps=4, kv_stages=1)
DEFAULT_CONFIG = INTERPRET_CONFIG if INTERPRET else GPU_CONFIG


# ----------------------------------------------------------------------------------------------- jit kernels
# Loop bodies are written inline (no nested jit calls): the interpreter re-patches the language on every
# nested call, which made the CI run ten times slower. Under the interpreter (UPCAST) every tl.dot runs on
# FP32 operands (its bf16 dot is broken) and loops run to a constexpr bound (it cannot range() over a
# runtime one), the extra iterations being exact no-ops. Values assigned inside an ``if`` become tensors in
# the interpreter, hence the loop bounds as conditional expressions.


@triton.jit
def _bf16_round(x, UPCAST: tl.constexpr):
    """FP32 -> bf16 with round-to-nearest-even; under the interpreter kept in FP32 storage (int64 lanes: the
    interpreter checks every int32 add for overflow, which costs more than the rest of a block)."""
    if UPCAST:
        b = x.to(tl.uint32, bitcast=True).to(tl.int64)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.uint32).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, prog_ptr, row_ptr, pos_ptr, H, D, qk_scale,
                HI: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, DP: tl.constexpr, STAGES: tl.constexpr,
                UPCAST: tl.constexpr):
    """Program = up to BM rows of one sample (prog: first sorted row, count, store base, max position).

    Key blocks [n0, n0 + BN) from position 0 in order; a row that sees none of a block keeps its state
    (select), so the block is a bitwise no-op for it whatever the program's other rows are.
    """
    pid = tl.program_id(0)
    h = tl.program_id(1)
    first = tl.load(prog_ptr + pid * 4)
    cnt = tl.load(prog_ptr + pid * 4 + 1)
    kbase = tl.load(prog_ptr + pid * 4 + 2).to(tl.int64)
    pmax = tl.load(prog_ptr + pid * 4 + 3)
    i = tl.arange(0, BM)
    live = i < cnt
    r = tl.load(row_ptr + first + i, mask=live, other=0).to(tl.int64)
    pos = tl.load(pos_ptr + first + i, mask=live, other=-1)
    d = tl.arange(0, DP)
    dmask = (d < D)[None, :]
    hoff = (h * D + d)[None, :]
    rmask = live[:, None] & dmask
    roff = (r * H * D)[:, None] + hoff
    q = tl.load(q_ptr + roff, mask=rmask, other=0.0)
    jn = tl.arange(0, BN)
    if UPCAST:
        q = q.to(tl.float32)
        ones = tl.full((BN, 16), 1.0, tl.float32)
    else:
        ones = tl.full((BN, 16), 1.0, tl.bfloat16)
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, DP), tl.float32)
    for n0 in tl.range(0, HI if UPCAST else pmax + 1, BN, num_stages=STAGES):
        kmask = (jn <= pmax - n0)[:, None] & dmask
        koff = ((kbase + n0 + jn) * H * D)[:, None] + hoff  # kbase is int64: no overflow
        k = tl.load(k_ptr + koff, mask=kmask, other=0.0)
        v = tl.load(v_ptr + koff, mask=kmask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        rel = pos - n0                                   # key j of the block is visible iff j <= rel
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(jn[None, :] <= rel[:, None], s, float("-inf"))
        active = rel >= 0
        m_new = tl.maximum(m_i, tl.max(s, 1))  # tl.max is exact: any reduction order gives the same value
        m_use = tl.where(active, m_new, 0.0)
        alpha = tl.exp2(m_i - m_use)
        p = _bf16_round(tl.exp2(s - m_use[:, None]), UPCAST)
        rs = tl.max(tl.dot(p, ones), 1)  # the row sum through the tensor core (every column holds it)
        l_new = l_i * alpha + rs
        acc_new = tl.dot(p, v, acc * alpha[:, None])
        m_i = tl.where(active, m_new, m_i)
        l_i = tl.where(active, l_new, l_i)
        acc = tl.where(active[:, None], acc_new, acc)
    l_safe = tl.where(live, l_i, 1.0)
    o = acc / l_safe[:, None]
    tl.store(o_ptr + roff, to_out(o, o_ptr.dtype.element_ty), mask=rmask)
    tl.store(lse_ptr + r * H + h, tl.where(live, m_i, 0.0) + tl.log2(l_safe), mask=live)


@triton.jit
def _delta_kernel(o_ptr, do_ptr, delta_ptr, n_rows, D, ROWS: tl.constexpr, DP: tl.constexpr):
    """delta[r] = sum_d o[r, d] * do[r, d] over flat (token, head) rows; pinned block, pinned order."""
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, DP)
    m = (r < n_rows)[:, None] & (d < D)[None, :]
    off = r[:, None] * D + d[None, :]
    o = tl.load(o_ptr + off, mask=m, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + off, mask=m, other=0.0).to(tl.float32)
    tl.store(delta_ptr + r, tl.sum(o * do, 1), mask=r < n_rows)


@triton.jit
def _dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, prog_ptr, row_ptr, pos_ptr,
               H, D, qk_scale, sm_scale, HI: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               DP: tl.constexpr, STAGES: tl.constexpr, UPCAST: tl.constexpr):
    """dQ of up to BM rows of one sample: key blocks from position 0 in order, p recomputed from lse."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    first = tl.load(prog_ptr + pid * 4)
    cnt = tl.load(prog_ptr + pid * 4 + 1)
    kbase = tl.load(prog_ptr + pid * 4 + 2).to(tl.int64)
    pmax = tl.load(prog_ptr + pid * 4 + 3)
    i = tl.arange(0, BM)
    live = i < cnt
    r = tl.load(row_ptr + first + i, mask=live, other=0).to(tl.int64)
    pos = tl.load(pos_ptr + first + i, mask=live, other=-1)
    d = tl.arange(0, DP)
    dmask = (d < D)[None, :]
    hoff = (h * D + d)[None, :]
    rmask = live[:, None] & dmask
    roff = (r * H * D)[:, None] + hoff
    q = tl.load(q_ptr + roff, mask=rmask, other=0.0)
    do = tl.load(do_ptr + roff, mask=rmask, other=0.0)
    lse = tl.load(lse_ptr + r * H + h, mask=live, other=0.0)
    delta = tl.load(delta_ptr + r * H + h, mask=live, other=0.0)
    jn = tl.arange(0, BN)
    if UPCAST:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    acc = tl.zeros((BM, DP), tl.float32)
    for n0 in tl.range(0, HI if UPCAST else pmax + 1, BN, num_stages=STAGES):
        kmask = (jn <= pmax - n0)[:, None] & dmask
        koff = ((kbase + n0 + jn) * H * D)[:, None] + hoff  # kbase is int64: no overflow
        k = tl.load(k_ptr + koff, mask=kmask, other=0.0)
        v = tl.load(v_ptr + koff, mask=kmask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        rel = pos - n0
        s = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.exp2(tl.where(jn[None, :] <= rel[:, None], s, float("-inf")) - lse[:, None])
        dp = tl.dot(do, tl.trans(v))
        ds = _bf16_round(p * (dp - delta[:, None]), UPCAST)
        acc_new = tl.dot(ds, k, acc)
        acc = tl.where((rel >= 0)[:, None], acc_new, acc)
    tl.store(dq_ptr + roff, to_out(acc * sm_scale, dq_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _dkdv_kernel(q_ptr, do_ptr, lse_ptr, delta_ptr, k_ptr, v_ptr, dk_ptr, dv_ptr, plan_ptr, work_ptr,
                 H, D, qk_scale, sm_scale, HI: tl.constexpr, BN: tl.constexpr, TILE: tl.constexpr,
                 DP: tl.constexpr, STAGES: tl.constexpr, UPCAST: tl.constexpr):
    """One (key block, head): load FP32 dK / dV, add the step's tiles of its sample in order, store.

    work row: store token of the block's first key, valid keys, position of the first key, first and
    end step tile, position of the first tile's slot 0 (a sample's tiles are consecutive). Scores are
    computed transposed ([keys, queries]) so both updates are plain dots over the tile's rows.
    """
    w = tl.program_id(0)
    h = tl.program_id(1)
    kbase = tl.load(work_ptr + w * 6).to(tl.int64)
    klen = tl.load(work_ptr + w * 6 + 1)
    kpos0 = tl.load(work_ptr + w * 6 + 2)
    t0 = tl.load(work_ptr + w * 6 + 3).to(tl.int64)
    t1 = tl.load(work_ptr + w * 6 + 4)
    qpos0 = tl.load(work_ptr + w * 6 + 5)
    j = tl.arange(0, BN)
    kvalid = j < klen
    d = tl.arange(0, DP)
    dmask = (d < D)[None, :]
    hoff = (h * D + d)[None, :]
    kmask = kvalid[:, None] & dmask
    koff = ((kbase + j) * H * D)[:, None] + hoff
    k = tl.load(k_ptr + koff, mask=kmask, other=0.0)
    v = tl.load(v_ptr + koff, mask=kmask, other=0.0)
    dk = tl.load(dk_ptr + koff, mask=kmask, other=0.0)
    dv = tl.load(dv_ptr + koff, mask=kmask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    slot = tl.arange(0, TILE)
    # key j sees query slot i of the it-th tile iff kpos0 + j <= qpos0 + it * TILE + i
    diff = j[:, None] - slot[None, :]
    shift = qpos0 - kpos0
    lse_h = lse_ptr + h
    delta_h = delta_ptr + h
    plan_t = plan_ptr + t0 * TILE + slot
    for it in tl.range(0, HI if UPCAST else t1 - t0, num_stages=STAGES):
        idx = tl.load(plan_t + it * TILE, mask=t0 + it < t1, other=-1)
        valid = idx >= 0
        rr = tl.maximum(idx, 0).to(tl.int64)
        qmask = valid[:, None] & dmask
        qoff = (rr * H * D)[:, None] + hoff
        q = tl.load(q_ptr + qoff, mask=qmask, other=0.0)
        do = tl.load(do_ptr + qoff, mask=qmask, other=0.0)
        lse = tl.load(lse_h + rr * H, mask=valid, other=0.0)
        delta = tl.load(delta_h + rr * H, mask=valid, other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        st = tl.dot(k, tl.trans(q)) * qk_scale
        vis = (diff <= shift + it * TILE) & valid[None, :] & kvalid[:, None]
        pt = tl.exp2(tl.where(vis, st, float("-inf")) - lse[None, :])
        dv_new = tl.dot(_bf16_round(pt, UPCAST), do, dv)
        dpt = tl.dot(v, tl.trans(do))
        dst = _bf16_round(pt * (dpt - delta[None, :]) * sm_scale, UPCAST)
        dk_new = tl.dot(dst, q, dk)
        if UPCAST:  # iterations past this program's tiles (constexpr loop bound) keep the accumulators
            dk = tl.where(t0 + it < t1, dk_new, dk)
            dv = tl.where(t0 + it < t1, dv_new, dv)
        else:
            dk = dk_new
            dv = dv_new
    tl.store(dk_ptr + koff, dk, mask=kmask)
    tl.store(dv_ptr + koff, dv, mask=kmask)


# ------------------------------------------------------------------------------------------------- host side
def _upload(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """int32 table to the device without stalling behind queued GPU work."""
    host = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class _Groups:
    """Programs of one call: rows of one sample sorted by position, ``bm`` at a time."""

    prog: torch.Tensor     # int32 [n_prog, 4]: first sorted row, count, store base, max position
    row: torch.Tensor      # int32 [n_real]: physical row of each sorted row
    pos: torch.Tensor      # int32 [n_real]: its position
    pmax: np.ndarray       # host copy of prog[:, 3] (descending)

    def launches(self, bn: int) -> list[tuple[torch.Tensor, int]]:
        """(program rows, HI) per launch: one launch on the GPU; under the interpreter one per key-block
        count, so that no program runs many no-op blocks to a constexpr bound set by a longer one."""
        if len(self.pmax) == 0:
            return []
        if not INTERPRET:
            return [(self.prog, 0)]
        blocks = self.pmax // bn + 1
        cuts = np.concatenate([[0], np.flatnonzero(np.diff(blocks)) + 1, [len(blocks)]])
        return [(self.prog[a:b], int(blocks[a]) * bn) for a, b in itertools.pairwise(cuts)]


def _sorted_rows(rows: RowIdentity) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sample = rows.sample.cpu().numpy()
    position = rows.position.cpu().numpy()
    real = np.nonzero(sample >= 0)[0]
    order = real[np.lexsort((position[real], sample[real]))]
    return order, sample[order], position[order]


def _groups(order: np.ndarray, s_sorted: np.ndarray, p_sorted: np.ndarray, starts: np.ndarray, bm: int,
            device: torch.device) -> _Groups:
    n = len(order)
    if n == 0:
        empty = np.zeros((0, 4), dtype=np.int32)
        return _Groups(_upload(empty, device), _upload(order, device), _upload(p_sorted, device),
                       np.zeros(0, dtype=np.int64))
    seg_first = np.concatenate([[0], np.flatnonzero(np.diff(s_sorted)) + 1])
    seg_end = np.concatenate([seg_first[1:], [n]])
    n_prog = (seg_end - seg_first + bm - 1) // bm
    seg_of = np.repeat(np.arange(len(seg_first)), n_prog)
    k = np.arange(len(seg_of)) - np.repeat(np.cumsum(n_prog) - n_prog, n_prog)
    first = seg_first[seg_of] + k * bm
    count = np.minimum(bm, seg_end[seg_of] - first)
    base = starts[s_sorted[first]]
    pmax = p_sorted[first + count - 1]
    prog = np.stack([first, count, base, pmax], axis=1)
    prog = prog[np.argsort(-pmax, kind="stable")]  # longest programs first (load balance only)
    return _Groups(_upload(prog, device), _upload(order, device), _upload(p_sorted, device), prog[:, 3].copy())


class AttentionCache:
    """State of one layout run: the logical K / V store, FP32 dK / dV and the fold over query tokens."""

    def __init__(self, lengths: Sequence[int], heads: int, head_dim: int, device,
                 config: AttnConfig | None = None) -> None:
        self.config = DEFAULT_CONFIG if config is None else config
        self.lengths = np.asarray(list(lengths), dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)])[:-1].astype(np.int64)
        self.heads, self.head_dim = int(heads), int(head_dim)
        self.device = torch.device(device)
        total = int(self.lengths.sum())
        shape = (total, self.heads, self.head_dim)
        self.k = torch.zeros(shape, dtype=torch.bfloat16, device=self.device)
        self.v = torch.zeros(shape, dtype=torch.bfloat16, device=self.device)
        self.dk = torch.zeros(shape, dtype=torch.float32, device=self.device)
        self.dv = torch.zeros(shape, dtype=torch.float32, device=self.device)
        self.fold = CanonicalFold(torch.zeros(1, dtype=torch.float32, device=self.device), self.lengths,
                                  self.config.tile)
        self._written = np.zeros(total, dtype=bool)

    def write(self, order: np.ndarray, s_sorted: np.ndarray, p_sorted: np.ndarray, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Store this call's real K / V rows; refuse a query whose earlier keys were never written."""
        if len(order) == 0:
            return
        if (p_sorted >= self.lengths[s_sorted]).any() or (p_sorted < 0).any():
            raise ValueError("attention: a row's position lies outside its sample")
        tok = self.starts[s_sorted] + p_sorted
        if self._written[tok].any():
            raise ValueError("attention: a token's K / V was written twice")
        n = len(tok)
        if tok[-1] - tok[0] == n - 1 and order[-1] - order[0] == n - 1 and (np.diff(tok) == 1).all() \
                and (np.diff(order) == 1).all():  # rows already in logical order: a plain slice copy
            t0, o0 = int(tok[0]), int(order[0])
            self.k[t0:t0 + n].copy_(k[o0:o0 + n])
            self.v[t0:t0 + n].copy_(v[o0:o0 + n])
        else:
            idx = torch.as_tensor(tok, device=self.device)
            src = torch.as_tensor(order, device=self.device)
            self.k.index_copy_(0, idx, k.index_select(0, src).to(torch.bfloat16))
            self.v.index_copy_(0, idx, v.index_select(0, src).to(torch.bfloat16))
        self._written[tok] = True
        last = np.concatenate([np.flatnonzero(np.diff(s_sorted)), [len(s_sorted) - 1]])
        for s, p in zip(s_sorted[last], p_sorted[last]):
            lo = int(self.starts[s])
            if not self._written[lo:lo + int(p) + 1].all():
                raise ValueError(f"attention: sample {int(s)} queries position {int(p)} but some earlier "
                                 "keys were never written (calls of a sample must come in position order)")

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Check that every query tile was folded; return FP32 dK, dV [T_total, heads, d] (logical order)."""
        self.fold.finish()
        return self.dk, self.dv


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: RowIdentity,
             cache: AttentionCache) -> tuple[torch.Tensor, torch.Tensor, _Groups, _Groups]:
    cfg = cache.config
    n_rows, heads, dim = q.shape
    order, s_sorted, p_sorted = _sorted_rows(rows)
    cache.write(order, s_sorted, p_sorted, k, v)
    fwd = _groups(order, s_sorted, p_sorted, cache.starts, cfg.bm, q.device)
    dqg = fwd if cfg.dq_bm == cfg.bm else _groups(order, s_sorted, p_sorted, cache.starts, cfg.dq_bm, q.device)
    o = torch.zeros_like(q)
    lse = torch.zeros((n_rows, heads), dtype=torch.float32, device=q.device)
    qk_scale = LOG2E / math.sqrt(dim)
    for prog, hi in fwd.launches(cfg.bn) if heads else []:
        _fwd_kernel[(prog.shape[0], heads)](
            q, cache.k, cache.v, o, lse, prog, fwd.row, fwd.pos, heads, dim, qk_scale, HI=hi, BM=cfg.bm,
            BN=cfg.bn, DP=pow2(max(dim, 16)), STAGES=cfg.fwd_stages, UPCAST=INTERPRET, num_warps=cfg.fwd_warps)
    return o, lse, fwd, dqg


def _delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    n_rows, heads, dim = o.shape
    delta = torch.zeros((n_rows, heads), dtype=torch.float32, device=o.device)
    flat = n_rows * heads
    if flat:
        rows_per = 16
        _delta_kernel[(triton.cdiv(flat, rows_per),)](o, do, delta, flat, dim, ROWS=rows_per, DP=pow2(dim),
                                                      num_warps=4)
    return delta


def _kv_work(fold: CanonicalFold, step: FoldStep, starts: np.ndarray, kv_bn: int) -> np.ndarray:
    """Work rows of the dK / dV kernel for one fold step (see ``_dkdv_kernel``), heaviest first."""
    tile = fold.tile
    lengths = fold.lengths
    base = np.concatenate([[0], np.cumsum((lengths + tile - 1) // tile)])
    tiles = step.first_tile + np.arange(step.num_tiles)
    s_of = np.searchsorted(base, tiles, side="right") - 1
    k_in = tiles - base[s_of]
    seg_first = np.concatenate([[0], np.flatnonzero(np.diff(s_of)) + 1])
    seg_end = np.concatenate([seg_first[1:], [len(tiles)]])
    out = []
    for lo, hi in zip(seg_first, seg_end):
        s = int(s_of[lo])
        n = int(lengths[s])
        maxpos = min(n, int(k_in[hi - 1] + 1) * tile) - 1
        j = np.arange(maxpos // kv_bn + 1)
        t_start = np.maximum(lo, lo + (j * kv_bn) // tile - int(k_in[lo]))
        keep = t_start < hi
        j, t_start = j[keep], t_start[keep]
        out.append(np.stack([starts[s] + j * kv_bn, np.minimum(kv_bn, n - j * kv_bn), j * kv_bn, t_start,
                             np.full_like(j, hi), k_in[t_start] * tile], axis=1))
    work = np.concatenate(out) if out else np.zeros((0, 6), dtype=np.int64)
    return work[np.argsort(-(work[:, 4] - work[:, 3]), kind="stable")]


def _launch_dkdv(cache: AttentionCache, step: FoldStep) -> None:
    """Fold one step's canonical query tiles into cache.dk / cache.dv (in place, tile order)."""
    if step.num_tiles == 0:
        return
    cfg = cache.config
    work = _kv_work(cache.fold, step, cache.starts, cfg.kv_bn)
    if len(work) == 0 or cache.heads == 0:
        return
    q_src, do_src, lse_src, delta_src = step.tensors
    dim = cache.head_dim
    sm_scale = 1.0 / math.sqrt(dim)
    work_dev = _upload(work, q_src.device)
    n_tiles = work[:, 4] - work[:, 3]  # descending
    if INTERPRET:  # one launch per tile count (the interpreter's loop bound is a constexpr)
        cuts = np.concatenate([[0], np.flatnonzero(np.diff(n_tiles)) + 1, [len(work)]])
        launches = [(work_dev[a:b], int(n_tiles[a])) for a, b in itertools.pairwise(cuts)]
    else:
        launches = [(work_dev, 0)]
    for rows_w, hi in launches:
        _dkdv_kernel[(rows_w.shape[0], cache.heads)](
            q_src, do_src, lse_src, delta_src, cache.k, cache.v, cache.dk, cache.dv, step.plan, rows_w,
            cache.heads, dim, sm_scale * LOG2E, sm_scale, HI=hi, BN=cfg.kv_bn, TILE=cfg.tile,
            DP=pow2(max(dim, 16)), STAGES=cfg.kv_stages, UPCAST=INTERPRET, num_warps=cfg.kv_warps)


def _backward(q: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor, rows: RowIdentity,
              cache: AttentionCache, dqg: _Groups, need_dq: bool) -> torch.Tensor | None:
    cfg = cache.config
    _, heads, dim = q.shape
    do = do.contiguous()
    delta = _delta(o, do)
    dq = None
    if need_dq:
        dq = torch.zeros_like(q)
        sm_scale = 1.0 / math.sqrt(dim)
        for prog, hi in dqg.launches(cfg.dq_bn) if heads else []:
            _dq_kernel[(prog.shape[0], heads)](
                q, cache.k, cache.v, do, lse, delta, dq, prog, dqg.row, dqg.pos, heads, dim, sm_scale * LOG2E,
                sm_scale, HI=hi, BM=cfg.dq_bm, BN=cfg.dq_bn, DP=pow2(max(dim, 16)), STAGES=cfg.dq_stages,
                UPCAST=INTERPRET, num_warps=cfg.dq_warps)
    step = cache.fold.take(rows, (q, do, lse, delta))
    _launch_dkdv(cache, step)
    return dq


class _AttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rows, cache):  # type: ignore[override]
        o, lse, _, dqg = _forward(q, k, v, rows, cache)
        ctx.save_for_backward(q, o, lse)
        ctx.rows, ctx.cache, ctx.dqg = rows, cache, dqg
        return o

    @staticmethod
    def backward(ctx, do):  # type: ignore[override]
        q, o, lse = ctx.saved_tensors
        dq = _backward(q, o, lse, do, ctx.rows, ctx.cache, ctx.dqg, ctx.needs_input_grad[0])
        return dq, None, None, None, None  # dK / dV live in cache.dk / cache.dv (folded)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: RowIdentity,
              cache: AttentionCache) -> torch.Tensor:
    """Causal attention of one call's rows [R, heads, d] (bf16) over their samples' keys in the cache.

    Differentiable wrt q; k / v gradients are folded into ``cache.dk`` / ``cache.dv`` (autograd gives None).
    Pad / filler rows (sample -1) output zeros and touch neither the store nor the gradients.
    """
    if q.dim() != 3 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"attention: q, k, v must be [R, heads, d] of one shape, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1:] != (cache.heads, cache.head_dim):
        raise ValueError(f"attention: rows have [heads, d] = {tuple(q.shape[1:])}, the cache "
                         f"{(cache.heads, cache.head_dim)}")
    if rows.num_rows != q.shape[0]:
        raise ValueError(f"attention: {rows.num_rows} row identities for {q.shape[0]} rows")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"attention: q must be bfloat16, got {q.dtype}")
    return _AttentionFn.apply(q.contiguous(), k.contiguous(), v.contiguous(), rows, cache)
