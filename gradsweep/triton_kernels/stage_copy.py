"""The Triton family's staging copy for the canonical fold: a call's staged rows copied by their pieces.

Why: a fold call stages the rows of tiles it cannot fold yet. Described row by row, that is an O(rows) index built
and uploaded on the host and ``index_select`` + ``index_copy_`` per row tensor (two launches, and a temporary the
size of the staged rows, so every byte moves twice). Described by its pieces (source row, staging row, length:
~25 a chunked call at 16384 rows), the host uploads O(pieces) and one launch per row tensor moves each byte once.
A copy: the same rows land in the same staging rows, so no bit of any fold changes
(``CanonicalFold.take_tiles(..., stage_copy=copy_pieces)``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradsweep.triton_kernels._launch import FastLaunch

_ELEMS = 4096  # elements a program moves per column step (rows x columns)
_MAX_COLS = 1024


@triton.jit
def _piece_copy_kernel(pieces, src, dst, src_stride, ROW: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """Program (p, b): rows b * BR .. of piece p (source row, staging row, length), ROW elements each."""
    p = tl.program_id(0)
    s0 = tl.load(pieces + p * 3)
    d0 = tl.load(pieces + p * 3 + 1)
    n = tl.load(pieces + p * 3 + 2)
    r = tl.program_id(1) * BR + tl.arange(0, BR)
    live = r < n  # (a program past its piece's end masks every row: no memory traffic)
    src_row = (s0 + r).to(tl.int64) * src_stride
    dst_row = (d0 + r).to(tl.int64) * ROW
    for c in tl.static_range(0, ROW, BC):
        cols = c + tl.arange(0, BC)
        m = live[:, None] & (cols[None, :] < ROW)
        tl.store(dst + dst_row[:, None] + cols[None, :], tl.load(src + src_row[:, None] + cols[None, :], mask=m),
                 mask=m)


_COPY = FastLaunch(_piece_copy_kernel)


def copy_pieces(pieces: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, longest: int) -> None:
    """Every piece's rows of ``src`` into ``dst`` (the fold's staging tensor: contiguous, the same row shape and
    dtype); ``pieces`` [P, 3] int32 on the device, ``longest`` its longest length (the grid's second axis)."""
    row = src.shape[1:].numel()  # (1 for a tensor of one value a row: token ids)
    if pieces.shape[0] == 0 or longest <= 0 or row == 0:
        return
    if src.dtype == torch.bool:  # (Triton loads bool as int1: move the bytes)
        src, dst = src.view(torch.uint8), dst.view(torch.uint8)
    if src.dim() > 1 and not src[0].is_contiguous():  # rows must be contiguous inside; rows may be strided
        src = src.contiguous()
    stride = src.stride(0)
    cols = max(16, min(triton.next_power_of_2(row), _MAX_COLS))
    rows = max(1, _ELEMS // cols)
    _COPY((pieces.shape[0], triton.cdiv(longest, rows)), [pieces, src, dst, stride],
          {"ROW": row, "BR": rows, "BC": cols}, num_warps=4)
