"""The logical workload (C2): every value is a pure function of (seed, stream, sample, position, element).

Inputs and upstream gradients are hashed from logical identity with integer arithmetic that is
exact on any device, so every layout, on CPU or GPU, sees the same numbers for the same token.
The harness, never an op adapter, fixes the upstream gradient, the loss mask and the active-token
denominator: they depend on logical identity only.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gradsweep.canonical import RowIdentity

_MASK32 = 0xFFFFFFFF
_CHUNK_ELEMENTS = 1 << 24  # elements hashed at once (int64 temporaries of 128 MiB)
PAD_SAMPLE_KEY = 0x7FFF0000  # pads hash with this sample key and their physical row: garbage, never zero
PAD = -1  # sample id of a pad row (padded batches); fillers (loss-masked neighbour samples) are -2, -3, ...
# What a pad row holds, by element: NaN, +inf, -inf or a large finite value (what an uninitialised buffer gives).
_PAD_VALUES = (float("nan"), float("inf"), float("-inf"), 1.0e4)
_DENOMINATORS: dict[tuple, int] = {}  # (seed, lengths, active_fraction) -> active tokens of the step


def _mix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding 32-bit values (low bits exact on any device)."""
    h = h & _MASK32
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def stream_key(seed: int, stream: str) -> int:
    """A 32-bit key for one named stream of values."""
    return zlib.crc32(f"{seed}:{stream}".encode()) & _MASK32


def hashed_uniform(key: int, sample: torch.Tensor, position: torch.Tensor, numel: int) -> torch.Tensor:
    """float64 uniforms in [0, 1), shape [R, numel], from (key, sample, position, element)."""
    device = sample.device
    h = _mix32(torch.full_like(sample, key) ^ _mix32(sample + 0x9E3779B9))
    h = _mix32(h ^ _mix32(position + 0x632BE5AB))
    elems = torch.arange(numel, dtype=torch.int64, device=device)
    h = _mix32(h[:, None] ^ _mix32(elems[None, :] * 0x27D4EB2F + 0x165667B1))
    return h.to(torch.float64) / float(1 << 32)


@dataclass(frozen=True)
class Workload:
    """Logical samples and the seed that defines every value in a sweep."""

    seed: int
    lengths: tuple[int, ...]
    active_fraction: float = 0.85

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def logical_rows(self) -> RowIdentity:
        """Every logical token once, in canonical (sample, position) order."""
        return RowIdentity.packed(self.lengths)

    def logical_index(self, rows: RowIdentity) -> torch.Tensor:
        """Canonical token index of each row (-1 for pads and fillers)."""
        starts = torch.tensor([0, *self.lengths], dtype=torch.int64).cumsum(0)[:-1]
        s = rows.sample.cpu()
        idx = torch.full_like(s, -1)
        real = s >= 0
        idx[real] = starts[s[real]] + rows.position.cpu()[real]
        return idx

    def _keys(self, rows: RowIdentity, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        s = rows.sample.to(device)
        p = rows.position.to(device)
        pad = s < 0
        row = torch.arange(s.numel(), dtype=torch.int64, device=device)
        # pads and fillers: distinct garbage per physical row, so they can never pass for a real token
        return torch.where(pad, PAD_SAMPLE_KEY + (-s), s), torch.where(pad, row, p)

    def values(self, stream: str, rows: RowIdentity, feature: Sequence[int], scale: float = 1.0,
               device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Values of unit variance (times ``scale``), shape [R, *feature], drawn in float64 then cast.

        Pad rows (sample -1) hold NaN / +-inf / huge values, as an uninitialised buffer would: a kernel
        that lets a pad reach a reduction or a logical output turns a logical value into NaN or inf.
        Filler rows (loss-masked neighbour samples) hold finite garbage of their own.

        Drawn in row chunks: a [7217, 151936] logits input would otherwise need tens of GB of
        int64 temporaries. Chunking changes no value (every element is hashed independently).
        """
        return self._draw(stream, rows, feature, scale, torch.device(device), dtype, None)

    def _draw(self, stream: str, rows: RowIdentity, feature: Sequence[int], scale: float, device: torch.device,
              dtype: torch.dtype, mask: torch.Tensor | None, denominator: int = 1) -> torch.Tensor:
        numel = 1
        for f in feature:
            numel *= int(f)
        s, p = self._keys(rows, device)
        host_pad = rows.sample.cpu() == PAD
        any_pad = bool(host_pad.any())  # decided on the host: no device sync per draw
        pad = host_pad.to(device)
        key = stream_key(self.seed, stream)
        out = torch.empty((rows.num_rows, numel), dtype=dtype, device=device)
        step = max(1, _CHUNK_ELEMENTS // max(numel, 1))
        hostile = torch.tensor(_PAD_VALUES, dtype=torch.float64, device=device)
        for r0 in range(0, rows.num_rows, step):
            u = hashed_uniform(key, s[r0:r0 + step], p[r0:r0 + step], numel)
            v = (u * 2.0 - 1.0) * (3.0 ** 0.5) * scale
            if mask is not None:  # real rows: loss mask / denominator; pads and fillers keep their garbage
                real = rows.sample.to(device)[r0:r0 + step] >= 0
                v = torch.where(real[:, None], v * mask[r0:r0 + step, None] / denominator, v)
            pad_rows = pad[r0:r0 + step]
            if any_pad:
                pick = hostile[(u * 1e6).to(torch.int64) % len(_PAD_VALUES)]
                v = torch.where(pad_rows[:, None], pick, v)
            out[r0:r0 + step] = v.to(dtype)
        return out.reshape(rows.num_rows, *feature)

    def indices(self, stream: str, rows: RowIdentity, high: int,
                device: torch.device | str = "cpu") -> torch.Tensor:
        """int64 values in [0, high) per row (token ids, targets)."""
        device = torch.device(device)
        s, p = self._keys(rows, device)
        u = hashed_uniform(stream_key(self.seed, stream), s, p, 1)[:, 0]
        return (u * high).to(torch.int64).clamp_(max=high - 1)

    def active_mask(self, rows: RowIdentity, device: torch.device | str = "cpu") -> torch.Tensor:
        """Loss mask per row: a pure function of logical identity; pads and fillers are inactive."""
        device = torch.device(device)
        s, p = self._keys(rows, device)
        u = hashed_uniform(stream_key(self.seed, "active"), s, p, 1)[:, 0]
        return (u < self.active_fraction) & (rows.sample.to(device) >= 0)

    def active_denominator(self) -> int:
        """Number of active logical tokens: the loss denominator, fixed across layouts."""
        key = (self.seed, self.lengths, self.active_fraction)
        if key not in _DENOMINATORS:
            _DENOMINATORS[key] = int(self.active_mask(self.logical_rows()).sum().clamp(min=1))
        return _DENOMINATORS[key]

    def upstream(self, stream: str, rows: RowIdentity, feature: Sequence[int],
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Upstream gradient rows: values x loss mask / active-token denominator (float64 math, then cast).

        Pad rows receive NaN / inf / huge gradients and filler rows finite nonzero ones (whatever the
        buffer held): a kernel that folds a row it should skip is caught, it never adds a harmless 0.
        """
        device = torch.device(device)
        mask = self.active_mask(rows, device).to(torch.float64)
        return self._draw(f"grad:{stream}", rows, feature, 1.0, device, dtype, mask, self.active_denominator())

    def active_counts(self) -> torch.Tensor:
        """Active (loss-carrying) tokens of each logical sample, float64 [num_samples] (exact integers)."""
        rows = self.logical_rows()
        mask = self.active_mask(rows).to(torch.float64)
        return torch.zeros(self.num_samples, dtype=torch.float64).index_add_(0, rows.sample, mask)

    def loss_upstream(self, stream: str, rows: RowIdentity, reduction: str, device: torch.device | str = "cpu",
                      dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Upstream gradient of a per-token loss term [R]: exactly the weight of the harness's loss reduction.

        ``token_mean``: mask / active-token denominator (the masked token mean). ``sequence_mean``: mask /
        (S x A_s), A_s the sample's active tokens and S the samples holding any (the mean over sequences of
        each sequence's token mean). Both depend on logical identity only; pads and fillers receive the
        same hostile garbage as ``upstream``.
        """
        device = torch.device(device)
        mask = self.active_mask(rows, device).to(torch.float64)
        if reduction == "token_mean":
            weight = mask / self.active_denominator()
        elif reduction == "sequence_mean":
            counts = self.active_counts().to(device)
            sequences = max(int((counts > 0).sum()), 1)
            per_row = counts[rows.sample.to(device).clamp(min=0)].clamp(min=1.0)
            weight = mask / (per_row * sequences)
        else:
            raise ValueError(f"loss reduction {reduction!r}: use 'token_mean' or 'sequence_mean'")
        garbage = self._draw(f"grad:{stream}", rows, (), 1.0, device, torch.float64, None)
        return torch.where(rows.sample.to(device) >= 0, weight, garbage).to(dtype)

    def main_grad_start(self, name: str, shape: Sequence[int], scale: float,
                        device: torch.device | str = "cpu") -> torch.Tensor:
        """The FP32 main grad a parameter holds before this step (earlier micro-batches), from (seed, name).

        ``scale`` sets its RMS (the harness uses the RMS of this step's own reference gradient, so
        the start neither vanishes next to the step's contribution nor swamps it).
        """
        gen = torch.Generator(device="cpu").manual_seed(stream_key(self.seed, f"main_grad:{name}"))
        unit = torch.rand(tuple(shape), generator=gen, dtype=torch.float32).mul_(2).sub_(1)
        return unit.mul_(float(scale) * 3 ** 0.5).to(device)

    def params(self, name: str, shape: Sequence[int], scale: float, dtype: torch.dtype,
               device: torch.device | str) -> torch.Tensor:
        """A parameter tensor from (seed, name): the same in every layout of a sweep."""
        gen = torch.Generator(device="cpu").manual_seed(stream_key(self.seed, f"param:{name}"))
        return ((torch.rand(tuple(shape), generator=gen, dtype=torch.float32) * 2 - 1) * (3 ** 0.5)
                * scale).to(dtype=dtype).to(device)
