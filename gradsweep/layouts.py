"""Physical layouts: how the logical samples reach an operator, as a sequence of calls.

A call carries the logical identity of each physical row (the restore map) and the segments of
samples it holds; all comparison happens after restoring rows to logical identity.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from gradsweep.canonical import RowIdentity

LAYOUT_NAMES: tuple[str, ...] = (
    "bn_full", "bn_chunked", "b1_singleton", "bn_padded_right", "bn_padded_left",
    "bn_permuted", "bn_mask_density", "bn_neighbors", "prefix_cache", "decode", "bn_strided",
)
REFERENCE_LAYOUT = "bn_full"

# How the backwards of a multi-call layout are ordered. "reverse": every forward first, then the backwards
# in reverse call order, as autograd runs a model over chunks of one step; "interleaved": F0 B0 F1 B1 ...,
# as gradient accumulation runs micro-batches. Layouts whose calls can be micro-batches run both.
SCHEDULES: tuple[str, ...] = ("reverse", "interleaved")
INTERLEAVED_LAYOUTS: frozenset[str] = frozenset({"bn_chunked", "b1_singleton", "bn_neighbors"})


def schedules_for(layout: str, n_calls: int) -> tuple[str, ...]:
    """The backward orders a layout is checked under (one order when it has a single call)."""
    if n_calls <= 1:
        return ("reverse",)
    return SCHEDULES if layout in INTERLEAVED_LAYOUTS else ("reverse",)


FILLER_BASE = -2  # filler sample ids are -2, -3, ...: never a logical sample, never the pad id (-1)


@dataclass(frozen=True)
class Segment:
    """A contiguous run of one sample's tokens inside a call (sample <= -2: a loss-masked filler)."""

    sample: int
    start: int
    length: int
    row_offset: int


@dataclass(frozen=True)
class Call:
    """One invocation of the operator.

    ``rows`` is flattened physical order; when ``padded`` is (B, L) the rows are a [B, L] batch
    and segment b occupies batch row b.
    """

    rows: RowIdentity
    segments: tuple[Segment, ...]
    padded: tuple[int, int] | None = None
    strided: bool = False  # row tensors handed as views into wider buffers (``strided_copy``; the run's parameters
    # and main grads then sit at an offset in flat buffers: ``offset_copy``)

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows


STRIDE_GAP = 8  # elements of garbage before each row of a strided call's tensors, and after it (16 bytes of bf16)


def strided_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a view into a wider buffer: each row followed by garbage and the view starting past a
    gap (row stride larger than the row, nonzero storage offset), as a slice of a fused QKV projection, a
    shifted label column or an inference engine's batch buffer hands a kernel its rows. The gaps hold NaN in
    float tensors and -1 (never a valid index) in integer ones: a kernel that assumes contiguous rows reads
    them. The view's element strides within a row stay 1, and each row starts 16-byte aligned for bf16."""
    if t.dim() == 0 or t.shape[0] == 0:
        return t
    rows = t.shape[0]
    flat = t.detach().reshape(rows, -1)
    width = flat.shape[1]
    fill = float("nan") if t.is_floating_point() else (True if t.dtype == torch.bool else -1)
    buf = torch.full((rows, width + 2 * STRIDE_GAP), fill, dtype=t.dtype, device=t.device)
    view = buf[:, STRIDE_GAP:STRIDE_GAP + width]
    view.copy_(flat)
    return view.unflatten(1, t.shape[1:]) if t.dim() > 1 else view[:, 0]


def offset_copy(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values as a contiguous view that starts ``STRIDE_GAP`` elements into a larger buffer (NaN before and
    after it), as parameters and main grads live in a distributed optimizer's flat buffers (Megatron, FSDP): a
    kernel must honour the storage offset of a weight it reads and of a main grad it folds into."""
    buf = torch.full((t.numel() + 2 * STRIDE_GAP,), float("nan"), dtype=t.dtype, device=t.device)
    view = buf[STRIDE_GAP:STRIDE_GAP + t.numel()].view(t.shape)
    view.copy_(t.detach())
    return view


def _packed_call(pieces: Sequence[tuple[int, int, int]]) -> Call:
    """pieces: (sample, start, length) packed one after another."""
    segs, offset = [], 0
    for sample, start, length in pieces:
        segs.append(Segment(sample, start, length, offset))
        offset += length
    sample = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, _, n in pieces])
    position = torch.cat([torch.arange(p, p + n, dtype=torch.int64) for _, p, n in pieces])
    return Call(RowIdentity(sample, position), tuple(segs))


def _padded_call(pieces: Sequence[tuple[int, int, int]], left: bool) -> Call:
    width = max(n for _, _, n in pieces)
    sample = torch.full((len(pieces), width), -1, dtype=torch.int64)
    position = torch.zeros((len(pieces), width), dtype=torch.int64)
    segs = []
    for b, (s, p, n) in enumerate(pieces):
        col = width - n if left else 0
        sample[b, col:col + n] = s
        position[b, col:col + n] = torch.arange(p, p + n)
        segs.append(Segment(s, p, n, b * width + col))
    return Call(RowIdentity(sample.flatten(), position.flatten()), tuple(segs), (len(pieces), width))


def as_padded(call: Call) -> Call:
    """The same segments as a right-padded batch (for ops whose input is inherently padded)."""
    if call.padded is not None:
        return call
    padded = _padded_call([(s.sample, s.start, s.length) for s in call.segments], left=False)
    return replace(padded, strided=call.strided)


def default_chunks(lengths: Sequence[int], seed: int) -> list[list[int]]:
    """Irregular chunk sizes per sample (seeded): several chunks where the sample allows."""
    rng = random.Random(seed * 7919 + 17)
    out = []
    for n in lengths:
        sizes, left = [], n
        while left > 0:
            take = min(left, rng.randint(1, max(1, (n + 2) // 3)))
            sizes.append(take)
            left -= take
        out.append(sizes)
    return out


def default_order(n: int, seed: int) -> list[int]:
    """A seeded permutation of the samples that is never the identity (for n > 1)."""
    order = list(range(n))
    rng = random.Random(seed * 104729 + 3)
    while n > 1 and order == sorted(order):
        rng.shuffle(order)
    return order


def default_groups(n: int, seed: int) -> list[list[int]]:
    """Samples regrouped so that each call puts samples beside neighbours they never had in bn_full."""
    rng = random.Random(seed * 15485863 + 11)
    n_calls = 1 if n < 2 else min(3, max(2, n // 2))
    groups: list[list[int]] = [[] for _ in range(n_calls)]
    for s in range(n):
        groups[s % n_calls].append(s)
    for g in groups:
        g.reverse()
    rng.shuffle(groups)
    return [g for g in groups if g]


def default_prefix(lengths: Sequence[int], seed: int) -> list[int]:
    """Per-sample prefix lengths for prefix_cache (seeded; a prefix always leaves a continuation when it can)."""
    rng = random.Random(seed * 32452843 + 5)
    return [n if n < 2 else rng.randint(1, n - 1) for n in lengths]


def validate_layout(name: str, spec, lengths: Sequence[int]) -> None:
    """Refuse layout parameters that cannot describe these samples (messages name the fix)."""
    if spec.chunks is not None:
        if name != "bn_chunked":
            raise ValueError(f"layouts.{name}.chunks: only bn_chunked takes chunk sizes")
        if len(spec.chunks) != len(lengths):
            raise ValueError(f"layouts.bn_chunked.chunks: {len(spec.chunks)} chunk lists for "
                             f"{len(lengths)} samples; give one list per sample")
        for i, (sizes, n) in enumerate(zip(spec.chunks, lengths)):
            if sum(sizes) != n:
                raise ValueError(f"layouts.bn_chunked.chunks[{i}]: chunk sizes {sizes} sum to {sum(sizes)}, "
                                 f"but sample {i} has length {n}; make them sum to {n}")
    if spec.order is not None:
        if name != "bn_permuted":
            raise ValueError(f"layouts.{name}.order: only bn_permuted takes an order")
        if sorted(spec.order) != list(range(len(lengths))):
            raise ValueError(f"layouts.bn_permuted.order: {spec.order} is not a permutation of "
                             f"0..{len(lengths) - 1}")
    if spec.filler_lengths is not None and name != "bn_mask_density":
        raise ValueError(f"layouts.{name}.filler_lengths: only bn_mask_density takes filler samples")
    if spec.groups is not None:
        if name != "bn_neighbors":
            raise ValueError(f"layouts.{name}.groups: only bn_neighbors takes groups")
        flat = sorted(s for g in spec.groups for s in g)
        if flat != list(range(len(lengths))) or any(not g for g in spec.groups):
            raise ValueError(f"layouts.bn_neighbors.groups: {spec.groups} must name every sample 0.."
                             f"{len(lengths) - 1} exactly once, in non-empty groups")
    if spec.prefix is not None:
        if name != "prefix_cache":
            raise ValueError(f"layouts.{name}.prefix: only prefix_cache takes prefix lengths")
        if len(spec.prefix) != len(lengths) or any(not 1 <= p <= n for p, n in zip(spec.prefix, lengths)):
            raise ValueError(f"layouts.prefix_cache.prefix: {spec.prefix} must give one prefix length per sample, "
                             f"each between 1 and the sample's length ({list(lengths)})")


def build_calls(name: str, spec, lengths: Sequence[int], seed: int) -> list[Call]:
    """The calls of one layout, in the order they are made."""
    n = len(lengths)
    whole = [(s, 0, lengths[s]) for s in range(n)]
    if name == "bn_full":
        return [_packed_call(whole)]
    if name == "bn_strided":  # the reference's rows in other memory: only the tensors' strides differ
        return [replace(_packed_call(whole), strided=True)]
    if name == "b1_singleton":
        return [_packed_call([piece]) for piece in whole]
    if name == "bn_padded_right":
        return [_padded_call(whole, left=False)]
    if name == "bn_padded_left":
        return [_padded_call(whole, left=True)]
    if name == "bn_permuted":
        order = spec.order if spec is not None and spec.order is not None else default_order(n, seed)
        return [_packed_call([whole[s] for s in order])]
    if name == "bn_mask_density":
        fillers = (spec.filler_lengths if spec is not None and spec.filler_lengths else [3, 11, 7])
        pieces: list[tuple[int, int, int]] = []
        for s in range(n):
            pieces.append(whole[s])
            pieces.append((FILLER_BASE - s, 0, fillers[s % len(fillers)]))  # a distinct filler sample id each
        return [_packed_call(pieces)]
    if name == "bn_neighbors":
        groups = spec.groups if spec is not None and spec.groups is not None else default_groups(n, seed)
        return [_packed_call([whole[s] for s in g]) for g in groups]
    if name == "prefix_cache":
        prefix = spec.prefix if spec is not None and spec.prefix is not None else default_prefix(lengths, seed)
        # One request writes every prefix; two continuation requests (in another sample order) reuse it.
        calls = [_packed_call([(s, 0, prefix[s]) for s in range(n)])]
        rest = [(s, prefix[s], lengths[s] - prefix[s]) for s in range(n) if lengths[s] > prefix[s]]
        first = [(s, p, (k + 1) // 2) for s, p, k in rest]
        second = [(s, p + (k + 1) // 2, k - (k + 1) // 2) for s, p, k in rest if k > 1]
        calls += [_packed_call(list(reversed(first)))] if first else []
        calls += [_packed_call(second)] if second else []
        return calls
    if name == "bn_chunked":
        chunks = spec.chunks if spec is not None and spec.chunks is not None else default_chunks(lengths, seed)
        starts = [[sum(c[:i]) for i in range(len(c))] for c in chunks]
        calls = []
        for k in range(max(len(c) for c in chunks)):
            pieces = [(s, starts[s][k], chunks[s][k]) for s in range(n) if k < len(chunks[s])]
            calls.append(_packed_call(pieces))
        return calls
    if name == "decode":
        return [_packed_call([(s, p, 1) for s in range(n) if p < lengths[s]]) for p in range(max(lengths))]
    raise ValueError(f"unknown layout {name!r}; allowed: {', '.join(LAYOUT_NAMES)}")


def same_physical_calls(a: Sequence[Call], b: Sequence[Call]) -> bool:
    """True when two layouts hand the operator exactly the same calls (a cell comparing them is a tautology)."""
    if len(a) != len(b):
        return False
    return all(x.padded == y.padded and x.strided == y.strided and torch.equal(x.rows.sample, y.rows.sample)
               and torch.equal(x.rows.position, y.rows.position) for x, y in zip(a, b))
