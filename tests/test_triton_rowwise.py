"""Triton kernels, first half (rms_norm, qk_norm, rope, silu, swiglu, embedding, pack) under the interpreter.

Every op's accuracy and bitwise invariance on every layout of the default manifest is judged by the
sweep's own machinery (tests/test_ops_cells.py); here, through the same public ``check_kernel``: odd feature
sizes, a planted layout-dependent dweight that must be red, and the properties that are exact by
construction (a gather and pack / unpack are bit copies, pack's adjoint is unpack, dx does not depend on
whether a fold is given). No tolerance lives here: accuracy goes through manifests/contract.yaml.
"""

from __future__ import annotations

import ast
import math
import pathlib

import pytest
import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.contract import load_contract
from gradsweep.harness.accuracy import check_accuracy, stock_error_of
from gradsweep.harness.kernel_check import candidate_from, check_kernel
from gradsweep.manifest import DEFAULT_MANIFEST, load_manifest
from gradsweep.ops.base import CallContext, CallOutput
from gradsweep.results import Status
from gradsweep.triton_kernels import embedding as emb_mod
from gradsweep.triton_kernels import pack as pack_mod
from gradsweep.triton_kernels import qk_norm as qk_mod
from gradsweep.triton_kernels import rms_norm as rms_mod
from gradsweep.triton_kernels._common import INTERPRET, same_bits
from gradsweep.triton_kernels.rope import rope
from gradsweep.triton_kernels.silu import silu
from gradsweep.triton_kernels.swiglu import swiglu

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN / inf pads

LENGTHS = [37, 5, 64, 1, 23]
HIDDEN, HEADS, HEAD_DIM, VOCAB = 96, 3, 32, 50
EPS, THETA = 1e-6, 10000.0
TOTAL = sum(LENGTHS)


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(torch.bfloat16)


# ----------------------------------------------------------------------------- judged by the sweep's machinery
ODD = [("rms_norm", {"hidden": 100}), ("qk_norm", {"heads": 5, "head_dim": 20}), ("rope", {"heads": 5, "head_dim": 20}),
       ("swiglu", {"features": 100}), ("embedding", {"vocab": 37, "hidden": 100})]


@pytest.mark.parametrize(("op", "shape"), ODD, ids=[op for op, _ in ODD])
def test_odd_feature_sizes_green_through_the_contract(op, shape):
    """Feature sizes that are not powers of two (masked block tails), on layouts that split tiles and pad."""
    report = check_kernel(op, f"triton.{op}", shape=shape, layouts=["bn_chunked", "bn_padded_left"])
    assert report.ok, report.first_failure


class _PerCallDweight(torch.autograd.Function):
    """PLANTED DEFECT: dweight of each call by one tl.sum over its real rows (order follows R), added to the
    main grad; dx and the fold's bookkeeping as the real kernel's, so only the order is wrong."""

    @staticmethod
    def forward(ctx, x, w, rows, fold):  # type: ignore[override]
        ctx.save_for_backward(x, w)
        ctx.rows, ctx.fold = rows, fold
        return rms_mod.rms_norm_forward(x, w, EPS)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, w = ctx.saved_tensors
        dx = rms_mod.rms_norm_backward(x, w, dy, EPS, None, None)
        real = ctx.rows.sample >= 0
        xr, dyr = x[real].contiguous(), dy[real].contiguous()
        part = torch.empty(x.shape[1], dtype=torch.float32)
        _per_call_dweight_kernel[(1,)](xr, dyr, part, xr.shape[0], x.shape[1], EPS,
                                       BR=triton.next_power_of_2(max(xr.shape[0], 1)),
                                       BLOCK=triton.next_power_of_2(x.shape[1]))
        ctx.fold.main_grad += part
        ctx.fold.take_tiles(ctx.rows, ())
        return dx, None, None, None


@triton.jit
def _per_call_dweight_kernel(x_ptr, dy_ptr, out_ptr, n_rows, H, eps, BR: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.arange(0, BR)
    c = tl.arange(0, BLOCK)
    m = (r < n_rows)[:, None] & (c < H)[None, :]
    off = r[:, None] * H + c[None, :]
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)
    tl.store(out_ptr + c, tl.sum(dy * x * rstd[:, None], axis=0), mask=c < H)


def _per_call_dweight(ctx: CallContext) -> CallOutput:
    y = _PerCallDweight.apply(ctx.inputs["x"], ctx.params["weight"], ctx.rows, ctx.fold("weight"))
    return CallOutput({"y": y})


def test_planted_per_call_dweight_is_red_where_a_call_is_split():
    planted = candidate_from("rms_norm", "planted.per_call_dweight", "triton", _per_call_dweight,
                             param_grads="fold", fold_tiles=lambda: {"weight": rms_mod.TILE})
    report = check_kernel("rms_norm", planted, layouts=["bn_full", "bn_chunked", "b1_singleton", "bn_padded_left"])
    reds = {lay for lay, s in report.statuses().items() if s != Status.GREEN}
    assert reds == {"bn_chunked", "b1_singleton"}, report.statuses()
    assert "dweight gradient_invariance" in report.cells["bn_chunked"].first_failure


def test_rope_at_a_large_position_is_accurate_through_the_contract():
    """The angle comes from the integer position in FP32 inside the kernel, never from a bf16 table."""
    x = _randn(4, HEADS, HEAD_DIM, seed=8)
    pos = torch.tensor([70000, 123457, 999, 1])
    half = HEAD_DIM // 2

    def rotated(dtype: torch.dtype, table_dtype: torch.dtype) -> torch.Tensor:
        ang = pos.to(dtype)[:, None] * THETA ** (-torch.arange(half, dtype=dtype) * 2 / HEAD_DIM)[None, :]
        c, s = ang.cos().to(table_dtype)[:, None, :], ang.sin().to(table_dtype)[:, None, :]
        v = x.to(table_dtype)
        return torch.cat([v[..., :half] * c - v[..., half:] * s, v[..., half:] * c + v[..., :half] * s], -1)

    contract = load_contract(load_manifest(DEFAULT_MANIFEST).contract_path)
    klass = contract.accumulation_class("rope", "y", "triton")
    reference = rotated(torch.float64, torch.float64)
    check = check_accuracy(contract, "rope", "triton_interpret", "y", "forward", klass, rope(x, pos, THETA),
                           reference, stock_error=stock_error_of(rotated(torch.float32, torch.bfloat16), reference))
    assert check.ok, check


# ------------------------------------------------------------------------------- exact by construction
def test_rms_norm_dx_does_not_depend_on_the_fold_and_needs_one():
    x = _randn(TOTAL, HIDDEN, seed=3, scale=2.0)
    dy = _randn(TOTAL, HIDDEN, seed=4)
    w = (1.0 + 0.2 * _randn(HIDDEN, seed=2).float()).to(torch.bfloat16)
    rows = RowIdentity.packed(LENGTHS)
    fold = CanonicalFold(torch.zeros(HIDDEN), LENGTHS, rms_mod.TILE)
    with_fold = rms_mod.rms_norm_backward(x, w, dy, EPS, rows, fold)
    without = rms_mod.rms_norm_backward(x, w, dy, EPS, None, None)
    assert same_bits(with_fold, without) and fold.done
    with pytest.raises(ValueError, match="fold"):
        rms_mod.rms_norm(x, w.clone().requires_grad_(True), EPS, rows, None)


def test_zero_rows() -> None:
    w = torch.ones(HIDDEN, dtype=torch.bfloat16)
    rows0 = RowIdentity.packed([])
    fold = CanonicalFold(torch.zeros(HIDDEN), [], rms_mod.TILE)
    x = torch.zeros(0, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    rms_mod.rms_norm(x, w, EPS, rows0, fold).sum().backward()
    assert x.grad.shape == (0, HIDDEN) and fold.done
    xq = torch.zeros(0, HEADS, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True)
    fq = CanonicalFold(torch.zeros(HEAD_DIM), [], qk_mod.TILE)
    qk_mod.qk_norm(xq, w[:HEAD_DIM].contiguous(), EPS, rows0, fq).sum().backward()
    rope(xq, torch.zeros(0, dtype=torch.int64), THETA).sum().backward()
    s = torch.zeros(0, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    silu(s).sum().backward()
    swiglu(s, s).sum().backward()
    fe = CanonicalFold(torch.zeros(VOCAB, HIDDEN), [], emb_mod.TILE)
    table = _randn(VOCAB, HIDDEN, seed=13).requires_grad_(True)
    emb_mod.embedding(torch.zeros(0, dtype=torch.int64), table, rows0, fe).sum().backward()
    p = torch.zeros(2, 3, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    packed = pack_mod.pack(p, torch.tensor([0, 0]))
    assert packed.shape == (0, HIDDEN)
    packed.sum().backward()
    assert pack_mod.unpack(packed, torch.tensor([0, 0]), 3).shape == (2, 3, HIDDEN)


def test_embedding_gather_is_a_bit_copy_and_the_gradient_only_folds():
    table = _randn(VOCAB, HIDDEN, seed=13)
    ids = torch.randint(0, VOCAB, (TOTAL + 5,), generator=torch.Generator().manual_seed(14))
    rows = RowIdentity.from_runs(TOTAL + 5, range(len(LENGTHS)), [0] * len(LENGTHS),
                                 [sum(LENGTHS[:i]) + i for i in range(len(LENGTHS))], LENGTHS)  # a pad after each
    w = table.clone().requires_grad_(True)
    fold = CanonicalFold(torch.zeros(VOCAB, HIDDEN), LENGTHS, emb_mod.TILE)
    y = emb_mod.embedding(ids, w, rows, fold)
    assert same_bits(y.detach(), table[ids])  # pads included: a gather copies bits
    y.backward(torch.full_like(y, float("nan")).masked_fill((rows.sample >= 0)[:, None], 1.0))
    assert w.grad is None and fold.done  # dweight only through the fold; NaN pad gradients never reach it
    assert torch.isfinite(fold.main_grad).all()
    counts = torch.bincount(ids[rows.sample >= 0], minlength=VOCAB).float()
    assert torch.equal(fold.main_grad, counts[:, None].expand(VOCAB, HIDDEN))  # sums of ones: exact


def test_pack_unpack_exact_adjoint_invariant() -> None:
    n = len(LENGTHS)
    offsets = [sum(LENGTHS[:i]) for i in range(n + 1)]
    lengths = torch.tensor(LENGTHS)
    flat = _randn(TOTAL, HIDDEN, seed=16)
    padded = {}
    for max_len in (max(LENGTHS), max(LENGTHS) + 9):  # two pad widths, pads full of NaN
        x = torch.full((n, max_len, HIDDEN), float("nan"), dtype=torch.bfloat16)
        for s in range(n):
            x[s, : LENGTHS[s]] = flat[offsets[s]: offsets[s + 1]]
        xg = x.clone().requires_grad_(True)
        packed = pack_mod.pack(xg, lengths)
        assert same_bits(packed.detach(), flat)  # exact copy, pads excluded
        dy = _randn(TOTAL, HIDDEN, seed=18)
        packed.backward(dy)
        un = pack_mod.unpack(dy, lengths, max_len)
        assert same_bits(xg.grad, un)  # pack's adjoint is unpack
        for s in range(n):
            assert same_bits(un[s, : LENGTHS[s]], dy[offsets[s]: offsets[s + 1]])
            assert not un[s, LENGTHS[s]:].any()
        pg = flat.clone().requires_grad_(True)
        out = pack_mod.unpack(pg, lengths, max_len)
        dyp = _randn(n, max_len, HIDDEN, seed=19)
        out.backward(dyp)
        assert same_bits(pg.grad, pack_mod.pack(dyp, lengths))  # unpack's adjoint is pack
        padded[max_len] = out.detach()
    # the same sample alone (B=1) or in another order gives the same rows
    for s in range(n):
        one = pack_mod.pack(padded[max(LENGTHS)][s: s + 1], lengths[s: s + 1])
        assert same_bits(one, flat[offsets[s]: offsets[s + 1]])
    perm = [3, 0, 4, 2, 1]
    permuted = pack_mod.pack(padded[max(LENGTHS)][perm], lengths[perm])
    assert same_bits(permuted, torch.cat([flat[offsets[s]: offsets[s + 1]] for s in perm]))


def test_norm_zero_rows_stay_zero_with_eps_zero():
    """A tile's absent rows are zero rows: with eps = 0 their rsqrt is inf, and 0 * inf must not reach dweight."""
    x = _randn(5, HIDDEN, seed=20)
    dy = _randn(5, HIDDEN, seed=21)
    w = torch.ones(HIDDEN, dtype=torch.bfloat16)
    fold = CanonicalFold(torch.zeros(HIDDEN), [5], rms_mod.TILE)  # one tile: 5 rows, 27 zero rows
    rms_mod.rms_norm_backward(x, w, dy, 0.0, RowIdentity.packed([5]), fold)
    assert torch.isfinite(fold.main_grad).all()
    fq = CanonicalFold(torch.zeros(HEAD_DIM), [5], qk_mod.TILE)
    xq, dq = x[:, :HEAD_DIM * 3].reshape(5, 3, HEAD_DIM), dy[:, :HEAD_DIM * 3].reshape(5, 3, HEAD_DIM)
    qk_mod.qk_norm_backward(xq.contiguous(), w[:HEAD_DIM].contiguous(), dq.contiguous(), 0.0,
                            RowIdentity.packed([5]), fq)
    assert torch.isfinite(fq.main_grad).all() and not math.isnan(float(fq.main_grad.sum()))


# ----------------------------------------------------------------------------------------------- hygiene
def test_interpreter_is_on() -> None:
    assert INTERPRET


def test_no_atomics_in_triton_kernels() -> None:
    """No read-modify-write races: no atomic_* call in any kernel's code (docstrings may say so)."""
    root = pathlib.Path(__file__).resolve().parents[1] / "gradsweep" / "triton_kernels"
    offenders = [f"{p.name}:{n.lineno}" for p in sorted(root.glob("*.py")) for n in ast.walk(ast.parse(p.read_text()))
                 if isinstance(n, ast.Attribute) and "atomic" in n.attr.lower()]
    assert not offenders, f"atomic operations in {offenders}"
