"""Host data on the device without stalling the host behind queued GPU work.

A plain ``tensor.to("cuda")`` from pageable memory synchronises the stream: the host waits for every kernel
queued before the copy, so the next call's planning can no longer overlap the device (seen on the H200: RoPE's
positions upload made its end-to-end time 4x its kernels). A pinned buffer and a non-blocking copy keep the host
running; torch's caching host allocator keeps the pinned block alive until the copy has run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def upload(a: np.ndarray | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``a`` (host array or tensor) on ``device`` as a contiguous tensor (of ``dtype`` when given)."""
    host = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    if dtype is not None and host.dtype != dtype:
        host = host.to(dtype)
    if device.type != "cuda" or host.is_cuda:
        return host.to(device).contiguous()
    return host.contiguous().pin_memory().to(device, non_blocking=True)


_ALIGN = 16  # bytes: every part starts 16-byte aligned in the packed buffer (its device view may be reinterpreted)
_TORCH_DTYPES = {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
                 np.dtype(np.float32): torch.float32}


def upload_parts(parts: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Several host arrays on ``device`` through one pinned copy: their bytes packed into one buffer (each part
    16-byte aligned), uploaded once, and handed back as device views of the parts' dtypes and shapes (the same
    values as ``upload`` of each). Why: each upload costs a pinned allocation and a copy launch (~25 us of host
    on the H200); a fold call that stages rows uploads a row index and its descriptors together."""
    arrays = [np.ascontiguousarray(p) for p in parts]
    if device.type != "cuda":
        return [upload(a, device) for a in arrays]
    host, offsets = pack_parts(arrays)
    return part_views(upload(host, device), arrays, offsets)


def pack_parts(arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """The arrays' bytes in one uint8 buffer, each starting at a multiple of 16 bytes; (buffer, byte offsets)."""
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // _ALIGN) * _ALIGN
    host = np.zeros(max(total, _ALIGN), dtype=np.uint8)
    for a, off in zip(arrays, offsets):
        host[off:off + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return host, offsets


def part_views(buffer: torch.Tensor, arrays: Sequence[np.ndarray], offsets: Sequence[int]) -> list[torch.Tensor]:
    """Views of a packed ``buffer`` (uint8, as ``pack_parts`` made it) with the arrays' dtypes and shapes."""
    return [buffer[off:off + a.nbytes].view(_TORCH_DTYPES[a.dtype]).view(a.shape) for a, off in zip(arrays, offsets)]
