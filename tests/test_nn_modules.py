"""gradsweep.nn: the step context, the two backward modes, the families, the shape checks.

The chain's layout invariance through the harness is in test_chain.py; here the modules are driven directly as a
trainer would: one call per step (ordinary autograd), or several calls (layerwise backward) whose backwards
come in any order.
"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.nn import ChainContext, Qwen3Decoder, Qwen3Shape, init_weights, new_context
from gradsweep.nn.kernels import kernel_module

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exp / NaN of masked lanes in the interpreter

SHAPE = Qwen3Shape(hidden=32, heads=4, kv_heads=2, head_dim=16, intermediate=64, vocab=64, layers=2)
LENGTHS = [9, 1, 6]
STARTS = [0, 9, 10]
# chunked prefill: sample 0 in three calls, sample 2 in two, through the KV cache
CHUNKS = [RowIdentity.packed([4, 1, 2], [0, 1, 2], [0, 0, 0]), RowIdentity.packed([3, 4], [0, 2], [4, 2]),
          RowIdentity.packed([2], [0], [7])]


def _data():
    gen = torch.Generator().manual_seed(11)
    total = sum(LENGTHS)
    return (torch.randint(0, SHAPE.vocab, (total,), generator=gen),
            torch.randint(0, SHAPE.vocab, (total,), generator=gen), torch.randn(total, generator=gen))


def _weights():
    return {n: p.detach().requires_grad_(True) for n, p in init_weights(SHAPE, seed=2).items()}


def _index(rows: RowIdentity) -> torch.Tensor:
    return torch.tensor([STARTS[s] + p for s, p in zip(rows.sample.tolist(), rows.position.tolist())])


def _step(calls, order: str, mode: str = "auto"):
    """Forward every call, backward in ``order``: 'reverse' (per call), 'interleaved' (F0 B0 F1 B1), 'together'."""
    ids, targets, upstream = _data()
    weights = _weights()
    model = Qwen3Decoder(SHAPE, "triton", weights)
    ctx = new_context(SHAPE, LENGTHS, "cpu", mode=mode)
    logp = torch.zeros(sum(LENGTHS))
    outs = []
    for rows in calls:
        ctx.begin_call(rows)
        idx = _index(rows)
        out = model(ids[idx], targets[idx], ctx)
        logp[idx] = out.detach()
        outs.append((out, upstream[idx]))
        if order == "interleaved":
            out.backward(upstream[idx])
    if order == "reverse":
        for out, g in reversed(outs):
            out.backward(g)
    elif order == "together":
        torch.autograd.backward([o for o, _ in outs], [g for _, g in outs])
    assert all(w.grad is None for w in weights.values())  # weight gradients only ever go to the folds
    return logp, {n: f.finish() for n, f in ctx.folds.items()}, ctx


@pytest.fixture(scope="module")
def ordinary():
    logp, grads, ctx = _step([RowIdentity.packed(LENGTHS)], "reverse")
    assert ctx.mode == "ordinary" and ctx.stashed == 0
    return logp, grads


@pytest.mark.parametrize("order", ["reverse", "interleaved", "together"])
def test_layerwise_backward_gives_the_ordinary_bits_in_any_backward_order(ordinary, order):
    logp, grads, ctx = _step(CHUNKS, order)
    assert ctx.mode == "layerwise" and ctx.stashed == 0
    assert torch.equal(logp, ordinary[0])
    differ = [n for n in grads if not torch.equal(grads[n], ordinary[1][n])]
    assert differ == []
    assert all(bool(g.abs().sum() > 0) for g in grads.values())


def test_one_call_forced_layerwise_gives_the_ordinary_bits(ordinary):
    logp, grads, ctx = _step([RowIdentity.packed(LENGTHS)], "reverse", mode="layerwise")
    assert ctx.mode == "layerwise" and ctx.backward_done
    assert torch.equal(logp, ordinary[0])
    assert [n for n in grads if not torch.equal(grads[n], ordinary[1][n])] == []


def test_decode_without_gradients_gives_the_training_forward_bits(ordinary):
    ids, targets, _ = _data()
    model = Qwen3Decoder(SHAPE, "triton", _weights())
    ctx = ChainContext(LENGTHS, "cpu")
    logp = torch.zeros(sum(LENGTHS))
    with torch.no_grad():
        for pos in range(max(LENGTHS)):
            samples = [s for s, n in enumerate(LENGTHS) if pos < n]
            rows = RowIdentity.packed([1] * len(samples), samples, [pos] * len(samples))
            ctx.begin_call(rows)
            idx = _index(rows)
            logp[idx] = model(ids[idx], targets[idx], ctx)
    assert ctx.stashed == 0
    assert torch.equal(logp, ordinary[0])


def test_several_calls_in_ordinary_mode_refuse_an_unfinished_attention_fold():
    with pytest.raises(RuntimeError, match="layerwise"):
        _step(CHUNKS[:1] + CHUNKS[1:], "reverse", mode="ordinary")


def test_a_stacked_weight_fold_completes_only_when_every_layer_fold_has():
    main = torch.zeros(2, 3)
    parent = CanonicalFold(main, [2, 1], tile=2)
    ctx = ChainContext([2, 1], "cpu", {"w": parent}, layered=["w"], layers=2)
    rows = RowIdentity.packed([2, 1])
    layer0, layer1 = ctx.fold("w", 0), ctx.fold("w", 1)
    assert layer0.main_grad.data_ptr() == main[0].data_ptr() and layer1.main_grad.data_ptr() == main[1].data_ptr()
    layer0.take(rows, ())
    ctx.settle("w")
    assert layer0.done and not parent.done
    layer1.take(rows, ())
    ctx.settle("w")
    assert parent.done and parent.finish() is main


def test_a_family_never_borrows_another_familys_kernel(monkeypatch):
    """Both families have every module today; a module missing from one family is an error naming it, never
    the other family's kernel."""
    from gradsweep.nn import kernels

    monkeypatch.setitem(kernels.MODULE_OF, "attention", "attention_not_written")
    with pytest.raises(ModuleNotFoundError, match="cuda family has no attention kernel"):
        kernel_module("cuda", "attention")
    with pytest.raises(ValueError, match="family 'rocm'"):
        kernel_module("rocm", "attention")


@pytest.mark.parametrize(("fields", "message"), [
    ({"heads": 6, "kv_heads": 4}, "not a multiple of kv_heads"),
    ({"head_dim": 15}, "even head_dim"),
    ({"layers": 0}, "layers"),
    ({"hidden_size": 32}, "hidden_size"),
])
def test_shape_errors_name_the_field_and_the_fix(fields, message):
    with pytest.raises(ValidationError, match=message):
        Qwen3Shape(**fields)


def test_the_stock_flavour_is_the_same_model_on_plain_torch():
    ids, targets, upstream = _data()
    weights = _weights()
    model = Qwen3Decoder(SHAPE, "torch", weights)
    ctx = new_context(SHAPE, LENGTHS, "cpu", family="torch")
    assert ctx.folds == {} and ctx.mode == "ordinary"
    for rows in CHUNKS:  # a tensor KV cache in the autograd graph: several calls need no layerwise mode
        ctx.begin_call(rows)
        idx = _index(rows)
        model(ids[idx], targets[idx], ctx).backward(upstream[idx], retain_graph=True)
    assert all(w.grad is not None and bool(w.grad.abs().sum() > 0) for w in weights.values())


def _stock_step(mode: str, dtype: torch.dtype):
    ids, targets, upstream = _data()
    weights = {n: w.detach().to(dtype).requires_grad_(True) for n, w in _weights().items()}
    model = Qwen3Decoder(SHAPE, "torch", weights)
    ctx = new_context(SHAPE, LENGTHS, "cpu", family="torch", mode=mode)
    logp, outs = torch.zeros(sum(LENGTHS), dtype=torch.float32), []
    for rows in CHUNKS:
        ctx.begin_call(rows)
        idx = _index(rows)
        out = model(ids[idx], targets[idx], ctx)
        logp[idx] = out.detach().float()
        outs.append((out, upstream[idx].to(out.dtype)))
    for out, g in reversed(outs):
        out.backward(g, retain_graph=mode == "ordinary")
    return logp, {n: w.grad for n, w in weights.items()}, ctx


def test_stock_layerwise_steps_stop_at_the_kv_leaves_and_give_the_ordinary_gradients():
    """Stock torch over several calls: in layerwise mode a call's backward stops at the layer's K/V leaves
    (autograd through a tensor KV cache re-runs every earlier call's graph: O(calls^2), 1031 decode calls at
    release shapes never finished on the H200). Same forward bits; the gradients are those of the ordinary path
    up to summation order, judged as the contract judges the chain's gradients: against the ordinary path run
    in float64, within k x the ordinary bf16 path's own error + floor."""
    from gradsweep.contract import CheckKind, load_contract
    from gradsweep.harness.compare import normwise_error
    from gradsweep.manifest import MANIFEST_DIR

    logp_o, grads_o, _ = _stock_step("ordinary", torch.bfloat16)
    logp_l, grads_l, ctx = _stock_step("layerwise", torch.bfloat16)
    _, grads_ref, _ = _stock_step("ordinary", torch.float64)
    assert ctx.layerwise and ctx.backward_done
    assert torch.equal(logp_o, logp_l)
    contract = load_contract(MANIFEST_DIR / "contract.yaml")
    for name, ref in grads_ref.items():
        rule = contract.resolve(CheckKind.GRADIENT_ACCURACY, "chain", f"d{name}", "bfloat16", "torch_bf16")
        stock_error = normwise_error(grads_o[name].double(), ref)
        assert grads_l[name] is not None and bool(grads_l[name].abs().sum() > 0), name
        assert normwise_error(grads_l[name].double(), ref) <= rule.bound(stock_error), name
