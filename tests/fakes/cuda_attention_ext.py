"""A CPU stand-in for the attention and RL launchers of gradsweep._C (an extension of tests/fakes/cuda_ext.py).

Why: the CUDA kernels run only on the lent GPU, but the Python glue of gradsweep.cuda_kernels.attention (plans,
program tables, logical stores, the fold's work list, lse / delta indexing, pads and fillers, the fold's trigger)
and of the RL modules can run through the public kernel check on the CPU. The stand-in decodes the program and
work tables exactly as the kernels do and asserts what the kernels assume of them (rows per program, one K/V head
per program, every key of a sample in exactly one work row). Its arithmetic is float64 per row over exactly that
row's keys, so it is invariant whenever the glue is, and accurate (dK / dV FP32-class). It checks nothing about
the real kernels' bits or speed.
"""

from __future__ import annotations

import torch

from tests.fakes import cuda_ext
from tests.fakes.cuda_ext import _t

GEOMETRY = {"ATTN_BLOCK_N": 64, "ATTN_FOLD_TILE": 32, "ATTN_FOLD_KEYS": 64, "ATTN_FWD_ROWS": 128,
            "ATTN_DQ_ROWS": 64, "ATTN_NARROW_ROWS": 16, "ATTN_MAX_HEAD_DIM": 128, "RL_SEQ_THREADS": 256}


def _opt(p: int) -> torch.Tensor | None:
    return _t(p) if p else None


def _programs(table: int, n: int, max_rows: int, pack: int, HQ: int, G: int) -> list[tuple[int, int, int, int]]:
    if n == 0:
        return []
    t = _t(table)
    assert t.dtype == torch.int32 and tuple(t.shape) == (n, 4), (t.dtype, t.shape, n)
    assert HQ % pack == 0
    for hb in range(HQ // pack):  # every row of a program reads one K/V head
        assert (hb * pack) // G == (hb * pack + pack - 1) // G, (hb, pack, G)
    rows = [tuple(int(x) for x in r) for r in t.tolist()]
    for _, _, pos0, cnt in rows:
        assert cnt >= 1 and cnt * pack <= max_rows and pos0 >= 0, (cnt, pack, max_rows)
    return rows  # type: ignore[return-value]


def _token_rows(prog, pack, hb, t, G):
    row0, tok0, pos0, _ = prog
    hq = list(range(hb * pack, hb * pack + pack))
    return row0 + t, tok0 + t, pos0 + t, tok0 - pos0, hq, (hb * pack) // G


def attn_fwd(q, k, v, o, lse, wide, n_wide, narrow, n_narrow, pack, HQ, HKV, D, T, qk_scale, device, stream,
             path=0):
    G = HQ // HKV
    qs, ks, vs = _t(q).view(-1, HQ, D), _t(k).view(-1, HKV, D), _t(v).view(-1, HKV, D)
    os_, ls = _t(o).view(-1, HQ, D), _t(lse).view(HQ, -1)
    progs = (_programs(wide, n_wide, GEOMETRY["ATTN_FWD_ROWS"], pack, HQ, G)
             + _programs(narrow, n_narrow, GEOMETRY["ATTN_NARROW_ROWS"], pack, HQ, G))
    for prog in progs:
        for hb in range(HQ // pack):
            for t in range(prog[3]):
                row, tok, pos, kv_tok, hq, hk = _token_rows(prog, pack, hb, t, G)
                qr = qs[row, hq].double()                                   # [pack, D]
                kr, vr = ks[kv_tok:kv_tok + pos + 1, hk].double(), vs[kv_tok:kv_tok + pos + 1, hk].double()
                s = (qr[:, None, :] * kr[None]).sum(-1) * qk_scale          # [pack, keys], log2 units
                m = s.amax(1)
                p = torch.exp2(s - m[:, None])
                lsum = p.sum(1)
                os_[row, hq] = ((p[:, :, None] * vr[None]).sum(1) / lsum[:, None]).to(torch.bfloat16)
                ls[hq, tok] = (m + torch.log2(lsum)).float()


def attn_dq(q, k, v, o, dout, dq, lse, delta, wide, n_wide, narrow, n_narrow, pack, HQ, HKV, D, T, qk_scale,
            sm_scale, exact, device, stream, path=0):
    G = HQ // HKV
    qs, ks, vs = _t(q).view(-1, HQ, D), _t(k).view(-1, HKV, D), _t(v).view(-1, HKV, D)
    os_, dos, dqs = _t(o).view(-1, HQ, D), _t(dout).view(-1, HQ, D), _t(dq).view(-1, HQ, D)
    ls, ds_ = _t(lse).view(HQ, -1), _t(delta).view(HQ, -1)
    progs = (_programs(wide, n_wide, GEOMETRY["ATTN_DQ_ROWS"], pack, HQ, G)
             + _programs(narrow, n_narrow, GEOMETRY["ATTN_NARROW_ROWS"], pack, HQ, G))
    for prog in progs:
        for hb in range(HQ // pack):
            for t in range(prog[3]):
                row, tok, pos, kv_tok, hq, hk = _token_rows(prog, pack, hb, t, G)
                qr, dor = qs[row, hq].double(), dos[row, hq].double()
                kr, vr = ks[kv_tok:kv_tok + pos + 1, hk].double(), vs[kv_tok:kv_tok + pos + 1, hk].double()
                delta_o = (os_[row, hq].double() * dor).sum(-1)
                s = (qr[:, None, :] * kr[None]).sum(-1) * qk_scale
                p = torch.exp2(s - ls[hq, tok].double()[:, None])
                dp = (dor[:, None, :] * vr[None]).sum(-1)
                dsc = p * (dp - delta_o[:, None])
                dqs[row, hq] = ((dsc[:, :, None] * kr[None]).sum(1) * sm_scale).to(torch.bfloat16)
                ds_[hq, tok] = ((p * dp).sum(1) if exact else delta_o).float()


def attn_dkdv(k, v, q, dout, lse, delta, dk, dv, work, n_work, HQ, HKV, D, T, qk_scale, sm_scale, load_acc,
              fp32_grads, device, stream, path=0):
    G = HQ // HKV
    keys = GEOMETRY["ATTN_FOLD_KEYS"]
    ks, vs = _t(k).view(-1, HKV, D), _t(v).view(-1, HKV, D)
    qs, dos = _t(q).view(-1, HQ, D), _t(dout).view(-1, HQ, D)
    ls, des = _t(lse).view(HQ, -1), _t(delta).view(HQ, -1)
    dks, dvs = _t(dk).view(-1, HKV, D), _t(dv).view(-1, HKV, D)
    w = _t(work)
    assert w.dtype == torch.int32 and tuple(w.shape) == (n_work, 3)
    covered = torch.zeros(T, dtype=torch.int64)
    for base, k0, L in w.tolist():
        assert k0 % keys == 0 and 0 <= k0 < L
        kn = min(keys, L - k0)
        covered[base + k0:base + k0 + kn] += 1
        kpos = torch.arange(k0, k0 + kn)
        vis = kpos[:, None] <= torch.arange(L)[None, :]                      # [keys, queries]
        for hk in range(HKV):
            kr, vr = ks[base + k0:base + k0 + kn, hk].double(), vs[base + k0:base + k0 + kn, hk].double()
            acc_k = dks[base + k0:base + k0 + kn, hk].double() if load_acc else torch.zeros(kn, D, dtype=torch.float64)
            acc_v = dvs[base + k0:base + k0 + kn, hk].double() if load_acc else torch.zeros(kn, D, dtype=torch.float64)
            for g in range(G):
                hq = hk * G + g
                qr, dor = qs[base:base + L, hq].double(), dos[base:base + L, hq].double()
                pt = torch.exp2((kr @ qr.t()) * qk_scale - ls[hq, base:base + L].double()[None, :])
                pt = torch.where(vis, pt, torch.zeros_like(pt))
                dpt = vr @ dor.t()
                dst = pt * (dpt - des[hq, base:base + L].double()[None, :]) * sm_scale
                acc_v = acc_v + pt @ dor
                acc_k = acc_k + dst @ qr
            dks[base + k0:base + k0 + kn, hk] = acc_k.float()
            dvs[base + k0:base + k0 + kn, hk] = acc_v.float()
    assert bool((covered == 1).all()), "a key is in no work row or in several"


def attn_scatter(src_a, dst_a, src_b, dst_b, rows, toks, n, row_elems, device, stream):
    r, t = _t(rows).view(-1)[:n].long(), _t(toks).view(-1)[:n].long()
    for src, dst in ((src_a, dst_a), (src_b, dst_b)):
        if src:
            _t(dst).view(-1, row_elems)[t] = _t(src).view(-1, row_elems)[r]


# --------------------------------------------------------------------------------------------------------- RL
def _f(p: int, n: int) -> torch.Tensor:
    return _t(p).view(-1)[:n].float()


def _put(p: int, n: int, x: torch.Tensor) -> None:
    out = _t(p).view(-1)
    out[:n] = x.to(out.dtype)


def rl_ratio_fwd(lp, old, out, n, dtype, device, stream):
    _put(out, n, torch.exp(_f(lp, n) - _f(old, n)))


def rl_ratio_bwd(lp, old, g, d, n, dtype, gdtype, device, stream):
    _put(d, n, _f(g, n) * torch.exp(_f(lp, n) - _f(old, n)))


def rl_kl_fwd(lp, ref, k1, k2, k3, n, dtype, device, stream):
    d = _f(ref, n) - _f(lp, n)
    _put(k1, n, -d)
    _put(k2, n, (0.5 * d) * d)
    _put(k3, n, (torch.exp(d) - 1.0) - d)


def rl_kl_bwd(lp, ref, g1, g2, g3, d, n, dtype, gdtype, device, stream):
    dd = _f(ref, n) - _f(lp, n)
    _put(d, n, (_f(g1, n) + _f(g2, n) * -dd) + _f(g3, n) * (1.0 - torch.exp(dd)))


def _advantages(sample: torch.Tensor, rewards: torch.Tensor, n_samples: int, group: int, eps: float) -> torch.Tensor:
    adv = torch.zeros(n_samples, dtype=torch.float32)
    for s in range(n_samples):
        g0 = (s // group) * group
        r = rewards[g0:min(n_samples, g0 + group)]
        if r.numel() < 2:
            continue
        total = torch.zeros((), dtype=torch.float32)
        for x in r:
            total = total + x
        mean = total / r.numel()
        sq = torch.zeros((), dtype=torch.float32)
        for x in r:
            sq = sq + (x - mean) * (x - mean)
        adv[s] = (rewards[s] - mean) / (torch.sqrt(sq / (r.numel() - 1)) + eps)
    real = (sample >= 0) & (sample < n_samples)
    return torch.where(real, adv[sample.clamp(0, max(n_samples - 1, 0))] if n_samples else adv.new_zeros(()),
                       torch.zeros(()))


def rl_policy(lp, old, ref, adv, sample, rewards, g, out, n, n_samples, group, clip_low, clip_high, beta, adv_eps,
              grouped, kl, dtype, gdtype, device, stream):
    logp = _f(lp, n)
    if grouped:
        s = _t(sample).view(-1)[:n]
        a = _advantages(s, _t(rewards).view(-1).float(), n_samples, group, adv_eps)
        real = (s >= 0) & (s < n_samples)
    else:
        a = _f(adv, n)
        real = torch.ones(n, dtype=torch.bool)
    r = torch.exp(logp - _f(old, n))
    clipped = torch.minimum(torch.maximum(r, torch.tensor(1.0 - clip_low)), torch.tensor(1.0 + clip_high))
    take = r * a <= clipped * a
    loss = -torch.where(take, r * a, clipped * a)
    dloss = torch.where(take, -(r * a), torch.zeros(()))
    if kl:
        d = _f(ref, n) - logp
        e = torch.exp(d)
        loss = loss + beta * ((e - 1.0) - d)
        dloss = dloss + beta * (1.0 - e)
    zero = torch.zeros(())
    if g == 0:
        _put(out, n, torch.where(real, loss, zero))
    else:
        _put(out, n, _f(g, n) * torch.where(real, dloss, zero))


def rl_seq_sum(a, b, mask, order, start, len, out, n_samples, dtype, device, stream):  # the launcher's names
    av, bv, mv = _t(a).view(-1).float(), _opt(b), _opt(mask)
    o, st, ln, res = _t(order).long(), _t(start).long(), _t(len).long(), _t(out)
    for s in range(n_samples):
        acc = torch.zeros((), dtype=torch.float32)
        for p in range(int(ln[s])):
            row = int(o[int(st[s]) + p])
            x = av[row]
            if bv is not None:
                x = x - bv.view(-1)[row].float()
            if mv is not None:
                x = x * mv.view(-1)[row]
            acc = acc + x
        res[s] = acc


def rl_dpo(seq, gseq, sample, mask, out, n, n_samples, beta, gdtype, device, stream):
    sq, s = _t(seq).float(), _t(sample).view(-1)[:n]
    real = (s >= 0) & (s < n_samples)
    c = torch.where(real, 2 * (s // 2), torch.zeros_like(s))
    has_rej = real & (c + 1 < n_samples)
    chosen = torch.where(real, sq[c], torch.zeros(()))
    rejected = torch.where(has_rej, sq[(c + 1).clamp(max=n_samples - 1)], torch.zeros(()))
    if gseq == 0:
        x = -beta * (chosen - rejected)
        loss = torch.clamp(x, min=0.0) + torch.log1p(torch.exp(-x.abs()))
        _put(out, n, torch.where(real, loss, torch.zeros(())))
        return
    gs = _t(gseq).float()
    gc = torch.where(real, gs[c], torch.zeros(()))
    gr = torch.where(has_rej, gs[(c + 1).clamp(max=n_samples - 1)], torch.zeros(()))
    z = beta * (chosen - rejected)
    dz = -1.0 / (1.0 + torch.exp(z))
    sign = torch.where(s % 2 == 0, torch.tensor(beta), torch.tensor(-beta))
    m = torch.where(real, _f(mask, n), torch.zeros(()))
    _put(out, n, torch.where(real, ((m * sign) * dz) * (gc + gr), torch.zeros(())))


LAUNCHERS = ("attn_fwd", "attn_dq", "attn_dkdv", "attn_scatter", "rl_ratio_fwd", "rl_ratio_bwd", "rl_kl_fwd",
             "rl_kl_bwd", "rl_policy", "rl_seq_sum", "rl_dpo")


def install(monkeypatch):
    """cuda_ext.install plus the attention and RL launchers and the compiled sizes (undone by the monkeypatch)."""
    fake = cuda_ext.install(monkeypatch)
    for name in LAUNCHERS:
        monkeypatch.setattr(fake, name, globals()[name], raising=False)
    for name, value in GEOMETRY.items():
        monkeypatch.setattr(fake, name, value, raising=False)
    return fake
