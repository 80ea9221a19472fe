"""Pack / unpack between a padded batch [B, L, H] and packed rows [sum(lengths), H] (gradsweep._C).

Both are row copies between a sample's padded slot and its packed slot (pure data movement, bit-exact,
row-wise; pad rows are never read by pack and are written as zeros by unpack), and each is the other's
adjoint, so the backward of one is the forward of the other. Sample b's real rows are slots
[starts[b], starts[b] + lengths[b]) of its padded row block: ``starts`` defaults to zeros (right padding);
left padding passes L - lengths.
"""

from __future__ import annotations

import torch

from gradsweep.cuda_kernels import runtime as rt
from gradsweep.kernel_api import check_pack, check_unpack, check_unpack_rows, pack_functions, sample_table


def _lengths_host(lengths: torch.Tensor, max_len: int) -> list[int]:
    host = [int(n) for n in lengths.cpu().tolist()]
    if any(n < 0 or n > max_len for n in host):
        raise ValueError(f"pack: lengths must lie in [0, {max_len}], got {host}")
    return host


def _starts_host(starts: torch.Tensor | None, lengths: list[int], max_len: int) -> list[int]:
    if starts is None:
        return [0] * len(lengths)
    host = [int(s) for s in starts.cpu().tolist()]
    if len(host) != len(lengths) or any(s < 0 or s + n > max_len for s, n in zip(host, lengths)):
        raise ValueError(f"pack: starts must give each sample's first real slot, with start + length <= {max_len}; "
                         f"got starts {host} for lengths {lengths}")
    return host


def _launch(src: torch.Tensor, dst: torch.Tensor, lengths: list[int], max_len: int, hidden: int,
            unpack: bool, starts: list[int] | None = None) -> None:
    n_samples = len(lengths)
    if n_samples == 0 or max_len == 0 or hidden == 0:
        return
    meta = sample_table(lengths, starts, src.device)
    dev, stream = rt.launch(src)
    rt.ext().pack_rows(rt.ptr(src), rt.ptr(dst), rt.ptr(meta), n_samples, max_len, hidden, unpack, dev, stream)


def pack_forward(x: torch.Tensor, lengths: list[int], starts: list[int] | None = None) -> torch.Tensor:
    """Launcher (no autograd): x [B, L, H] -> [sum(lengths), H]."""
    _, max_len, hidden = x.shape
    x = x.to(torch.bfloat16).contiguous()
    out = torch.empty((sum(lengths), hidden), dtype=x.dtype, device=x.device)
    if out.numel():
        _launch(x, out, lengths, max_len, hidden, unpack=False, starts=starts)
    return out


def unpack_forward(packed: torch.Tensor, lengths: list[int], max_len: int,
                   starts: list[int] | None = None) -> torch.Tensor:
    """Launcher (no autograd): packed [T, H] -> [B, max_len, H], pad rows zero."""
    total, hidden = packed.shape
    check_unpack_rows(lengths, total)
    packed = packed.to(torch.bfloat16).contiguous()
    out = torch.empty((len(lengths), max_len, hidden), dtype=packed.dtype, device=packed.device)
    if out.numel():
        _launch(packed, out, lengths, max_len, hidden, unpack=True, starts=starts)
    return out


_PackFn, _UnpackFn = pack_functions(pack_forward, unpack_forward)


def pack(x: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
    """Real rows of every sample of x [B, L, H], packed in sample order: [sum(lengths), H].

    Sample b's rows are slots [starts[b], starts[b] + lengths[b]) (starts default: 0, right padding).
    """
    check_pack(x, lengths)
    rt.check_tensor("pack x", x)
    lens = _lengths_host(lengths, x.shape[1])
    return _PackFn.apply(x, lens, _starts_host(starts, lens, x.shape[1]))


def unpack(packed: torch.Tensor, lengths: torch.Tensor, max_len: int,
           starts: torch.Tensor | None = None) -> torch.Tensor:
    """Packed rows [T, H] back to a zero-padded batch [B, max_len, H] (inverse layout of ``pack``)."""
    check_unpack(packed, lengths)
    rt.check_tensor("unpack packed", packed)
    lens = _lengths_host(lengths, int(max_len))
    return _UnpackFn.apply(packed, lens, int(max_len), _starts_host(starts, lens, int(max_len)))
