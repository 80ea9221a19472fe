"""The CUDA C++ family's staging copy for the canonical fold: a call's carried rows copied by their pieces.

Why: a fold call carries the rows of tiles it cannot fold yet into staging. Described row by row, that is an O(rows)
index built and uploaded on the host and ``index_select`` + ``index_copy_`` per row tensor (two launches, and a
temporary the size of the carried rows, so every byte moves twice). Described by its pieces (source row, staging
row, length: ~25 a chunked call at 16384 rows), the host uploads O(pieces) with the fold's row table and one launch
per row tensor moves each byte once (csrc/gather.cu, ``copy_pieces_kernel``). A copy: the same rows land in the
same staging rows, so no bit of any fold changes (``CanonicalFold.take(..., stage_copy=copy_pieces)``). The Triton
family has its own (gradsweep/triton_kernels/stage_copy.py): neither borrows the other's kernels.
"""

from __future__ import annotations

import torch

from gradsweep.cuda_kernels import runtime as rt


def copy_pieces(pieces: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, longest: int) -> None:
    """Every piece's rows of ``src`` into ``dst`` (the fold's staging tensor: contiguous, the same row shape and
    dtype; any dtype: rows move as bytes); ``pieces`` [P, 3] int32 on the device, ``longest`` its longest length."""
    row = src.shape[1:].numel()  # (1 for a tensor of one value a row: token ids, rstd)
    if pieces.shape[0] == 0 or longest <= 0 or row == 0:
        return
    if src.dim() > 1 and not src[0].is_contiguous():  # rows must be contiguous inside; rows may be strided
        src = src.contiguous()
    size = src.element_size()
    dev, stream = rt.launch(dst)
    rt.ext().copy_pieces(rt.ptr(pieces), rt.ptr(src), rt.ptr(dst), pieces.shape[0], longest, src.stride(0) * size,
                         row * size, dev, stream)
