"""Triton causal attention (KV cache across calls, folded dK / dV) under the interpreter.

Accuracy bound (the only tolerance here): normwise relative error ||ours - ref|| / ||ref|| < REL_BOUND
against a float64 reference fed the same bf16 inputs. With u = 2^-8 (bf16 unit roundoff): o and dq are
rounded once to bf16 (u); p and dS enter the tensor-core products rounded to bf16 (u relative each,
partly cancelling through the row sum taken from the same rounded p); FP32 accumulation adds ~1e-7.
So the error is a few u at most; REL_BOUND = 4u = 2^-6 leaves room for that and no room for a wrong
formula (errors O(1)).

Invariance is bitwise (raw bits, NaN-aware) against one packed call (B=N): N x B=1, irregular chunked
prefill (keys of earlier chunks from the cache), pads (right / left, random garbage), permuted
samples, filler samples (sample -1) and decode; the backward of all calls runs at once (like the
harness) or call by call in reverse order. Planted defects (dK / dV summed per call; a key block size
that follows the call) must change bits.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any triton kernel module is imported

import dataclasses
from collections.abc import Callable

import pytest
import torch

from gradsweep.canonical import RowIdentity
from gradsweep.triton_kernels import attention as attn
from gradsweep.triton_kernels._common import INTERPRET, same_bits

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exp2 of masked / no-op lanes

REL_BOUND = 2.0 ** -6
LENGTHS = [37, 5, 64, 1, 23]
HEADS, HEAD_DIM = 3, 32
N = len(LENGTHS)
OFFSETS = [sum(LENGTHS[:i]) for i in range(N + 1)]
TOTAL = OFFSETS[-1]
NAMES = ("o", "dq", "dk", "dv")

# A layout: list of calls; a call: list of pieces, (sample, start, stop) or ("pad", n).
_CUTS = {s: sorted({0, n, (n * 2) // 7, (n * 3) // 5, (n * 5) // 6}) for s, n in enumerate(LENGTHS)}
_TAIL = 5  # decode: prefill all but the last _TAIL tokens of each sample, then one token per call
LAYOUTS: dict[str, list[list[tuple]]] = {
    "b1_singleton": [[(s, 0, LENGTHS[s])] for s in range(N)],
    "bn_chunked": [
        [(s, c[k], c[k + 1]) for s, c in _CUTS.items() if k + 1 < len(c)]
        for k in range(max(len(c) for c in _CUTS.values()) - 1)
    ],
    "bn_chunked_stream": [[(0, 0, 20)], [(0, 20, 37), (1, 0, 5), (2, 0, 40)], [(2, 40, 64), (3, 0, 1), (4, 0, 7)],
                          [(4, 7, 23)]],
    "bn_padded_right": [[p for s in range(N) for p in ((s, 0, LENGTHS[s]), ("pad", max(LENGTHS) - LENGTHS[s]))]],
    "bn_padded_left": [[p for s in range(N) for p in (("pad", max(LENGTHS) - LENGTHS[s] + 1), (s, 0, LENGTHS[s]))]],
    "bn_permuted": [[(s, 0, LENGTHS[s]) for s in (3, 0, 4, 2, 1)]],
    "bn_fillers": [[p for s in range(N) for p in ((s, 0, LENGTHS[s]), ("pad", (9, 16, 3)[s % 3]))]],
    "decode": [[(s, 0, LENGTHS[s] - _TAIL) for s in range(N) if LENGTHS[s] > _TAIL]]
    + [[(s, p, p + 1) for s in range(N) if 0 <= (p := LENGTHS[s] - _TAIL + i)] for i in range(_TAIL)],
}
FULL = [[(s, 0, LENGTHS[s]) for s in range(N)]]


def _data(seed: int = 0, total: int = TOTAL, heads: int = HEADS, dim: int = HEAD_DIM) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(total, heads, dim, generator=g).to(torch.bfloat16) for n in ("q", "k", "v", "do")}


DATA = _data()


def _rows(pieces: list[tuple]) -> RowIdentity:
    sample, position = [], []
    for piece in pieces:
        if piece[0] == "pad":
            sample += [-1] * piece[1]
            position += list(range(piece[1]))
        else:
            s, a, b = piece
            sample += [s] * (b - a)
            position += list(range(a, b))
    return RowIdentity(torch.tensor(sample, dtype=torch.int64), torch.tensor(position, dtype=torch.int64))


def run_layout(calls: list[list[tuple]], config: attn.AttnConfig | None = None, backward: str = "all",
               before_call: Callable[[attn.AttentionCache, RowIdentity], None] | None = None,
               data: dict[str, torch.Tensor] = DATA, lengths: list[int] = LENGTHS) -> dict[str, torch.Tensor]:
    """Run the calls, backward, and restore o / dq (per call) and dk / dv (folded) to logical order.

    backward: "all" (one autograd call over every output, like the harness), "forward" or "reverse"
    (one call's backward after another, in call order or reversed).
    """
    total, heads, dim = data["q"].shape
    offsets = torch.tensor([sum(lengths[:i]) for i in range(len(lengths))], dtype=torch.int64)
    cache = attn.AttentionCache(lengths, heads, dim, "cpu", config=config)
    g = torch.Generator().manual_seed(123)
    outs, grads, kept = [], [], []
    for pieces in calls:
        rows = _rows(pieces)
        pad = rows.sample < 0
        idx = torch.where(pad, 0, offsets[rows.sample.clamp(min=0)] + rows.position)
        garbage = 50 * torch.randn(rows.num_rows, heads, dim, generator=g)

        def pick(name: str) -> torch.Tensor:
            return torch.where(pad[:, None, None], garbage, data[name][idx].float()).to(torch.bfloat16)  # noqa: B023

        q, k, v = (pick(n).requires_grad_(True) for n in ("q", "k", "v"))
        if before_call is not None:
            before_call(cache, rows)
        o = attn.attention(q, k, v, rows, cache)
        assert torch.isfinite(o.float()).all()
        outs.append(o)
        grads.append(pick("do"))
        kept.append((rows, idx, q, k, v))
    if backward == "all":
        torch.autograd.backward(outs, grads)
    else:
        pairs = list(zip(outs, grads))
        for o, do in reversed(pairs) if backward == "reverse" else pairs:
            torch.autograd.backward([o], [do])
    res = {"o": torch.zeros(total, heads, dim, dtype=torch.bfloat16), "dq": torch.zeros(total, heads, dim,
                                                                                       dtype=torch.bfloat16)}
    for o, (rows, idx, q, k, v) in zip(outs, kept):
        assert k.grad is None and v.grad is None  # folded, never returned through autograd
        real = rows.sample >= 0
        res["o"][idx[real]] = o.detach()[real]
        res["dq"][idx[real]] = q.grad[real]
    res["dk"], res["dv"] = cache.finish()
    return res


def reference(data: dict[str, torch.Tensor] = DATA, lengths: list[int] = LENGTHS) -> dict[str, torch.Tensor]:
    """float64 causal attention per sample and its VJP."""
    q, k, v = (data[n].double().requires_grad_(True) for n in ("q", "k", "v"))
    dim = q.shape[-1]
    outs, start = [], 0
    for n in lengths:
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
        s = (qs @ ks.transpose(-1, -2)) / dim ** 0.5
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        outs.append((torch.softmax(s, -1) @ vs).transpose(0, 1))
        start += n
    o = torch.cat(outs)
    o.backward(data["do"].double())
    return {"o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


@pytest.fixture(scope="module")
def full() -> dict[str, torch.Tensor]:
    return run_layout(FULL)


def test_interpreter_is_on():
    assert INTERPRET and attn.DEFAULT_CONFIG == attn.INTERPRET_CONFIG


def test_accuracy_vs_float64(full):
    ref = reference()
    for name in NAMES:
        assert _rel(full[name], ref[name]) < REL_BOUND, name


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_bitwise_invariance(full, layout):
    got = run_layout(LAYOUTS[layout])
    for name in NAMES:
        assert same_bits(got[name], full[name]), f"{layout}: {name} differs from one packed call"


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_backward_call_by_call(full, order):
    got = run_layout(LAYOUTS["bn_chunked"], backward=order)
    for name in NAMES:
        assert same_bits(got[name], full[name]), name


# Key blocks wider than the fold tile (as on the GPU), samples of several tiles and programs.
CFG2 = dataclasses.replace(attn.INTERPRET_CONFIG, bm=32, bn=32, dq_bm=16, dq_bn=32, kv_bn=32, tile=16)
# Canonical tiles complete in call order: sample 2's first tile folds with the first call's backward,
# its other three with the second's.
STREAM = [[(0, 0, 37), (1, 0, 5), (2, 0, 20)], [(2, 20, 64), (3, 0, 1), (4, 0, 23)]]


@pytest.fixture(scope="module")
def full2() -> dict[str, torch.Tensor]:
    return run_layout(FULL, config=CFG2)


def test_other_block_shapes_accurate_and_invariant(full2):
    ref = reference()
    got = run_layout(STREAM, config=CFG2, backward="forward")
    for name in NAMES:
        assert _rel(full2[name], ref[name]) < REL_BOUND, name
        assert same_bits(got[name], full2[name]), name


def test_odd_head_dim_single_head_and_empty_calls():
    lengths = [5, 17]
    data = _data(seed=3, total=sum(lengths), heads=1, dim=24)
    ref = reference(data, lengths)
    calls = [[("pad", 3)], [], [(1, 0, 9), (0, 0, 2)], [(0, 2, 5), (1, 9, 17)]]
    got = run_layout(calls, data=data, lengths=lengths)
    for name in NAMES:
        assert _rel(got[name], ref[name]) < REL_BOUND, name


def test_planted_dkdv_summed_per_call_is_caught(monkeypatch, full2):
    """dK / dV folded into a per-call zero buffer then added: accurate, yet layout-dependent (a key
    block that got a tile in the first call's backward gets three more in the second's)."""
    real = attn._launch_dkdv

    def per_call(cache: attn.AttentionCache, step) -> None:
        kept = cache.dk.clone(), cache.dv.clone()
        cache.dk.zero_()
        cache.dv.zero_()
        real(cache, step)
        cache.dk += kept[0]
        cache.dv += kept[1]

    monkeypatch.setattr(attn, "_launch_dkdv", per_call)
    got = run_layout(STREAM, config=CFG2, backward="forward")
    ref = reference()
    assert _rel(got["dk"], ref["dk"]) < REL_BOUND and _rel(got["dv"], ref["dv"]) < REL_BOUND
    assert not (same_bits(got["dk"], full2["dk"]) and same_bits(got["dv"], full2["dv"]))


def test_planted_key_block_following_the_call_is_caught(full):
    """Forward key blocks sized by the call's row count: the online-softmax order follows the layout."""

    def resize(cache: attn.AttentionCache, rows: RowIdentity) -> None:
        bn = 16 if rows.num_rows < 40 else 32
        cache.config = dataclasses.replace(cache.config, bn=bn)

    got = run_layout(LAYOUTS["bn_chunked"], before_call=resize)
    assert _rel(got["o"], reference()["o"]) < REL_BOUND
    assert not same_bits(got["o"], full["o"])


def test_refuses_queries_before_their_keys_and_unfinished_folds():
    cache = attn.AttentionCache(LENGTHS, HEADS, HEAD_DIM, "cpu")
    q = DATA["q"][OFFSETS[0] + 10:OFFSETS[0] + 12]
    with pytest.raises(ValueError, match="never written"):
        attn.attention(q, q, q, RowIdentity.packed([2], [0], [10]), cache)
    cache = attn.AttentionCache(LENGTHS, HEADS, HEAD_DIM, "cpu")
    q = DATA["q"][:4].clone().requires_grad_(True)
    attn.attention(q, q.detach(), q.detach(), RowIdentity.packed([4], [0], [0]), cache).sum().backward()
    with pytest.raises(ValueError, match="never completed"):
        cache.finish()
