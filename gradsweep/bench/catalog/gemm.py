"""GEMM cases (issues 10 and 12): forward at every M a trainer and a decoder use, dX alone, the canonical dW
alone (fold planning included), lm_head; against cuBLAS through the stock path (``F.linear``)."""

from __future__ import annotations

from gradsweep.bench.cases import STOCK, Case, irregular

K = N = 4096
FWD_M = (1, 16, 256, 4096, 16384)
WIDE_N = (14336, 151936)
CHECK_VOCAB = 20000  # a vocabulary-wide weight is checked at this width (see Case.check_shape)


def _flops(shape: dict, tokens: int) -> float:
    return 2.0 * tokens * shape["in_features"] * shape["out_features"]


def _gemm_shape(k: int, n: int) -> dict:
    return {"in_features": k, "out_features": n}


def _check(n: int, k: int) -> dict | None:
    return _gemm_shape(k, CHECK_VOCAB) if n > 2 * CHECK_VOCAB else None


def fwd(m: int, n: int, k: int, name: str | None = None) -> Case:
    return Case("det_gemm", name or f"fwd_m{m}_n{n}", f"fwd M={m} N={n} K={k}", _gemm_shape(k, n), (m,), "fwd",
                anchors=("bio",), flops=_flops, split="rows", check_shape=_check(n, k))


def dx(m: int, n: int, k: int) -> Case:
    return Case("det_gemm", f"dx_m{m}", f"dX M={m} N=K={k}", _gemm_shape(k, n), (m,), "bwd", grads="inputs",
                flops=_flops, split="rows", check_shape=_check(n, k))


def dw(t: int, n: int, k: int, samples: int = 13) -> Case:
    return Case("det_gemm", f"dw_t{t}", f"dW T={t} ({samples} samples) N=K={k}, fp32 main grad",
                _gemm_shape(k, n), irregular(t, samples), "bwd", grads="params", flops=_flops,
                baselines=(STOCK, "fp32_wgrad"),
                notes="canonical fold into the FP32 main grad, plan included; stock: cuBLAS bf16 dY^T X; "
                      "fp32_wgrad: cuBLAS dY^T X added into the FP32 main grad (beta = 1)")


def lm_head(t: int, vocab: int, hidden: int) -> Case:
    return Case("lm_head", f"fwd_bwd_t{t}", f"fwd+bwd T={t} V={vocab} H={hidden}",
                {"hidden": hidden, "vocab": vocab}, irregular(t, 7), "fwd_bwd", flops=lambda s, n: 6.0 * n *
                s["hidden"] * s["vocab"], check_shape={"hidden": hidden, "vocab": min(vocab, CHECK_VOCAB)})


def cases(quick: bool) -> list[Case]:
    if quick:
        k, n = 64, 96
        return [fwd(1, n, k, "fwd_m1_n4096"), fwd(7, n, k, "fwd_m16_n4096"), fwd(40, n, k, "fwd_m4096_n4096"),
                dx(1, n, k), dx(40, n, k), Case("det_gemm", "dw_t4096", "dW", _gemm_shape(k, n), (9, 3, 14), "bwd",
                                               grads="params", flops=_flops, baselines=(STOCK, "fp32_wgrad")),
                lm_head(20, 300, 48)]
    out = [fwd(m, N, K) for m in FWD_M]
    out += [fwd(m, n, K) for n in WIDE_N for m in (16, 4096)]
    out += [dx(m, N, K) for m in FWD_M]
    out += [dw(t, N, K) for t in (4096, 16384)]
    out.append(lm_head(4096, 151936, 4096))
    return out
