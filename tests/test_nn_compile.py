"""torch.compile(fullgraph=True) traces the chain built from gradsweep.nn without a graph break.

What is tested, precisely: the Triton family (kernels under TRITON_INTERPRET=1 on the CPU) in ordinary mode
(one call holds the step) is compiled with ``fullgraph=True`` (any graph break raises) through AOTAutograd
with recording compilers: the forward graph holds the torch.ops.gradsweep custom ops, traced through their
fake implementations, and the backward graph their backward ops. The compiled step then runs (the kernels
execute inside the opaque ops) and gives the eager step's logp and every main grad bit for bit. Inductor's
code generation is not exercised (the graph around the ops is a few views and adds); the stock flavour is plain
torch and compiles natively.
"""

from __future__ import annotations

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from gradsweep.canonical import RowIdentity
from gradsweep.nn import Qwen3Decoder, Qwen3Shape, init_weights, new_context

SHAPE = Qwen3Shape(hidden=32, heads=4, kv_heads=2, head_dim=16, intermediate=64, vocab=64, layers=2)
LENGTHS = [19, 1, 12]


def _inputs():
    gen = torch.Generator().manual_seed(3)
    total = sum(LENGTHS)
    ids = torch.randint(0, SHAPE.vocab, (total,), generator=gen)
    targets = torch.randint(0, SHAPE.vocab, (total,), generator=gen)
    return ids, targets, torch.randn(total, generator=gen)


def _step(model, ids, targets, upstream):
    ctx = new_context(SHAPE, LENGTHS, "cpu")
    ctx.begin_call(RowIdentity.packed(LENGTHS))
    logp = model(ids, targets, ctx)
    logp.backward(upstream)
    assert ctx.stashed == 0
    return logp.detach(), {n: f.finish().clone() for n, f in ctx.folds.items()}


def _ops(gm) -> list[str]:
    """The gradsweep ops a graph calls (an effectful op appears wrapped in with_effects(token, op, ...))."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        target = n.args[1] if "with_effects" in str(n.target) else n.target
        if "gradsweep" in str(target):
            out.append(str(target))
    return out


def test_chain_compiles_fullgraph_and_matches_eager_bitwise():
    torch._dynamo.reset()
    weights = {n: p.detach().requires_grad_(True) for n, p in init_weights(SHAPE, seed=5).items()}
    ids, targets, upstream = _inputs()
    eager = _step(Qwen3Decoder(SHAPE, "triton", weights), ids, targets, upstream)

    graphs: dict[str, list[str]] = {"fw": [], "bw": []}

    def recorder(kind):
        def compile_graph(gm, example_inputs):
            graphs[kind] += _ops(gm)
            return make_boxed_func(gm.forward)
        return compile_graph

    backend = aot_autograd(fw_compiler=recorder("fw"), bw_compiler=recorder("bw"))
    model = torch.compile(Qwen3Decoder(SHAPE, "triton", weights), fullgraph=True, backend=backend)
    compiled = _step(model, ids, targets, upstream)

    fw = " ".join(graphs["fw"])
    for op in ("embedding", "rms_norm", "qk_norm", "linear", "rope", "attention", "swiglu", "linear_logp"):
        assert f"gradsweep.{op}." in fw, op
    assert graphs["fw"].count("gradsweep.attention.default") == SHAPE.layers
    bw = " ".join(graphs["bw"])
    for op in ("attention_backward", "fold_backward", "embedding_backward", "pair_backward"):
        assert f"gradsweep.{op}." in bw, op

    assert torch.equal(eager[0], compiled[0])
    assert all(torch.equal(eager[1][n], compiled[1][n]) for n in eager[1])
    assert all(eager[1][n].abs().sum() > 0 for n in eager[1])  # every weight did receive a gradient
