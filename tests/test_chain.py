"""The chain op through the sweep's own judge (check_kernel): a whole Qwen3-shaped decoder, Triton family under
the interpreter, every weight gradient and the logp bitwise across layouts and within the contract.

Layouts here cover each mechanism once at CI cost (the sweep runs every layout): chunked prefill through the KV
cache (layerwise backward, reverse and interleaved schedules), a shared prefix reused by later calls, NaN / inf
pads (ordinary backward), loss-masked fillers, and decode against the training forward. Sample 0 spans several
canonical tiles (64-token GEMM tiles, 32-token norm tiles), a one-token sample sits beside it.
"""

from __future__ import annotations

import pytest

from gradsweep.harness.kernel_check import check_kernel
from gradsweep.ops.base import CallContext, Candidate
from gradsweep.ops.registry import get_op
from gradsweep.results import Status

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exp / NaN of masked lanes and pads

TINY = {"hidden": 32, "heads": 4, "kv_heads": 2, "head_dim": 16, "intermediate": 64, "vocab": 96, "layers": 2,
        "eps": 1e-6, "rope_theta": 1.0e6}
LONG = [70, 1, 12]
SHORT = [12, 1, 7]


def _tensors(op) -> set[str]:
    return {o.name for o in op.outputs} | set(op.gradient_names())


def test_chain_declares_every_weight_gradient():
    op = get_op("chain")
    assert op.backward_scope == "layout"
    assert set(op.candidates) == {"triton.chain", "cuda.chain", "torch.chain"}
    assert _tensors(op) == {"logp"} | {f"d{n}" for n in (
        "embed_tokens", "input_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "o_proj", "post_attn_norm",
        "gate_proj", "up_proj", "down_proj", "final_norm", "lm_head")}


def test_triton_chain_is_green_across_calls_pads_and_fillers():
    op = get_op("chain")
    report = check_kernel("chain", "triton.chain", shape=TINY, lengths=LONG,
                          layouts=["bn_chunked", "bn_padded_left", "bn_mask_density", "prefix_cache"])
    assert report.ok, report.first_failure
    for layout, verdict in report.cells.items():
        assert {t.name for t in verdict.tensors} == _tensors(op), layout
        assert all(t.bitwise_equal for t in verdict.tensors), layout
        assert all(t.accuracy_ok for t in verdict.tensors if t.accuracy_ok is not None), layout


def test_triton_chain_decode_equals_the_training_forward():
    report = check_kernel("chain", "triton.chain", shape=TINY, lengths=SHORT, layouts=["decode"])
    assert report.ok, report.first_failure
    assert report.cells["decode"].tensors


def test_a_chain_with_the_wrong_rope_base_is_red():
    """The FP64 reference sees a structural error the layouts cannot (every layout is equally wrong)."""
    good = get_op("chain").candidates["triton.chain"]

    def run(ctx: CallContext):
        return good.run(CallContext(ctx.call, ctx.inputs, ctx.params, ctx.folds, ctx.state,
                                    {**ctx.shape, "rope_theta": 1.0e4}, ctx.lengths))

    planted = Candidate("triton.chain_rope_1e4", "triton", run, param_grads="fold", fold_tiles=good.fold_tiles)
    report = check_kernel("chain", planted, shape=TINY, lengths=SHORT, layouts=["bn_full"])
    assert report.status == Status.RED_VERDICT
    assert "accuracy" in report.first_failure
