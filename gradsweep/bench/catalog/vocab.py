"""Vocabulary-wide ops (issues 10 and 12): selected-token logp, the unfused lm_head + logp chain and the fused
linear_logp, at V = 151936. linear_logp is measured against one cuBLAS lm_head GEMM (``gemm``: its targets'
unit), the stock path (logits materialised, FP32 log_softmax) and Liger's fused linear cross-entropy."""

from __future__ import annotations

from gradsweep.bench.cases import STOCK, Case, irregular

VOCAB, HIDDEN = 151936, 4096
CHECK_VOCAB = 20000


def _logits_bytes(per_element: float):
    def traffic(shape: dict, tokens: int) -> float:
        return per_element * tokens * shape["vocab"]
    return traffic


def _gemm_flops(passes: float):
    def flops(shape: dict, tokens: int) -> float:
        return 2.0 * passes * tokens * shape["hidden"] * shape["vocab"]
    return flops


def _linear_logp(t: int, vocab: int, hidden: int, lengths: tuple[int, ...], check: dict | None) -> list[Case]:
    shape = {"hidden": hidden, "vocab": vocab}
    title = f"T={t} V={vocab} H={hidden}"
    return [Case("linear_logp", f"fwd_t{t}", f"fwd {title}", shape, lengths, "fwd", baselines=(STOCK, "gemm"),
                 anchors=("bio",), flops=_gemm_flops(1), split="rows", check_shape=check),
            Case("linear_logp", f"fwd_bwd_t{t}", f"fwd+bwd {title}", shape, lengths, "fwd_bwd",
                 baselines=(STOCK, "gemm"), anchors=("liger",), flops=_gemm_flops(3), memory=True,
                 check_shape=check, notes="gemm: one lm_head GEMM; memory: peak above the step's inputs")]


def cases(quick: bool) -> list[Case]:
    if quick:
        vocab, hidden, lengths = 300, 48, (9, 3, 14)
        check = None
        return [Case("logp", "fwd", "fwd", {"vocab": vocab}, lengths, "fwd", traffic=_logits_bytes(2), split="rows"),
                Case("logp", "bwd", "bwd", {"vocab": vocab}, lengths, "bwd", traffic=_logits_bytes(4)),
                Case("batch_invariant_logp", "fwd_bwd", "fwd+bwd", {"hidden": hidden, "vocab": vocab}, lengths,
                     "fwd_bwd"),
                *_linear_logp(4096, vocab, hidden, lengths, check)]
    t = 4096
    lengths = irregular(t, 7)
    check = {"hidden": HIDDEN, "vocab": CHECK_VOCAB}
    title = f"T={t} V={VOCAB}"
    out = [Case("logp", "fwd", f"fwd {title}", {"vocab": VOCAB}, lengths, "fwd", traffic=_logits_bytes(2),
                anchors=("bio",), split="rows"),
           Case("logp", "bwd", f"bwd {title}", {"vocab": VOCAB}, lengths, "bwd", traffic=_logits_bytes(4)),
           Case("batch_invariant_logp", "fwd_bwd", f"fwd+bwd {title} H={HIDDEN}", {"hidden": HIDDEN, "vocab": VOCAB},
                lengths, "fwd_bwd", flops=_gemm_flops(3), memory=True, check_shape=check)]
    for tokens in (4096, 16384):
        out += _linear_logp(tokens, VOCAB, HIDDEN, irregular(tokens, 7), check)
    return out
