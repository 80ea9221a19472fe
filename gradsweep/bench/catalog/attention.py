"""Attention cases (issue 11): causal GQA prefill at 8 x 1024 and 2 x 8192 tokens (32 query / 8 K/V heads x 128),
forward and forward + backward, against batched flash SDPA with K/V expanded (``sdpa``) and the op's stock path;
and a decode step (64 sequences x 1 new token over a 4096-token cache) against SDPA on the same cache.

The decode step has its own subject: the cache is filled once (not timed), and each timed step rewinds it and
attends the new tokens, the way a server's decode step runs. Its bitwise claim: the decode step's output is
the training forward's output for those tokens (a full prefill of the same sequences), bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gradsweep.bench.baselines import Reference
from gradsweep.bench.cases import STOCK, Case
from gradsweep.bench.checks import bitwise_record
from gradsweep.bench.data import draw
from gradsweep.bench.predicate import CheckRecord
from gradsweep.canonical import RowIdentity
from gradsweep.families import KERNEL_FAMILIES
from gradsweep.ops.base import Candidate, OpSpec, kernel_module

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128


def _causal_flops(shape: dict, tokens: int, seq: int, passes: float) -> float:
    # 2 GEMMs of 2 * seq * (seq + 1) / 2 * head_dim per head and sequence (causal half), forward = 1 pass
    return passes * 4.0 * shape["heads"] * shape["head_dim"] * (tokens / seq) * seq * (seq + 1) / 2


def prefill(batch: int, seq: int, shape: dict) -> list[Case]:
    lengths = (seq,) * batch
    common = {"baselines": (STOCK, "sdpa"), "families": KERNEL_FAMILIES,
              "check_layouts": ("b1_singleton", "bn_chunked")}
    title = f"{batch} x {seq}, {shape['heads']}/{shape['kv_heads']} heads x {shape['head_dim']}, causal"
    return [Case("attention", f"fwd_{batch}x{seq}", f"fwd {title}", shape, lengths, "fwd",
                 flops=lambda s, n, q=seq: _causal_flops(s, n, q, 1.0), **common),
            Case("attention", f"fwd_bwd_{batch}x{seq}", f"fwd+bwd {title}", shape, lengths, "fwd_bwd",
                 flops=lambda s, n, q=seq: _causal_flops(s, n, q, 3.5), **common)]


def decode(batch: int, past: int, shape: dict) -> Case:
    return Case("attention", f"decode_{batch}x{past}", f"decode {batch} x 1 token over a {past}-token cache",
                shape, (past + 1,) * batch, "fwd", baselines=("sdpa",), runner="attention_decode", split="none",
                check_layouts=("decode",), extra={"batch": batch, "past": past},
                traffic=lambda s, n, b=batch, p=past: 4.0 * b * (p + 1) * s["kv_heads"] * s["head_dim"])


def cases(quick: bool) -> list[Case]:
    if quick:
        shape = {"heads": 4, "head_dim": 16, "kv_heads": 2}
        return [*prefill(2, 24, shape), decode(3, 20, shape)]
    shape = {"heads": HEADS, "head_dim": HEAD_DIM, "kv_heads": KV_HEADS}
    return [*prefill(8, 1024, shape), *prefill(2, 8192, shape), decode(64, 4096, shape)]


class DecodeSubject:
    """One decode step over a filled cache, per family; SDPA appending to and attending the same cache."""

    def __init__(self, case: Case, op: OpSpec | None, candidates: dict[str, Candidate], device: torch.device,
                 seed: int) -> None:
        if op is None:
            raise ValueError(f"{case.id}: decode needs the attention op")
        self.case, self.op, self.candidates, self.device = case, op, candidates, device
        self.batch, self.past = int(case.extra["batch"]), int(case.extra["past"])
        self.total = self.past + 1
        self.data = draw(op, case.shape, self.batch * self.total, device, seed)
        i = self.data.inputs
        per_seq = torch.arange(self.batch, device=device) * self.total
        self.prefix = (per_seq[:, None] + torch.arange(self.past, device=device)[None, :]).reshape(-1)
        self.last = per_seq + self.past
        self.q1, self.k1, self.v1 = i["q"][self.last], i["k"][self.last], i["v"][self.last]
        self._caches: dict[str, tuple] = {}

    def _kernel(self, family: str):
        return kernel_module(self.candidates[family].family, "attention")

    def _new_cache(self, family: str):
        s = self.case.shape
        return self._kernel(family).AttentionCache([self.total] * self.batch, s["heads"], s["head_dim"], self.device,
                                                   kv_heads=s["kv_heads"])

    def _filled(self, family: str):
        """The family's cache with every sequence's past written (once), and the mark to rewind to."""
        if family not in self._caches:
            mod, cache = self._kernel(family), self._new_cache(family)
            i = self.data.inputs
            with torch.no_grad():
                mod.attention(i["q"][self.prefix], i["k"][self.prefix], i["v"][self.prefix],
                              RowIdentity.packed([self.past] * self.batch), cache)
            self._caches[family] = (cache, cache.mark())
        return self._caches[family]

    def _step(self, family: str):
        mod = self._kernel(family)
        cache, mark = self._filled(family)

        def step() -> torch.Tensor:
            cache.rewind(mark)
            rows = RowIdentity.packed([1] * self.batch, list(range(self.batch)), [self.past] * self.batch)
            with torch.no_grad():
                return mod.attention(self.q1, self.k1, self.v1, rows, cache)
        return step

    def family(self, name: str, mode: str) -> Reference:
        return Reference([self._step(name)])

    def reference(self, name: str, mode: str) -> Reference | None:
        if name != "sdpa":
            return None
        s, i = self.case.shape, self.data.inputs
        b, t = self.batch, self.total
        kc = i["k"].view(b, t, s["kv_heads"], s["head_dim"]).transpose(1, 2).contiguous()
        vc = i["v"].view(b, t, s["kv_heads"], s["head_dim"]).transpose(1, 2).contiguous()
        q4 = self.q1.view(b, s["heads"], 1, s["head_dim"])
        k_new = self.k1.view(b, s["kv_heads"], s["head_dim"])
        v_new = self.v1.view(b, s["kv_heads"], s["head_dim"])

        def step() -> torch.Tensor:  # what a server does: append the new token's K/V, then attend
            with torch.no_grad():
                kc[:, :, self.past] = k_new
                vc[:, :, self.past] = v_new
                return F.scaled_dot_product_attention(q4, kc, vc, enable_gqa=True)
        return Reference([step])

    def bitwise(self, family: str) -> CheckRecord | None:
        mod, i = self._kernel(family), self.data.inputs
        with torch.no_grad():
            full = mod.attention(i["q"], i["k"], i["v"], RowIdentity.packed([self.total] * self.batch),
                                 self._new_cache(family))
        step = self._step(family)()
        return bitwise_record("decode", {"o": full[self.last]}, {"o": step}).model_copy(
            update={"name": "timed data: decode step == the training forward (full prefill) at those tokens"})

    def host_step(self, family: str):
        raise ValueError(f"{self.case.id}: decode is timed on the device")
