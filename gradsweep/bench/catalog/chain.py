"""The whole training step (issue 14): one forward + backward of the Qwen3-shaped chain (2 layers of Qwen3-8B:
hidden 4096, 32 / 8 heads x 128, intermediate 12288, vocab 151936) over 16384 tokens in 8 irregular samples,
the batch-invariant chain against the same model code on stock PyTorch ops. This is the figure a trainer pays
per step; the per-op cases say where it goes."""

from __future__ import annotations

from gradsweep.bench.cases import Case

QWEN3_8B_2L = {"hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 12288, "vocab": 151936,
               "layers": 2, "eps": 1e-6, "rope_theta": 1.0e6}
LENGTHS = (4096, 3000, 2048, 2048, 1500, 1500, 1100, 1092)
CHECK_SHAPE = {"hidden": 512, "heads": 4, "kv_heads": 2, "head_dim": 128, "intermediate": 1536, "vocab": 20000,
               "layers": 2, "eps": 1e-6, "rope_theta": 1.0e6}


def cases(quick: bool) -> list[Case]:
    if quick:
        return [Case("chain", "step", "training step, tiny chain", {}, (9, 3, 14), "fwd_bwd", families=("triton",),
                     check_layouts=("bn_chunked",))]
    return [Case("chain", "step", f"training step (fwd+bwd), 2 layers of Qwen3-8B, {sum(LENGTHS)} tokens in "
                 f"{len(LENGTHS)} samples", QWEN3_8B_2L, LENGTHS, "fwd_bwd", families=("triton",),
                 check_shape=CHECK_SHAPE, check_layouts=("bn_chunked",), memory=True,
                 notes="every weight's gradient folded into FP32 main grads (stock: bf16 autograd .grad)")]
