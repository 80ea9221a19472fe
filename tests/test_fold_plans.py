"""The canonical fold's plans (issue 13): cheap to build, and exactly the plans (hence the bits) of before.

1. Main grads, outputs and input gradients of every folding Triton kernel, over layouts that carry tiles
   across calls (chunk boundaries inside tiles, reverse call order, one token per call, scrambled rows,
   hostile pads), hash to the digests recorded with the previous plan algorithm (row tables built from
   per-row slots): the new plans fold the same rows in the same order.
2. The plans themselves match an oracle that is the previous algorithm, call by call, on every layout.
3. The staging's host cost: a fresh fold's chunked step allocates its staging once and stages a call's rows with
   one gather and one scatter per row tensor, reading the oracle's rows.
"""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradsweep.canonical import CanonicalFold, RowIdentity, clear_plan_caches
from gradsweep.triton_kernels import embedding as emb_mod
from gradsweep.triton_kernels import gemm
from gradsweep.triton_kernels import linear_logp as ll
from gradsweep.triton_kernels import qk_norm as qk_mod
from gradsweep.triton_kernels import rms_norm as rms_mod

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN / inf pads

LENGTHS = [150, 5, 64, 1, 23, 37]
N = len(LENGTHS)
OFFSETS = np.concatenate([[0], np.cumsum(LENGTHS)])
TOTAL = int(OFFSETS[-1])
WHOLE = [(s, 0, n) for s, n in enumerate(LENGTHS)]
# chunk cuts on tile boundaries (32, 64, 128) and off them (37, 101, 1)
_CHUNKS = [[(0, 0, 37), (1, 0, 2)], [(0, 37, 64), (1, 2, 5), (2, 0, 32)], [(0, 64, 101), (2, 32, 64), (3, 0, 1)],
           [(0, 101, 128), (4, 0, 7), (5, 0, 32)], [(0, 128, 150), (4, 7, 23), (5, 32, 37)]]
# A layout: calls; a call: pieces (sample, start, stop) or ("pad", n) or ("scramble", seed) (shuffle the call)
LAYOUTS: dict[str, list[list[tuple]]] = {
    "bn_full": [WHOLE],
    "b1_singleton_reverse": [[w] for w in reversed(WHOLE)],
    "bn_chunked": _CHUNKS,
    "bn_chunked_reverse": _CHUNKS[::-1],
    "bn_padded": [[p for s, n in enumerate(LENGTHS) for p in ((s, 0, n), ("pad", 151 - n))]],
    "bn_scrambled": [[("pad", 3), *WHOLE[::-1], ("pad", 2), ("scramble", 7)]],
    "decode_tail": [[(s, 0, n - 3) for s, n in enumerate(LENGTHS) if n > 3]]
    + [[(s, n - 3 + i, n - 2 + i) for s, n in enumerate(LENGTHS) if n - 3 + i >= 0] for i in range(3)],
    "interleaved_halves": [[(s, n // 2, n) for s, n in enumerate(LENGTHS)],
                           [(s, 0, n // 2) for s, n in enumerate(LENGTHS) if n // 2]],
}


def _call(pieces: list[tuple]) -> tuple[torch.Tensor, RowIdentity]:
    """Logical row of every physical row (-1: pad) and the call's RowIdentity."""
    logical, sample, position = [], [], []
    perm_seed = None
    for piece in pieces:
        if piece[0] == "scramble":
            perm_seed = piece[1]
        elif piece[0] == "pad":
            logical += [-1] * piece[1]
            sample += [-1] * piece[1]
            position += [0] * piece[1]
        else:
            s, a, b = piece
            logical += range(int(OFFSETS[s]) + a, int(OFFSETS[s]) + b)
            sample += [s] * (b - a)
            position += range(a, b)
    idx, s_t, p_t = torch.tensor(logical), torch.tensor(sample), torch.tensor(position)
    if perm_seed is not None:
        perm = torch.randperm(len(logical), generator=torch.Generator().manual_seed(perm_seed))
        idx, s_t, p_t = idx[perm], s_t[perm], p_t[perm]
    return idx, RowIdentity(s_t, p_t)


def _gen(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(torch.bfloat16)


def _hostile(table: torch.Tensor, logical: torch.Tensor) -> torch.Tensor:
    """Physical rows; pad rows hold NaN, +inf and -inf (a pad that reaches a reduction poisons it)."""
    specials = torch.tensor([float("nan"), float("inf"), float("-inf")])
    n_pad = int((logical < 0).sum())
    pad = specials[torch.arange(n_pad * max(1, table[0].numel())) % 3].view(n_pad, *table.shape[1:])
    out = torch.empty(logical.numel(), *table.shape[1:], dtype=table.dtype)
    real = logical >= 0
    out[real] = table[logical[real]]
    out[~real] = pad.to(table.dtype)
    return out


class _Restored:
    """Logical copies of per-call outputs, and the bits of everything as one digest."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def put(self, name: str, phys: torch.Tensor, logical: torch.Tensor) -> None:
        if name not in self.tensors:
            self.tensors[name] = torch.zeros(TOTAL, *phys.shape[1:], dtype=phys.dtype)
        real = logical >= 0
        self.tensors[name][logical[real]] = phys.detach()[real]

    def digest(self) -> str:
        h = hashlib.sha256()
        for name in sorted(self.tensors):
            t = self.tensors[name].contiguous()
            h.update(name.encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.int64 else t.numpy().tobytes())
        return h.hexdigest()[:20]


HID, HEADS, HEAD_DIM, K, NOUT, V, VOCAB = 96, 3, 32, 48, 80, 300, 50
EPS = 1e-6
DATA = {
    "x": _gen(1, TOTAL, HID, scale=2.0), "dy": _gen(2, TOTAL, HID), "w": (1 + 0.2 * _gen(3, HID).float()).bfloat16(),
    "xq": _gen(4, TOTAL, HEADS, HEAD_DIM, scale=2.0), "dyq": _gen(5, TOTAL, HEADS, HEAD_DIM),
    "xg": _gen(6, TOTAL, K), "dyg": _gen(7, TOTAL, NOUT), "wg": _gen(8, NOUT, K, scale=0.3),
    "ids": torch.randint(0, VOCAB, (TOTAL,), generator=torch.Generator().manual_seed(9)),
    "table": _gen(10, VOCAB, HID),
    "h": _gen(11, TOTAL, K, scale=0.5), "wv": _gen(12, V, K, scale=0.3),
    "t": torch.randint(0, V, (TOTAL,), generator=torch.Generator().manual_seed(13)),
    "g": torch.randn(TOTAL, generator=torch.Generator().manual_seed(14)),
}


def _start(seed: int, *shape: int) -> torch.Tensor:
    """A main grad that already holds earlier micro-batches: the kernel must load it."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def run_rms_norm(calls) -> str:
    out, fold = _Restored(), CanonicalFold(_start(20, HID), LENGTHS, rms_mod.TILE)
    for pieces in calls:
        logical, rows = _call(pieces)
        x = _hostile(DATA["x"], logical).requires_grad_()
        y = rms_mod.rms_norm(x, DATA["w"], EPS, rows, fold)
        y.backward(_hostile(DATA["dy"], logical))
        out.put("y", y, logical)
        out.put("dx", x.grad, logical)
    out.tensors["main_grad"] = fold.finish()
    return out.digest()


def run_qk_norm(calls) -> str:
    out, fold = _Restored(), CanonicalFold(_start(21, HEAD_DIM), LENGTHS, qk_mod.TILE)
    for pieces in calls:
        logical, rows = _call(pieces)
        x = _hostile(DATA["xq"], logical).requires_grad_()
        y = qk_mod.qk_norm(x, DATA["w"][:HEAD_DIM].contiguous(), EPS, rows, fold)
        y.backward(_hostile(DATA["dyq"], logical))
        out.put("y", y, logical)
        out.put("dx", x.grad, logical)
    out.tensors["main_grad"] = fold.finish()
    return out.digest()


def run_det_linear(calls) -> str:
    out, fold = _Restored(), CanonicalFold(_start(22, NOUT, K), LENGTHS, gemm.TILE)
    for pieces in calls:
        logical, rows = _call(pieces)
        x = _hostile(DATA["xg"], logical).requires_grad_()
        y = gemm.det_linear(x, DATA["wg"].clone().requires_grad_(), rows, fold)
        y.backward(_hostile(DATA["dyg"], logical))
        out.put("y", y, logical)
        out.put("dx", x.grad, logical)
    out.tensors["main_grad"] = fold.finish()
    return out.digest()


def run_embedding(calls) -> str:
    out, fold = _Restored(), CanonicalFold(_start(23, VOCAB, HID), LENGTHS, emb_mod.TILE)
    for c, pieces in enumerate(calls):
        logical, rows = _call(pieces)
        ids = torch.randint(0, VOCAB, (logical.numel(),), generator=torch.Generator().manual_seed(30 + c))
        ids[logical >= 0] = DATA["ids"][logical[logical >= 0]]
        y = emb_mod.embedding(ids, DATA["table"].clone().requires_grad_(), rows, fold)
        y.backward(_hostile(DATA["dy"], logical))
        out.put("y", y, logical)
    out.tensors["main_grad"] = fold.finish()
    return out.digest()


def run_linear_logp(calls) -> str:
    out, fold = _Restored(), CanonicalFold(_start(24, V, K), LENGTHS, gemm.TILE)
    for c, pieces in enumerate(calls):
        logical, rows = _call(pieces)
        real = logical >= 0
        h = _hostile(DATA["h"], logical).requires_grad_()
        t = torch.randint(0, V, (logical.numel(),), generator=torch.Generator().manual_seed(40 + c))
        t[real] = DATA["t"][logical[real]]
        g = torch.full((logical.numel(),), float("nan"))
        g[real] = DATA["g"][logical[real]]
        logp = ll.linear_logp(h, DATA["wv"].clone().requires_grad_(), t, rows, fold)
        logp.backward(g)
        out.put("logp", logp, logical)
        out.put("dh", h.grad, logical)
    out.tensors["main_grad"] = fold.finish()
    return out.digest()


RUNS = {"rms_norm": run_rms_norm, "qk_norm": run_qk_norm, "det_linear": run_det_linear,
        "embedding": run_embedding, "linear_logp": run_linear_logp}
# Recorded with the previous plan algorithm (per-row slot tables, carried rows concatenated in front of the
# call's rows), triton 3.6 interpreter, tl.dot through _common.mma, on every layout of LAYOUTS (all equal);
# the same on an AVX2-only numpy (NPY_DISABLE_CPU_FEATURES=X86_V4) with OpenBLAS's Haswell kernels.
EXPECTED = {"rms_norm": "a3a4a7c399248a6dcdae", "qk_norm": "0ea10e2018cfeea4049a", "det_linear": "0b85cf7ab31dad309685",
            "embedding": "86a5e22f5a3a2945fd61", "linear_logp": "c98faa89130378a961de"}


# carried and split tiles in reverse call order; the general path (scrambled rows, NaN / inf pads)
DIGEST_LAYOUTS = ("bn_chunked_reverse", "bn_scrambled")


@pytest.mark.parametrize("op", list(RUNS))
def test_main_grads_and_outputs_keep_their_bits(op):
    got = {layout: RUNS[op](LAYOUTS[layout]) for layout in DIGEST_LAYOUTS}
    assert set(got.values()) == {EXPECTED[op]}, got


# ------------------------------------------------------------------------------------ the plans vs an oracle
class _PreviousFold:
    """The previous plan algorithm (per-row slots, a bitmap of seen tokens, carried rows concatenated in
    front of the call's rows, an int32 [tiles, tile] table): the oracle the new plans must equal."""

    def __init__(self, lengths: list[int], tile: int) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.tile = tile
        per = (self.lengths + tile - 1) // tile
        base = np.concatenate([[0], np.cumsum(per)])
        self.total = int(base[-1])
        owner = np.repeat(np.arange(len(per)), per)
        self.expected = np.minimum(tile, self.lengths[owner] - (np.arange(self.total) - base[owner]) * tile)
        self.slot_base = base[:-1] * tile
        self.count = np.zeros(self.total, dtype=np.int64)
        self.cursor = 0
        self.pending_slots = np.zeros(0, dtype=np.int64)
        self.pending: torch.Tensor | None = None

    def take(self, rows: RowIdentity, ident: torch.Tensor) -> tuple[int, torch.Tensor]:
        """(first tile, identity [tiles, tile, 2] of every slot folded now; -1 for a zero row)."""
        sample, position = rows.sample.numpy(), rows.position.numpy()
        real = np.flatnonzero(sample >= 0)
        slots = self.slot_base[sample[real]] + position[real]
        np.add.at(self.count, slots // self.tile, 1)
        incomplete = np.flatnonzero(self.count[self.cursor:] != self.expected[self.cursor:])
        new_cursor = self.cursor + int(incomplete[0]) if len(incomplete) else self.total
        n_pend = len(self.pending_slots)
        all_slots = np.concatenate([self.pending_slots, slots])
        row_index = np.concatenate([np.arange(n_pend), n_pend + real])
        source = ident if self.pending is None else torch.cat([self.pending, ident])
        first, end = self.cursor * self.tile, new_cursor * self.tile
        ready = (all_slots >= first) & (all_slots < end)
        plan = np.full(end - first, -1, dtype=np.int64)
        plan[all_slots[ready] - first] = row_index[ready]
        self.pending_slots = all_slots[~ready]
        self.pending = source[torch.as_tensor(row_index[~ready])] if (~ready).any() else None
        got = torch.where(torch.as_tensor(plan)[:, None] >= 0, source[torch.as_tensor(plan).clamp(min=0)], -1)
        step = (self.cursor, got.view(-1, self.tile, 2))
        self.cursor = new_cursor
        return step


def _identities(step, ident: torch.Tensor) -> torch.Tensor:
    """Identity [tiles, tile, 2] of every slot a TileStep folds (-1 for a zero row)."""
    tile = step.tile
    out = torch.full((step.num_tiles, tile, 2), -1, dtype=torch.int64)
    for t, (row0, count) in enumerate(step.host_desc.tolist()):
        src = ident if row0 >= 0 else step.stage[0]
        r = row0 if row0 >= 0 else -row0 - 1
        out[t, :count] = src[r:r + count]
    return out


def _random_calls(rng: np.random.Generator) -> list[RowIdentity]:
    """Every token once, cut into calls at random points (inside tiles too), calls and rows shuffled at times,
    pads sprinkled in."""
    tokens = [(s, p) for s, n in enumerate(LENGTHS) for p in range(n)]
    if rng.random() < 0.3:  # samples in another order
        order = rng.permutation(N)
        tokens = [(s, p) for s in order for p in range(LENGTHS[s])]
    cuts = sorted(rng.choice(np.arange(1, TOTAL), size=int(rng.integers(0, 12)), replace=False).tolist())
    calls = [tokens[a:b] for a, b in zip([0, *cuts], [*cuts, TOTAL])]
    if rng.random() < 0.4:
        calls = calls[::-1]
    out = []
    for call in calls:
        call = list(call)
        if rng.random() < 0.2:
            call = [call[i] for i in rng.permutation(len(call))]
        if rng.random() < 0.3:
            for _ in range(int(rng.integers(1, 4))):
                call.insert(int(rng.integers(0, len(call) + 1)), (-1, 0))
        out.append(RowIdentity(torch.tensor([s for s, _ in call]), torch.tensor([p for _, p in call])))
    return out


@pytest.mark.parametrize("tile", [1, 4, 32, 64])
def test_plans_equal_the_previous_algorithm(tile):
    rng = np.random.default_rng(tile)
    named = {name: [_call(pieces)[1] for pieces in calls] for name, calls in LAYOUTS.items()}
    named.update({f"random{i}": _random_calls(rng) for i in range(40)})
    for name, calls in named.items():
        old, new = _PreviousFold(LENGTHS, tile), CanonicalFold(torch.zeros(1), LENGTHS, tile)
        for k, rows in enumerate(calls):
            ident = torch.stack([rows.sample, rows.position], 1)
            first, want = old.take(rows, ident)
            step = new.take_tiles(rows, (ident,))
            assert step.first_tile == first and torch.equal(_identities(step, ident), want), f"{name} call {k}"
        assert new.done and old.cursor == old.total, name


def test_legacy_table_plans_equal_the_previous_algorithm():
    rng = np.random.default_rng(99)
    for trial in range(30):
        calls = _random_calls(rng)
        old, new = _PreviousFold(LENGTHS, 32), CanonicalFold(torch.zeros(1), LENGTHS, 32)
        for rows in calls:
            ident = torch.stack([rows.sample, rows.position], 1)
            first, want = old.take(rows, ident)
            step = new.take(rows, (ident,))
            src = step.tensors[0]
            got = torch.where(step.plan.long()[..., None] >= 0, src[step.plan.long().clamp(min=0)], -1)
            assert step.first_tile == first and torch.equal(got, want), trial


def test_runs_in_closed_form_equal_runs_found_from_rows():
    ident = RowIdentity.packed([5, 0, 3, 7], sample_ids=[2, 0, 2, 1], starts=[0, 0, 5, 3])
    found = RowIdentity(ident.sample.clone(), ident.position.clone()).runs
    assert [r.tolist() for r in (found.sample, found.pos0, found.row0, found.length)] == \
        [[2, 1], [0, 3], [0, 8], [8, 7]]  # the two pieces of sample 2 continue each other: one run
    assert all(np.array_equal(a, b) for a, b in zip(
        (found.sample, found.pos0, found.row0, found.length),
        (ident.runs.sample, ident.runs.pos0, ident.runs.row0, ident.runs.length)))
    padded = RowIdentity.from_runs(10, [1, 0], [0, 4], [6, 0], [4, 3])
    assert padded.sample.tolist() == [0, 0, 0, -1, -1, -1, 1, 1, 1, 1]
    assert padded.position.tolist() == [4, 5, 6, 0, 0, 0, 0, 1, 2, 3]
    with pytest.raises(ValueError, match="share a row"):
        RowIdentity.from_runs(4, [0, 1], [0, 0], [0, 1], [2, 2])


def test_fold_refuses_bad_rows():
    fold = CanonicalFold(torch.zeros(1), [4, 4], 4)
    with pytest.raises(ValueError, match="outside the step"):
        fold.take_tiles(RowIdentity.packed([1], sample_ids=[2]), ())
    with pytest.raises(ValueError, match="outside its sample"):
        fold.take_tiles(RowIdentity.packed([2], starts=[3]), ())
    fold.take_tiles(RowIdentity.packed([2]), ())
    with pytest.raises(ValueError, match="twice"):
        fold.take_tiles(RowIdentity.packed([3]), ())
    with pytest.raises(ValueError, match="twice"):
        fold.take_tiles(RowIdentity(torch.tensor([1, 1]), torch.tensor([2, 2])), ())


# ------------------------------------------------------------------ the staging's host cost (issue 13, cold plan)
class _TorchOps(TorchDispatchMode):
    """Counts the torch operations dispatched (each one a launch or a host-side call on the GPU host)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _thirds_step(lengths: list[int]) -> list[RowIdentity]:
    """Every sample cut in three pieces, piece k of every sample packed into call k (the fold_plan bench's
    chunked step): the first call carries every later sample's rows, the second about twice as many."""
    cuts = [[n // 3, n // 3, n - 2 * (n // 3)] for n in lengths]
    return [RowIdentity.packed([c[k] for c in cuts], list(range(len(lengths))), [sum(c[:k]) for c in cuts])
            for k in range(3)]


def test_chunked_step_stages_with_one_allocation_and_two_ops_per_tensor():
    """A fresh fold's chunked step allocates each staging tensor once (room for the doubling of the carried rows:
    no regrow, no copy of staged rows), makes no staging view the kernels do not take, and stages each call's
    rows with one gather and one scatter per row tensor (the index split by one unbind); a second fold of the
    step (replayed calls) does the same. The rows every tile reads, staged ones included, are the oracle's."""
    tile = 4
    calls = _thirds_step(LENGTHS)
    clear_plan_caches()
    for attempt in ("cold", "replay"):
        old, fold = _PreviousFold(LENGTHS, tile), CanonicalFold(torch.zeros(1), LENGTHS, tile)
        ops = []
        for k, rows in enumerate(calls):
            ident = torch.stack([rows.sample, rows.position], 1)
            first, want = old.take(rows, ident)
            with _TorchOps() as seen:
                step = fold.take_tiles(rows, (ident, ident.double()))
            ops.append(seen.counts)
            assert step.first_tile == first and torch.equal(_identities(step, ident), want), (attempt, k)
            for row0, count in step.host_desc.tolist():  # the second tensor's staged rows: the same rows
                if row0 < 0:
                    r = -row0 - 1
                    assert torch.equal(step.stage[1][r:r + count], step.stage[0][r:r + count].double()), (attempt, k)
        assert fold.done
        assert [c["empty"] for c in ops] == [2, 0, 0], (attempt, ops)  # the staging, allocated by the first call
        assert not any(c["copy_"] or c["select"] or c["slice"] for c in ops), (attempt, ops)
        assert all((c["unbind"], c["index_select"], c["index_copy_"]) == (1, 2, 2) for c in ops), (attempt, ops)
        assert fold._stage_blocks == 26 and fold._backing[0].shape[0] == 26 * tile  # 13 blocks, then 26
    clear_plan_caches()


def test_staging_room_is_bounded_by_the_tiles_left():
    """The staging's room for doubling never exceeds the tiles not yet folded: a step whose first call carries a
    tile of each of its four samples allocates those four blocks, not eight."""
    tile = 64
    fold = CanonicalFold(torch.zeros(1), [64] * 4, tile)
    first = RowIdentity.packed([32] * 4, [0, 1, 2, 3])
    step = fold.take_tiles(first, (torch.zeros(128, 2),))
    assert step.num_tiles == 0 and fold._stage_blocks == 4 and fold._backing[0].shape[0] == 4 * tile
    step = fold.take_tiles(RowIdentity.packed([32] * 4, [0, 1, 2, 3], [32] * 4), (torch.ones(128, 2),))
    assert step.num_tiles == 4 and fold.done and step.stage[0].shape[0] == 4 * tile


if __name__ == "__main__":  # print the digests (to record them after a deliberate change of the bits)
    for name, fn in RUNS.items():
        print(name, {layout: fn(calls) for layout, calls in LAYOUTS.items()})
