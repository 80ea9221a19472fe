"""Triton causal attention with grouped-query heads under the interpreter.

Layout invariance (bitwise) and accuracy (the contract's bounds: dK / dV are FP32-class) go through the public
kernel check, the sweep's own machinery: every layout, hostile pads and fillers, reverse and interleaved
backwards. Also checked here, where the kernel check cannot look: pinned code-shape switches keep the bits
invariant; the FP32-grads switch meets the contract's FP32-class rule (bf16 operands miss it); planted defects
(a key block or a fold tile that follows the layout) are caught;
the signed zero of a masked key never reaches o; refusals; rewinding a decode cache.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from gradsweep.canonical import RowIdentity
from gradsweep.contract import Contract, load_contract
from gradsweep.harness.kernel_check import candidate_from, check_kernel
from gradsweep.manifest import DEFAULT_MANIFEST, load_manifest
from gradsweep.ops.attention import AttentionShape
from gradsweep.ops.base import CallContext, CallOutput
from gradsweep.ops.registry import get_op
from gradsweep.triton_kernels import attention as attn
from gradsweep.triton_kernels._common import INTERPRET, same_bits
from tests.helpers import check_attention_cache_refusals

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exp2 of masked lanes

# Sample 0 spans 3 key blocks and 3 query tiles of the interpreter config; a one-token sample.
LENGTHS = [70, 5, 33, 1]
GQA = {"heads": 2, "kv_heads": 1, "head_dim": 32}


def _candidate(name: str, config: attn.AttnConfig | None = None, per_call=None):
    """The shipped adapter with another config, optionally tampered with (planted defects)."""

    def run(ctx: CallContext) -> CallOutput:
        q, k = ctx.inputs["q"], ctx.inputs["k"]
        cache = ctx.state.get("cache")
        if cache is None:
            cache = ctx.state["cache"] = attn.AttentionCache(ctx.lengths, q.shape[1], q.shape[2], q.device,
                                                             kv_heads=k.shape[1], config=config)
            ctx.state["calls"] = 0
        ctx.state["calls"] += 1
        if per_call is not None:
            per_call(cache, ctx)
        return CallOutput({"o": attn.attention(q, k, ctx.inputs["v"], ctx.rows, cache)})

    def grads(state: dict) -> dict[str, torch.Tensor]:
        dk, dv = state["cache"].finish()
        return {"dK": dk, "dV": dv}

    return candidate_from("attention", name, "triton", run, folded_input_grads=grads)


def test_interpreter_is_on():
    assert INTERPRET and attn.DEFAULT_CONFIG == attn.INTERPRET_CONFIG


def test_every_layout_is_bitwise_invariant_and_accurate_with_gqa():
    report = check_kernel("attention", "triton.attention", shape=GQA, lengths=LENGTHS)
    assert report.ok, report.first_failure
    assert set(report.cells) == set(get_op("attention").layouts)


def test_wider_groups_odd_head_dim_and_plain_multi_head():
    """4 query heads per K/V head with head_dim 24 (padded to 32 in the kernel); and kv_heads = heads."""
    for shape in ({"heads": 4, "kv_heads": 1, "head_dim": 24}, {"heads": 2, "head_dim": 16}):
        report = check_kernel("attention", "triton.attention", shape=shape, lengths=[40, 3, 17],
                              layouts=["bn_chunked", "decode"])
        assert report.ok, report.first_failure


@pytest.mark.parametrize("switch", [{"split": False}, {"rowsum_dot": True, "fp32_grads": False}])
def test_code_shape_switches_stay_invariant_and_accurate(switch):
    """Each switch is a pinned code shape the GPU bench compares; each must be invariant on its own (a row sum
    through the tensor core rounds P to bf16, so that shape is only ever bf16-class: fp32_grads off)."""
    cand = _candidate("triton.attention.switch", dataclasses.replace(attn.INTERPRET_CONFIG, **switch))
    report = check_kernel("attention", cand, shape=GQA, lengths=LENGTHS, layouts=["bn_chunked", "decode"],
                          contract=_fp32_class_contract(switch.get("fp32_grads", True)))
    assert report.ok, report.first_failure


def _fp32_class_contract(fp32_attention: bool) -> Contract:
    """The shipped contract (attention's dK / dV FP32-class), or the same with them moved to the bf16 class."""
    base = load_contract(load_manifest(DEFAULT_MANIFEST).contract_path)
    data = base.model_dump(mode="json")
    if not fp32_attention:
        data["accumulation"]["fp32"] = [e for e in data["accumulation"]["fp32"] if e["op"] != "attention"]
    return Contract.model_validate(data)


@pytest.mark.parametrize("fp32_grads", [True, False])
def test_fp32_grads_meets_the_fp32_class_and_bf16_operands_do_not(fp32_grads):
    """P and dS as hi + lo pairs and an FP32 delta (the default): dK / dV within the contract's FP32-class rule.
    With bf16 operands (as FlashAttention) that rule is missed."""
    cand = _candidate("triton.attention.grads", dataclasses.replace(attn.INTERPRET_CONFIG, fp32_grads=fp32_grads))
    cell = check_kernel("attention", cand, shape=GQA, lengths=LENGTHS, layouts=["bn_chunked"],
                        contract=_fp32_class_contract(True)).cells["bn_chunked"]
    assert all(m.bitwise_equal for m in cell.tensors)
    judged = {m.name: m for m in cell.tensors if m.accuracy_ok is not None}
    assert judged["dK"].accuracy_class == judged["dV"].accuracy_class == "fp32"
    bad = {name for name, m in judged.items() if not m.accuracy_ok}
    assert bad == (set() if fp32_grads else {"dK", "dV"}), cell.reason


def test_planted_key_block_following_the_call_is_caught():
    """Forward key blocks sized by the call's row count: the online-softmax order follows the layout."""

    def resize(cache: attn.AttentionCache, ctx: CallContext) -> None:
        cache.config = dataclasses.replace(cache.config, bn=16 if ctx.rows.num_rows < 40 else 32)

    report = check_kernel("attention", _candidate("planted.block", per_call=resize), shape=GQA, lengths=LENGTHS,
                          layouts=["bn_chunked"])
    cell = report.cells["bn_chunked"]
    assert not report.ok and "o forward_invariance" in cell.reason


def test_planted_fold_tile_following_the_calls_is_caught():
    """dK / dV folded in query tiles whose size follows how many calls the layout made."""

    def per_call(cache: attn.AttentionCache, ctx: CallContext) -> None:  # the fold reads it in the last backward
        cache.config = dataclasses.replace(cache.config, tile=16 if ctx.state["calls"] > 1 else 32)

    report = check_kernel("attention", _candidate("planted.tile", per_call=per_call), shape=GQA, lengths=LENGTHS,
                          layouts=["b1_singleton"])
    assert not report.ok and "dK gradient_invariance" in report.cells["b1_singleton"].reason


# ----------------------------------------------------------------------------------------- signed zeros
@triton.jit
def _ieee_mma(a, b, acc):
    """A product-sum with IEEE zero signs (like a sequential FMA chain): -0 when every term is -0."""
    prod = a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :]
    s = tl.sum(prod, axis=1)
    neg_zero = ((prod == 0.0) & (prod.to(tl.int32, bitcast=True) < 0)).to(tl.int32)
    s = tl.where(tl.min(neg_zero, axis=1) == 1, s * -1.0, s)  # -(+0); a literal -0.0 becomes +0 in the interpreter
    if acc is None:
        return s
    else:
        return acc + s


@triton.jit
def _identity(x):
    return x


BN = attn.INTERPRET_CONFIG.bn
ROW = BN + 4  # the row whose masked keys matter: in the second key block


def _signed_zero_inputs() -> dict[str, torch.Tensor]:
    """One sample of two key blocks. Row ROW sees block 0 with scores 0 and tiny negative v[:, 0], so acc[:, 0] < 0;
    key BN scores ~255 (log2 units), so the rescale underflows acc to -0; keys BN..ROW hold v[:, 0] = -0 and the
    keys after ROW (masked for it) v[:, 0] = -1: a masked key adds 0 * -1 = -0 when its slot was written (one
    call) and 0 * (+0) when it was not (ROW ends the first of two calls)."""
    n, d = 2 * BN, 32
    g = torch.Generator().manual_seed(5)
    q = torch.zeros(n, 1, d)
    q[:, 0, 0] = 1.0
    k = torch.randn(n, 1, d, generator=g) * 0.1
    k[:, 0, 0] = 0.0
    k[BN, 0, 0] = 1000.0
    v = torch.randn(n, 1, d, generator=g)
    v[:BN, 0, 0] = -1e-30
    v[BN:ROW + 1, 0, 0] = -0.0
    v[ROW + 1:, 0, 0] = -1.0
    return {"q": q.bfloat16(), "k": k.bfloat16(), "v": v.bfloat16()}


def _o_of(calls: list[tuple[int, int]], data: dict[str, torch.Tensor]) -> torch.Tensor:
    n = data["q"].shape[0]
    cache = attn.AttentionCache([n], 1, 32, "cpu")
    out = []
    for a, b in calls:
        rows = RowIdentity.packed([b - a], [0], [a])
        out.append(attn.attention(data["q"][a:b], data["k"][a:b], data["v"][a:b], rows, cache))
    return torch.cat(out)


def test_signed_zero_of_a_masked_key_never_reaches_o(monkeypatch):
    monkeypatch.setattr(attn, "mma", _ieee_mma)  # zero signs as an IEEE accumulation keeps them
    data = _signed_zero_inputs()
    calls_one, calls_two = [(0, 2 * BN)], [(0, ROW + 1), (ROW + 1, 2 * BN)]
    one, two = _o_of(calls_one, data), _o_of(calls_two, data)
    assert same_bits(one, two)
    assert not torch.signbit(one[one == 0]).any()
    monkeypatch.setattr(attn, "_plus_zero", _identity)  # without the store's -0 -> +0 the gap is real
    one, two = _o_of(calls_one, data), _o_of(calls_two, data)
    assert not same_bits(one, two)
    assert bool(torch.signbit(one[ROW, 0, 0])) and not bool(torch.signbit(two[ROW, 0, 0]))


# ----------------------------------------------------------------------------------------- refusals, rewind
def _qkv(n: int, heads: int = 2, kv_heads: int = 1, d: int = 32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, h, d, generator=g).bfloat16() for h in (heads, kv_heads, kv_heads)]


def test_refusals_name_the_problem():
    check_attention_cache_refusals(attn, *_qkv(2))
    cache = attn.AttentionCache([8, 4], 2, 32, "cpu", kv_heads=1)
    with pytest.raises(ValueError, match="kv_heads"):
        attn.attention(*_qkv(2, kv_heads=2), RowIdentity.packed([2], [0], [2]), cache)
    with pytest.raises(ValueError, match="divisor of heads"):
        AttentionShape(heads=6, kv_heads=4, head_dim=32)
    assert AttentionShape(heads=6, head_dim=32).kv_heads == 6


def test_rewound_decode_step_repeats_its_bits():
    lengths = [9, 6]
    q, k, v = _qkv(sum(lengths), seed=1)
    cache = attn.AttentionCache(lengths, 2, 32, "cpu", kv_heads=1)
    pre = RowIdentity.packed([8, 5], [0, 1])
    idx = torch.tensor([*range(8), *range(9, 14)])
    attn.attention(q[idx], k[idx], v[idx], pre, cache)
    mark = cache.mark()
    step = RowIdentity.packed([1, 1], [0, 1], [8, 5])
    last = torch.tensor([8, 14])
    first = attn.attention(q[last], k[last], v[last], step, cache)
    cache.rewind(mark)
    again = attn.attention(q[last], k[last], v[last], step, cache)
    assert same_bits(first, again)
    full = attn.AttentionCache(lengths, 2, 32, "cpu", kv_heads=1)
    whole = attn.attention(q, k, v, RowIdentity.packed(lengths), full)
    assert same_bits(whole[last], first)  # decode rows (packed programs) == prefill rows, bit for bit


def test_a_first_chunk_from_position_zero_is_not_the_whole_step():
    """One sample, two calls: the first call's rows are in logical order from token 0 but do not hold every token,
    so they cannot stand in for the store (regression: the second call once read the first call's rows)."""
    g = torch.Generator().manual_seed(3)
    data = {n: torch.randn(2 * BN, 1, 32, generator=g).bfloat16() for n in "qkv"}
    assert same_bits(_o_of([(0, 2 * BN)], data), _o_of([(0, ROW + 1), (ROW + 1, 2 * BN)], data))


def test_pad_only_and_empty_calls_output_zeros_and_count_no_tokens():
    lengths = [6, 3]
    q, k, v = _qkv(sum(lengths), seed=2)
    cache = attn.AttentionCache(lengths, 2, 32, "cpu", kv_heads=1)
    pads = RowIdentity(torch.tensor([-1, -2, -1]), torch.tensor([0, 0, 1]))
    hostile = [torch.full((3, t.shape[1], 32), float("nan")).bfloat16() for t in (q, k, v)]
    o = attn.attention(*hostile, pads, cache)
    assert same_bits(o, torch.zeros_like(o))
    empty = RowIdentity(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    assert attn.attention(q[:0], k[:0], v[:0], empty, cache).shape == (0, 2, 32)
    qq = q.clone().requires_grad_(True)
    attn.attention(qq, k, v, RowIdentity.packed(lengths), cache).sum().backward()
    dk, dv = cache.finish()
    assert torch.isfinite(dk).all() and torch.isfinite(dv).all() and torch.isfinite(qq.grad.float()).all()


def test_plans_are_shared_by_row_content_and_differ_with_it():
    """A plan is keyed by what the rows are (real rows' samples, positions, places), not by the RowIdentity
    object: a later step of the same layout reuses it, and rows that differ (a pad moved) get their own."""
    cache = attn.AttentionCache([5, 3], 2, 32, "cpu", kv_heads=1)
    packed = RowIdentity.packed([5, 3])
    same = RowIdentity(torch.tensor([0, 0, 0, 0, 0, 1, 1, 1]), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2]))
    assert cache.plan(packed) is cache.plan(same)
    padded = RowIdentity(torch.tensor([0, 0, 0, 0, 0, -1, 1, 1, 1]), torch.tensor([0, 1, 2, 3, 4, 0, 0, 1, 2]))
    moved = RowIdentity(torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, -1]), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 0]))
    a, b = cache.plan(padded), cache.plan(moved)
    assert a is not b and a is not cache.plan(packed)
    assert a.rows.tolist() == [0, 1, 2, 3, 4, 6, 7, 8] and b.rows.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    other = attn.AttentionCache([5, 3], 2, 32, "cpu", kv_heads=2)  # another group: another plan
    assert other.plan(packed) is not cache.plan(packed)
