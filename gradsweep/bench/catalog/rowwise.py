"""Row-wise and elementwise ops (issues 3, 13): norms, RoPE, SiLU, SwiGLU, embedding, pack, at a trainer's
16384 tokens in 13 irregular samples; ``traffic`` is each phase's ideal bytes (what a copy-bound kernel must
move), so ``copy_fraction`` compares it with this run's copy bandwidth."""

from __future__ import annotations

from gradsweep.bench.cases import Case, irregular

T = 16384
HIDDEN, HEADS, HEAD_DIM, INTER = 4096, 32, 128, 14336
CHECK_VOCAB = 20000


def _rows(width_key: str, tensors: int):
    """bytes of ``tensors`` bf16 [tokens, width] tensors read or written."""
    def traffic(shape: dict, tokens: int) -> float:
        width = shape[width_key] if width_key in shape else shape["heads"] * shape["head_dim"]
        return 2.0 * tensors * tokens * width
    return traffic


def _pair(op: str, shape: dict, lengths: tuple[int, ...], fwd_tensors: int, bwd_tensors: int, width: str,
          title: str, **extra) -> list[Case]:
    anchors = extra.pop("anchors", ())
    return [Case(op, "fwd", f"fwd {title}", shape, lengths, "fwd", traffic=_rows(width, fwd_tensors), split="rows",
                 anchors=anchors, **extra),
            Case(op, "bwd", f"bwd {title}", shape, lengths, "bwd", traffic=_rows(width, bwd_tensors),
                 anchors=anchors, **extra)]


def _embedding(vocab: int, hidden: int, lengths: tuple[int, ...], quick: bool) -> list[Case]:
    def fwd_bytes(shape: dict, tokens: int) -> float:
        return 4.0 * tokens * shape["hidden"]  # read the rows (bf16), write y

    def bwd_bytes(shape: dict, tokens: int) -> float:
        return 10.0 * tokens * shape["hidden"]  # read dy (bf16), read + write the touched FP32 main-grad rows

    shape = {"vocab": vocab, "hidden": hidden}
    check = None if quick else {"vocab": min(vocab, CHECK_VOCAB), "hidden": hidden}
    title = f"T={sum(lengths)} V={vocab} H={hidden}"
    return [Case("embedding", f"fwd_v{vocab}", f"fwd {title}", shape, lengths, "fwd", traffic=fwd_bytes,
                 split="rows", check_shape=check),
            Case("embedding", f"bwd_v{vocab}", f"bwd {title}", shape, lengths, "bwd", traffic=bwd_bytes,
                 check_shape=check, notes="stock: torch's dense bf16 [V, H] gradient (atomics)")]


def _pack(hidden: int, lengths: tuple[int, ...]) -> list[Case]:
    def fwd_bytes(shape: dict, tokens: int) -> float:
        return 4.0 * tokens * shape["hidden"]

    def bwd_bytes(shape: dict, tokens: int) -> float:  # unpack writes the padded batch
        return 2.0 * (tokens + len(lengths) * max(lengths)) * shape["hidden"]

    title = f"{len(lengths)} samples, T={sum(lengths)} H={hidden}"
    return [Case("pack", "fwd", f"pack {title}", {"hidden": hidden}, lengths, "fwd", traffic=fwd_bytes),
            Case("pack", "bwd", f"unpack (pack bwd) {title}", {"hidden": hidden}, lengths, "bwd", traffic=bwd_bytes)]


def cases(quick: bool) -> list[Case]:
    if quick:
        lengths, hidden, heads, dim, inter, vocab = (9, 3, 14), 64, 2, 32, 96, 50
        pack_lengths = (9, 3, 14)
    else:
        lengths, hidden, heads, dim, inter, vocab = irregular(T, 13), HIDDEN, HEADS, HEAD_DIM, INTER, 151936
        pack_lengths = tuple(1024 - 37 * i for i in range(16))
    rows = f"{sum(lengths)} x {hidden}"
    out = _pair("rms_norm", {"hidden": hidden}, lengths, 2, 3, "hidden", f"{rows} (dx + canonical dweight)",
                anchors=("liger",))
    out += _pair("qk_norm", {"heads": heads, "head_dim": dim}, lengths, 2, 3, "hidden",
                 f"{sum(lengths)} x {heads} x {dim}")
    out += _pair("rope", {"heads": heads, "head_dim": dim, "theta": 1.0e6}, lengths, 2, 2, "hidden",
                 f"{sum(lengths)} x {heads} x {dim}")
    out += _pair("silu", {"features": inter}, lengths, 2, 3, "features", f"{sum(lengths)} x {inter}")
    out += _pair("swiglu", {"features": inter}, lengths, 3, 5, "features", f"{sum(lengths)} x {inter}",
                 anchors=("liger",))
    out += _embedding(vocab, hidden, lengths, quick)
    if not quick:
        out += _embedding(32000, hidden, lengths, quick)
    out += _pack(hidden, pack_lengths)
    return out
