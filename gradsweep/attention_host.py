"""Host side of batch-invariant attention, written once for both kernel families (Triton and CUDA C++).

``gradsweep.triton_kernels.attention`` and ``gradsweep.cuda_kernels.attention`` promise the same API and the same
semantics: which rows of a call form runs, when a call's writes are legal, where K / V live, when the dK / dV fold
runs. That bookkeeping is the same fact in both families, so it lives here; a family module keeps what is its own
(launch configuration, program tables, kernels and launches) and plugs its launches into ``HostAttentionCache``.
Nothing here launches a kernel or imports a family (layering: tests/test_import_layers.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from gradsweep import uploads
from gradsweep.canonical import RowIdentity

LOG2E = 1.4426950408889634
PLAN_SLOTS = 64  # plans kept per family (an LRU keyed by row content)


def upload(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """int32 table to the device without stalling behind queued GPU work (done once per plan)."""
    return uploads.upload(np.ascontiguousarray(a, dtype=np.int32), device)


# ------------------------------------------------------------------------------------------------ steps
_STEPS: OrderedDict = OrderedDict()
_WORK: OrderedDict = OrderedDict()


def step(lengths: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int, tuple[int, ...]]:
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


def kv_work(lengths: np.ndarray, starts: np.ndarray, keys: int, device: torch.device) -> torch.Tensor:
    """Rows of the dK / dV launch (sample start token, first key, length), heaviest first; once per lengths.
    A pure function of its key, so both families may share the cache."""
    key = (lengths.tobytes(), keys, str(device))
    if key not in _WORK:
        blocks = (lengths + keys - 1) // keys
        s = np.repeat(np.arange(len(lengths)), blocks)
        k0 = (np.arange(len(s)) - np.repeat(np.cumsum(blocks) - blocks, blocks)) * keys
        work = np.stack([starts[s], k0, lengths[s]], axis=1)
        work = work[np.argsort(-(work[:, 2] - work[:, 1]), kind="stable")]
        _WORK[key] = upload(work.reshape(-1, 3), device)
        while len(_WORK) > 16:
            _WORK.popitem(last=False)
    return _WORK[key]


# ------------------------------------------------------------------------------------------------ runs
@dataclass(frozen=True)
class Runs:
    """A call's real rows as runs (consecutive rows of one sample at consecutive positions), checked against
    the step: what every plan is built from, whatever programs a family cuts from it."""

    first: np.ndarray   # first physical row of each run
    n: np.ndarray       # its rows
    s: np.ndarray       # its sample
    p0: np.ndarray      # its first position
    tok0: np.ndarray    # its first logical token
    n_real: int
    chain: tuple[np.ndarray, np.ndarray, np.ndarray]  # per sample: (sample, first position, end), see ``chains``
    full: bool          # the rows are every token of the step in logical order (the call is its own store)

    def scatter_index(self) -> tuple[np.ndarray, np.ndarray]:
        """(physical row, logical token) of each real row, in run order: the scatter's index tables."""
        run_of = np.repeat(np.arange(len(self.n)), self.n)
        off = np.arange(self.n_real) - np.repeat(np.cumsum(self.n) - self.n, self.n)
        return self.first[run_of] + off, self.tok0[run_of] + off


def _split(sample: np.ndarray, position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row, rows) of each run of real rows (sample >= 0) of a non-empty call."""
    brk = np.flatnonzero((sample[1:] != sample[:-1]) | (position[1:] != position[:-1] + 1)) + 1
    first = np.concatenate([[0], brk])
    n = np.diff(np.concatenate([first, [len(sample)]]))
    real = sample[first] >= 0
    return first[real], n[real]


def runs(sample: np.ndarray, position: np.ndarray, lengths: np.ndarray, starts: np.ndarray) -> Runs:
    """The call's runs, refused when a row lies outside the step or a sample's runs do not tile one range."""
    n_rows = len(sample)
    if n_rows:
        first, n = _split(sample, position)
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
    chain = chains(s, p0, n)
    nonempty = np.flatnonzero(lengths > 0)
    full = (n_real == n_rows == int(lengths.sum()) and len(s) == len(nonempty) and bool((s == nonempty).all())
            and bool((p0 == 0).all()) and bool((n == lengths[s]).all()) and bool((first == starts[s]).all()))
    return Runs(first, n, s, p0, tok0, n_real, chain, full)


def chains(s: np.ndarray, p0: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def chunk_runs(row0: np.ndarray, tok0: np.ndarray, pos0: np.ndarray, n: np.ndarray, per: int) -> np.ndarray:
    """Runs cut into pieces of at most ``per`` tokens: int64 [m, 4] (first row, first token, first position,
    tokens), the rows of a family's program tables."""
    chunks = (n + per - 1) // per
    idx = np.repeat(np.arange(len(n)), chunks)
    k = np.arange(len(idx)) - np.repeat(np.cumsum(chunks) - chunks, chunks)
    cnt = np.minimum(per, n[idx] - k * per)
    return np.stack([row0[idx] + k * per, tok0[idx] + k * per, pos0[idx] + k * per, cnt], axis=1)


def program_tables(table: np.ndarray, second: np.ndarray, device: torch.device) -> list[torch.Tensor]:
    """The pieces split in two program tables (``~second``, ``second``), each most key blocks first (load balance
    only: a program's bits do not depend on when it runs)."""
    out = []
    for sel in (~second, second):
        t = table[sel]
        t = t[np.argsort(-(t[:, 2] + t[:, 3]), kind="stable")]
        out.append(upload(t.reshape(-1, 4), device))
    return out


# ------------------------------------------------------------------------------------------------ the cache
class HostPlan(Protocol):
    """What the bookkeeping reads of a family's plan."""

    n_real: int
    has_pads: bool
    full: bool
    chain_sample: np.ndarray
    chain_first: np.ndarray
    chain_end: np.ndarray


class QueryFold:
    """Where the dK / dV fold over canonical query tiles stands: done once every token's backward has run."""

    def __init__(self, total: int, tile: int) -> None:
        self.tile = tile
        self.total_tokens = total
        self.tokens_in = 0
        self.done = False


class HostAttentionCache:
    """State of one layer over one step: the logical K / V (and Q, dO, lse, delta) stores and FP32 dK / dV.

    ``dk`` / ``dv``: optional FP32 [T, kv_heads, d] accumulators (main grads) the fold adds to; zero otherwise.
    A family subclass supplies its plans and launches as class attributes and ``_new_fold`` (and may refuse
    shapes in ``_check_head_dim``); the bookkeeping around them is the same in every family.
    """

    _plans: OrderedDict                # the family's plan LRU (its plans hold its program tables)
    _default_config: Any               # the family's AttnConfig when none is passed
    _build_plan: Callable[..., Any]    # (rows, lengths, starts, config, group, device) -> the family's plan
    _scatter: Callable[..., None]      # (plan, *(src, dst) pairs): dst[token] = src[row], one launch
    _launch_dkdv: Callable[..., None]  # (cache): the dK / dV fold, one launch (a static hook: pass self)

    def __init__(self, lengths: Sequence[int], heads: int, head_dim: int, device, *, kv_heads: int | None = None,
                 config: Any = None, dk: torch.Tensor | None = None, dv: torch.Tensor | None = None) -> None:
        self.config = self._default_config if config is None else config
        self.lengths, self.starts, self.total, lengths_key = step(tuple(int(n) for n in lengths))
        self.heads, self.head_dim = int(heads), int(head_dim)
        self.kv_heads = self.heads if kv_heads is None else int(kv_heads)
        if self.kv_heads <= 0 or self.heads % self.kv_heads:
            raise ValueError(f"attention: heads {self.heads} is not a multiple of kv_heads {self.kv_heads}; "
                             "use kv_heads that divides heads")
        self._check_head_dim()
        self.group = self.heads // self.kv_heads
        self.device = torch.device(device)
        self._key = (lengths_key, self.config, self.group, str(self.device))
        self._check_accumulators(dk, dv)
        self.dk, self.dv = dk, dv
        self._load_acc = dk is not None
        self.fold = self._new_fold()
        self._extent = np.zeros(len(self.lengths), dtype=np.int64)  # positions [0, extent) of a sample are written
        self._mode: str | None = None                               # "alias" or "store", fixed by the first call
        self.k = self.v = self.q = self.do = None
        self.lse = torch.empty((self.heads, self.total), dtype=torch.float32, device=self.device)
        self.delta: torch.Tensor | None = None

    def _check_accumulators(self, dk: torch.Tensor | None, dv: torch.Tensor | None) -> None:
        """The fold adds to the accumulators in place: they must be exactly what the kernels write."""
        shape_kv = (self.total, self.kv_heads, self.head_dim)
        for name, acc in (("dk", dk), ("dv", dv)):
            if acc is not None and (acc.dtype != torch.float32 or tuple(acc.shape) != shape_kv
                                    or not acc.is_contiguous() or acc.device != self.device):
                raise ValueError(f"attention: {name} must be a contiguous float32 tensor {shape_kv} on {self.device}")
        if (dk is None) != (dv is None):
            raise ValueError("attention: pass both dk and dv accumulators, or neither")

    # -- family hooks ------------------------------------------------------------------------------------------
    def _check_head_dim(self) -> None:
        """Refuse a head_dim the family's kernels cannot run (every head_dim by default)."""

    def _new_fold(self) -> QueryFold:
        """The fold's state at the start of the step (its tile is the family's)."""
        raise NotImplementedError

    # -- plans and bookkeeping (host, O(runs) per call) ---------------------------------------------------------
    def plan(self, rows: RowIdentity) -> Any:
        """The call's plan, built once per row content and config: every layer of a step reuses it, and so does
        a later step of the same layout. A plan depends only on which rows are real and where their samples and
        positions lie (pads and fillers take no program), which is what ``rows.runs`` holds."""
        key = (rows.num_rows, rows.runs.key, self._key)
        hit = self._plans.get(key)
        if hit is not None:
            self._plans.move_to_end(key)
            return hit
        plan = self._build_plan(rows, self.lengths, self.starts, self.config, self.group, self.device)
        self._plans[key] = plan
        while len(self._plans) > PLAN_SLOTS:
            self._plans.popitem(last=False)
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

    def _check_writes(self, plan: HostPlan) -> None:
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

    def _write(self, plan: HostPlan, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor | None) -> None:
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
        self._scatter(plan, (k, self.k), (v, self.v))
        if q is not None:
            if self.q is None:
                self.q = self._store(q)
            self._scatter(plan, (q, self.q))

    def _write_do(self, plan: HostPlan, do: torch.Tensor) -> None:
        if plan.n_real == 0:
            return
        if self._mode == "alias":
            self.do = do
            return
        if self.do is None:
            self.do = self._store(do)
        self._scatter(plan, (do, self.do))

    def _backward_done(self, plan: HostPlan) -> None:
        """Count the call's tokens into the fold; the call that completes the step launches dK / dV."""
        self.fold.tokens_in += plan.n_real
        if self.fold.tokens_in > self.total:
            raise ValueError("attention: a token's backward ran twice")
        if self.fold.tokens_in == self.total and not self.fold.done:
            self._launch_dkdv(self)
            self.fold.done = True
            self.q = self.do = None  # the fold read them; K / V stay (a cache may still be read)

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """FP32 dK, dV [T_total, kv_heads, d] (logical order); raises if some token never had its backward."""
        if not self.fold.done:
            if self.total:
                missing = self.total - self.fold.tokens_in
                raise ValueError(f"attention: {missing} tokens never reached the backward, so the dK / dV fold "
                                 "over canonical query tiles never completed")
            self._launch_dkdv(self)
            self.fold.done = True
        return self.dk, self.dv

    # -- the steps of a call around its launches ----------------------------------------------------------------
    def _begin_forward(self, rows: RowIdentity, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       need_grad: bool) -> tuple[Any, torch.Tensor]:
        """Plan, check and store the call's rows; the output buffer (zeros where pads take no program)."""
        plan = self.plan(rows)
        if plan.n_real and self.fold.done:
            raise ValueError("attention: this cache's dK / dV fold is complete; make a new AttentionCache per step")
        self._check_writes(plan)
        self._write(plan, k, v, q if need_grad else None)
        return plan, (torch.zeros_like(q) if plan.has_pads else torch.empty_like(q))

    def _begin_backward(self, plan: HostPlan, q: torch.Tensor, o: torch.Tensor,
                        do: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(dO contiguous and checked, the dQ buffer); delta's store exists from the first backward on."""
        do = do.contiguous()
        if do.dtype != o.dtype:
            raise ValueError(f"attention: the upstream gradient must be {o.dtype}, got {do.dtype}")
        if self.delta is None:
            self.delta = torch.empty((self.heads, self.total), dtype=torch.float32, device=self.device)
        return do, (torch.zeros_like(q) if plan.has_pads else torch.empty_like(q))

    def _end_backward(self, plan: HostPlan, do: torch.Tensor) -> None:
        """Keep the call's dO for the fold and count its tokens (the last call launches dK / dV)."""
        self._write_do(plan, do)
        self._backward_done(plan)

    def _fold_outputs(self) -> bool:
        """dK / dV exist before the fold (empty when no accumulator: the kernel starts from zero, the same bits
        as loading zeros); False when the step has no token to fold."""
        shape = (self.total, self.kv_heads, self.head_dim)
        if self.dk is None:
            self.dk = torch.empty(shape, dtype=torch.float32, device=self.device)
            self.dv = torch.empty(shape, dtype=torch.float32, device=self.device)
        return self.total != 0


# ------------------------------------------------------------------------------------------------ the call
def check_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: RowIdentity,
               cache: HostAttentionCache) -> None:
    """Shapes of a call against each other, the cache and the row identities (a family checks dtype / device)."""
    if q.dim() != 3 or k.dim() != 3 or v.shape != k.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"attention: q [R, heads, d] and k, v [R, kv_heads, d] expected, got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if (q.shape[1], k.shape[1], q.shape[2]) != (cache.heads, cache.kv_heads, cache.head_dim):
        raise ValueError(f"attention: rows have heads, kv_heads, d = {(q.shape[1], k.shape[1], q.shape[2])}, the "
                         f"cache {(cache.heads, cache.kv_heads, cache.head_dim)}")
    if rows.num_rows != q.shape[0]:
        raise ValueError(f"attention: {rows.num_rows} row identities for {q.shape[0]} rows")


Forward = Callable[..., tuple[torch.Tensor, Any]]
Backward = Callable[..., torch.Tensor]


def autograd_function(forward: Forward, backward: Backward) -> type[torch.autograd.Function]:
    """The autograd Function over a family's forward / backward: dQ flows back, dK / dV go to ``cache.finish()``."""

    class _AttentionFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, rows, cache):  # type: ignore[override]
            o, plan = forward(q, k, v, rows, cache, need_grad=True)
            ctx.save_for_backward(q, o)
            ctx.plan, ctx.cache = plan, cache
            return o

        @staticmethod
        def backward(ctx, do):  # type: ignore[override]
            q, o = ctx.saved_tensors
            dq = backward(q, o, do, ctx.plan, ctx.cache)
            return (dq if ctx.needs_input_grad[0] else None), None, None, None, None  # dK / dV: cache.finish()

    return _AttentionFn


def run_call(fn: type[torch.autograd.Function], forward: Forward, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, rows: RowIdentity, cache: HostAttentionCache) -> torch.Tensor:
    """Through autograd when a gradient is wanted, else the bare forward (no graph, no saved Q / O)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return fn.apply(q, k, v, rows, cache)
    return forward(q, k, v, rows, cache, need_grad=False)[0]
