"""Pack / unpack between a padded batch [B, L, H] and packed rows [sum(lengths), H].

Both are row copies between a sample's padded slot and its packed slot (pure data movement, bit-exact,
row-wise; no per-row index map is built), and each is the other's adjoint, so the backward of one is
the forward of the other. A sample's tokens start at column ``starts[b]`` of its batch row (0 for right
padding, L - length for left padding); pad slots are never read, whatever they hold.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradsweep.kernel_api import check_pack, check_unpack, check_unpack_rows, pack_functions, sample_table
from gradsweep.triton_kernels._common import FastLaunch, cdiv, pow2

BLOCK_H = 1024


@triton.jit
def _pack_kernel(src_ptr, dst_ptr, meta_ptr, n_samples, max_len, H, UNPACK: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Program (b, row block, column block) copies rows of sample b between its padded slot
    [b * max_len + start_b + p] and its packed slot [offset_b + p]; unpack writes zeros into pad slots."""
    b = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(2).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cmask = (cols < H)[None, :]
    n = tl.load(meta_ptr + b).to(tl.int64)
    first = tl.load(meta_ptr + n_samples + b).to(tl.int64)
    start = tl.load(meta_ptr + 2 * n_samples + b).to(tl.int64)
    real = (p < n)[:, None] & cmask
    padded = (b * max_len + start + p)[:, None] * H + cols[None, :]
    packed = (first + p)[:, None] * H + cols[None, :]
    if UNPACK:  # slot p of the batch row: sample row p - start when it lies inside the sample, else zero
        q = p - start
        inside = ((q >= 0) & (q < n))[:, None] & cmask
        v = tl.load(src_ptr + (first + q)[:, None] * H + cols[None, :], mask=inside, other=0.0)
        tl.store(dst_ptr + (b * max_len + p)[:, None] * H + cols[None, :], v, mask=(p < max_len)[:, None] & cmask)
    else:
        v = tl.load(src_ptr + padded, mask=real, other=0.0)
        tl.store(dst_ptr + packed, v, mask=real)


def _lengths_host(lengths: torch.Tensor, max_len: int, starts: torch.Tensor | None = None
                  ) -> tuple[list[int], list[int]]:
    host = [int(n) for n in lengths.cpu().tolist()]
    first = [0] * len(host) if starts is None else [int(s) for s in starts.cpu().tolist()]
    if len(first) != len(host) or any(n < 0 or s < 0 or s + n > max_len for n, s in zip(host, first)):
        raise ValueError(f"pack: need 0 <= starts[b] and starts[b] + lengths[b] <= {max_len}; got lengths "
                         f"{host}, starts {first}")
    return host, first


_PACK = FastLaunch(_pack_kernel)


def _launch(src: torch.Tensor, dst: torch.Tensor, lengths: list[int], starts: list[int], max_len: int,
            hidden: int, unpack: bool) -> None:
    n_samples = len(lengths)
    if n_samples == 0 or max_len == 0 or hidden == 0:
        return
    meta = sample_table(lengths, starts, src.device)
    block = min(pow2(hidden), BLOCK_H)
    rows = max(1, 4096 // block)
    grid = (n_samples, cdiv(max_len, rows), cdiv(hidden, block))
    _PACK(grid, [src, dst, meta, n_samples, max_len, hidden], {"UNPACK": unpack, "ROWS": rows, "BLOCK": block}, 4)


def pack_forward(x: torch.Tensor, lengths: list[int], starts: list[int] | None = None) -> torch.Tensor:
    """Launcher (no autograd): x [B, L, H] -> [sum(lengths), H]."""
    _, max_len, hidden = x.shape
    x = x.contiguous()
    out = torch.empty((sum(lengths), hidden), dtype=x.dtype, device=x.device)
    if out.numel():
        _launch(x, out, lengths, starts or [0] * len(lengths), max_len, hidden, unpack=False)
    return out


def unpack_forward(packed: torch.Tensor, lengths: list[int], max_len: int,
                   starts: list[int] | None = None) -> torch.Tensor:
    """Launcher (no autograd): packed [T, H] -> [B, max_len, H], pad slots zero."""
    total, hidden = packed.shape
    check_unpack_rows(lengths, total)
    out = torch.empty((len(lengths), max_len, hidden), dtype=packed.dtype, device=packed.device)
    if out.numel():
        _launch(packed.contiguous(), out, lengths, starts or [0] * len(lengths), max_len, hidden, unpack=True)
    return out


_PackFn, _UnpackFn = pack_functions(pack_forward, unpack_forward)


def pack(x: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
    """Rows [starts[b], starts[b] + lengths[b]) of every batch row of x [B, L, H], packed in order.

    ``starts`` (default zeros: right padding) is where each sample begins in its row (L - length: left padding).
    """
    check_pack(x, lengths)
    return _PackFn.apply(x, *_lengths_host(lengths, x.shape[1], starts))


def unpack(packed: torch.Tensor, lengths: torch.Tensor, max_len: int,
           starts: torch.Tensor | None = None) -> torch.Tensor:
    """Packed rows [T, H] back to a zero-padded batch [B, max_len, H] (inverse layout of ``pack``)."""
    check_unpack(packed, lengths)
    lens, first = _lengths_host(lengths, int(max_len), starts)
    return _UnpackFn.apply(packed, lens, int(max_len), first)
