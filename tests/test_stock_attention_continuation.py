"""The stock chain's attention over a KV cache (gradsweep.nn.modules): a continuation call (chunked prefill,
prefix cache, decode) computes what an explicit causal mask would, without the mask.

Why it matters: SDPA takes an explicit mask with ``enable_gqa`` only in its math kernel, which saves every call's
K / V expanded to all query heads for the backward; over the release chain's stock decode that is ~33 GB, and it
ran an 80 GB H100 out of memory (chain/torch_bf16/decode, 2026-12-05). The continuation must therefore reach SDPA
as a causal pattern aligned to the last key, never as a tensor mask. On the CPU both reach the same kernel, so
outputs and gradients must be equal to the bit.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.bias import CausalBias

from gradsweep.canonical import RowIdentity
from gradsweep.nn import modules
from gradsweep.stock import sdpa


def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int) -> torch.Tensor:
    """The explicit-mask SDPA the stock path used before: row at position p sees keys 0..p."""
    pos = torch.arange(first, first + q.shape[0])
    qs, ks, vs = (t.transpose(0, 1)[None] for t in (q, k, v))
    mask = torch.arange(k.shape[0])[None, :] <= pos[:, None]
    return sdpa(qs, ks, vs, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("first", "rows"), [(5, 3), (9, 1), (1, 4)])
def test_continuation_equals_the_explicit_mask(dtype: torch.dtype, first: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(first * 31 + rows)
    q = torch.randn(rows, 8, 16, generator=gen).to(dtype).requires_grad_(True)
    k = torch.randn(first + rows, 2, 16, generator=gen).to(dtype).requires_grad_(True)
    v = torch.randn(first + rows, 2, 16, generator=gen).to(dtype).requires_grad_(True)
    got, want = modules._causal_sdpa(q, k, v, first), _masked(q, k, v, first)
    assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    g = torch.randn(got.shape, generator=gen).to(dtype)
    for a, b in zip(torch.autograd.grad(got, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
        assert torch.equal(a, b)


def test_continuation_reaches_sdpa_without_a_tensor_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    def spy(q, k, v, **kwargs):
        seen.append(kwargs.get("attn_mask"))
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(modules, "stock_sdpa", spy)
    q, k, v = torch.randn(2, 4, 8), torch.randn(7, 2, 8), torch.randn(7, 2, 8)
    modules._causal_sdpa(q, k, v, 5)
    modules._causal_sdpa(q, k[:2], v[:2], 0)
    assert isinstance(seen[0], CausalBias), f"a continuation passed {type(seen[0]).__name__} as its mask"
    assert seen[1] is None


def test_keys_must_be_the_cache_then_the_rows() -> None:
    q, k = torch.randn(2, 4, 8), torch.randn(6, 2, 8)
    with pytest.raises(ValueError, match="6 keys for 2 rows after 5 cached"):
        modules._causal_sdpa(q, k, k, 5)


def test_a_call_must_hand_a_sample_consecutive_positions() -> None:
    ok = RowIdentity.packed([3, 2], [0, 1], [4, 0])
    assert [(s, first) for s, _, _, first in modules._sample_rows(ok, torch.device("cpu"))] == [(0, 4), (1, 0)]
    gap = RowIdentity(torch.tensor([0, 0, 0]), torch.tensor([4, 5, 7]))
    with pytest.raises(ValueError, match=r"sample 0 has 3 rows at positions 4\.\.7"):
        list(modules._sample_rows(gap, torch.device("cpu")))
