"""A CPU stand-in for gradsweep._C: the same launcher names and arguments, kernels written in torch.

Why: the CUDA kernels can only run on the lent GPU, but the Python glue of gradsweep.cuda_kernels (fold
plans, carried rows, chunk loops, argument order, strides) can be exercised in CI, through the same
``check_kernel`` a sweep cell uses (tests/test_cuda_ops.py). ``install(monkeypatch)`` makes the CUDA modules
accept CPU tensors and resolves the raw pointers they pass back to the tensors they came from.

The stand-in keeps the kernels' arithmetic structure where bits depend on it: GEMM rows in float64 (exact for
these sizes, so independent of M), the dW fold and the norm fold as fp32 accumulators updated tile after tile
in plan order (the state a call boundary stores), the embedding fold in token order. It checks nothing about
the real kernels' speed or their own bits.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

_REG: dict[int, torch.Tensor] = {}


def _ptr(t: torch.Tensor | None) -> int:
    if t is None:
        return 0
    key = id(t)
    _REG[key] = t
    return key


def _t(p: int) -> torch.Tensor:
    return _REG[p]


def _rows(p: int, n: int, cols: int, ld: int) -> torch.Tensor:
    """[n, cols] view of the tensor behind p with row stride ld (the launcher's view of memory)."""
    t = _t(p)
    return torch.as_strided(t, (n, cols), (ld, 1), t.storage_offset())


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16)


def rms_norm_fwd(x, w, y, rstd, rows, hidden, eps, device, stream):
    xv = _rows(x, rows, hidden, hidden).float()
    r = torch.rsqrt((xv * xv).mean(1) + eps)
    _rows(y, rows, hidden, hidden).copy_(_bf16(xv * r[:, None] * _t(w).float()))
    if rstd:
        _t(rstd).view(-1)[:rows] = r


def rms_norm_bwd_dx(dy, x, w, rstd, dx, rows, hidden, device, stream):
    xv, g = _rows(x, rows, hidden, hidden).float(), _rows(dy, rows, hidden, hidden).float()
    r = _t(rstd).reshape(-1)[:rows][:, None]
    gw = g * _t(w).float()
    c = (gw * xv).sum(1, keepdim=True) / hidden * r * r
    _rows(dx, rows, hidden, hidden).copy_(_bf16(r * (gw - xv * c)))


def _tile_rows(plan: int, n_tiles: int, tile: int):
    p = _t(plan).reshape(-1)[: n_tiles * tile].view(n_tiles, tile)
    return [[int(i) for i in p[t] if int(i) >= 0] for t in range(n_tiles)]


def _row_space(call: int, stage: int, n_stage: int, what: str):
    """Row r of a fold's row space (csrc/common.cuh, FoldRows): the carried tensor's row r below n_stage, else the
    call's row r - n_stage. A launcher that passes n_stage > 0 without the carried base is refused, as _C does."""
    c = _t(call)
    if n_stage and not stage:
        raise ValueError(f"{what}: n_stage > 0 needs every stage_* base (the carried rows' tensors)")
    s = _t(stage) if n_stage else c

    def row(r: int) -> torch.Tensor:
        return s[r] if r < n_stage else c[r - n_stage]
    return row


def rms_norm_dw_tiles(plan, n_tiles, tile, dy, x, rstd, partial, hidden, device, stream, stage_dy=0, stage_x=0,
                      stage_rstd=0, n_stage=0):
    xs, gs = _row_space(x, stage_x, n_stage, "rms_norm_dw_tiles"), _row_space(dy, stage_dy, n_stage, "")
    rs = _row_space(rstd, stage_rstd, n_stage, "")
    out = _t(partial).view(-1)[: n_tiles * hidden].view(n_tiles, hidden)
    for t, idx in enumerate(_tile_rows(plan, n_tiles, tile)):
        acc = torch.zeros(hidden, dtype=torch.float32)
        for i in idx:  # rows in slot order, as the kernel (fma of g and x * rstd)
            acc = acc + gs(i).float() * (xs(i).float() * rs(i))
        out[t] = acc


def fold_tiles(partial, n_tiles, main_grad, cols, device, stream):
    part = _t(partial).reshape(-1)[: n_tiles * cols].view(n_tiles, cols)
    acc = _t(main_grad).view(-1)
    for t in range(n_tiles):
        acc[:cols] = acc[:cols] + part[t]


def qk_norm_dw_tiles(plan, n_tiles, tile, dy, x, rstd, partial, heads, head_dim, device, stream, stage_dy=0,
                     stage_x=0, stage_rstd=0, n_stage=0):
    xs, gs = _row_space(x, stage_x, n_stage, "qk_norm_dw_tiles"), _row_space(dy, stage_dy, n_stage, "")
    rs = _row_space(rstd, stage_rstd, n_stage, "")
    out = _t(partial)
    for t, idx in enumerate(_tile_rows(plan, n_tiles, tile)):
        acc = torch.zeros(head_dim, dtype=torch.float32)
        for i in idx:
            xi, gi, ri = xs(i), gs(i), rs(i)
            for h in range(heads):
                acc = acc + gi[h].float() * (xi[h].float() * ri[h])
        out[t] = acc


def embedding_fwd(ids, weight, y, rows, vocab, hidden, device, stream):
    i = _t(ids).reshape(-1)[:rows]
    ok = (i >= 0) & (i < vocab)
    out = torch.zeros(rows, hidden, dtype=torch.bfloat16)
    out[ok] = _t(weight)[i[ok]]
    _rows(y, rows, hidden, hidden).copy_(out)


def embedding_fold(sorted_ids, src, n, dy, main_grad, vocab, hidden, device, stream):
    ids, s, g, mg = _t(sorted_ids), _t(src), _t(dy), _t(main_grad)
    for j in range(n):  # in sorted order: each id's tokens stay in canonical order
        v = int(ids[j])
        if 0 <= v < vocab:
            mg[v] = mg[v] + g[int(s[j])].float()


def pack_rows(src, dst, meta, n_samples, max_len, hidden, unpack, device, stream):
    m = _t(meta).tolist()
    lens, firsts, starts = m[:n_samples], m[n_samples:2 * n_samples], m[2 * n_samples:]
    s2 = _t(src).reshape(-1, hidden)
    d2 = _t(dst).reshape(-1, hidden)
    for b in range(n_samples):
        for p in range(max_len):
            q = p - starts[b]
            real = 0 <= q < lens[b]
            if unpack:
                d2[b * max_len + p] = s2[firsts[b] + q] if real else 0
            elif real:
                d2[firsts[b] + q] = s2[b * max_len + p]


def logp_fwd(logits, targets, out, lse, rows, vocab, ld, device, stream):
    z = _rows(logits, rows, vocab, ld).double()
    t = _t(targets)[:rows]
    ls = torch.logsumexp(z, 1)
    hit = (t >= 0) & (t < vocab)
    xt = z.gather(1, t.clamp(0, vocab - 1)[:, None])[:, 0]
    _t(out)[:rows] = torch.where(hit, xt - ls, torch.zeros_like(ls)).float()
    _t(lse)[:rows] = ls.float()


def _dlogits(z: torch.Tensor, t: torch.Tensor, lse: torch.Tensor, g: torch.Tensor, v0: int, vocab: int):
    hit = (t >= 0) & (t < vocab)
    gr = torch.where(hit, g, torch.zeros_like(g))
    onehot = (torch.arange(v0, v0 + z.shape[1])[None, :] == t[:, None]).float()
    return _bf16(gr[:, None] * (onehot - torch.exp(z.float() - lse[:, None])))


def logp_bwd(logits, targets, lse, g, d, rows, vocab, ld, ldd, device, stream):
    z = _rows(logits, rows, vocab, ld).float()
    _rows(d, rows, vocab, ldd).copy_(_dlogits(z, _t(targets)[:rows], _t(lse)[:rows], _t(g)[:rows], 0, vocab))


def _mm64(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """a @ b_t.T in float64, each element an elementwise product summed over K by torch.sum on fixed-size
    blocks (the same order for a row whatever M, its position or its alignment; no BLAS)."""
    a64, b64 = a.double(), b_t.double()
    out = torch.empty(a.shape[0], b_t.shape[0], dtype=torch.float64)
    rb = max(1, (1 << 21) // max(1, b_t.shape[0] * a.shape[1]))
    for r0 in range(0, a.shape[0], rb):
        out[r0:r0 + rb] = (a64[r0:r0 + rb, None, :] * b64[None, :, :]).sum(-1)
    return out


def gemm_nt(a, b, c, M, N, K, lda, ldb, ldc, device, stream):
    _rows(c, M, N, ldc).copy_(_bf16(_mm64(_rows(a, M, K, lda), _rows(b, N, K, ldb))))


def gemm_nn(a, b, c, M, N, K, lda, ldb, ldc, out, device, stream):
    """out 0: bf16 C = AB; 1: fp32 chain from C; 2: fp32 C + round_fp32(AB) (one rounding of the product)."""
    prod = _mm64(_rows(a, M, K, lda), _rows(b, K, N, ldb).t())
    c_rows = _rows(c, M, N, ldc)
    if out == 1:
        c_rows.copy_((c_rows.double() + prod).float())
    elif out == 2:
        c_rows.copy_(c_rows + prod.float())
    else:
        c_rows.copy_(_bf16(prod))


def gemm_dw_fold(plan, n_tiles, tile, dy, x, grad, rows, N, K, ldy, ldx, ldg, device, stream, path=0, stage_dy=0,
                 stage_x=0, n_stage=0, stage_ldy=0, stage_ldx=0):
    g = _rows(grad, N, K, ldg)
    ys, xs = _rows(dy, rows, N, ldy), _rows(x, rows, K, ldx)
    if n_stage:  # the carried rows first (the row space of csrc/common.cuh's FoldRows)
        if not (stage_dy and stage_x):
            raise ValueError("gemm_dw_fold: n_stage > 0 needs every stage_* base (the carried rows' tensors)")
        ys = torch.cat([_rows(stage_dy, n_stage, N, stage_ldy), ys])
        xs = torch.cat([_rows(stage_x, n_stage, K, stage_ldx), xs])
    for idx in _tile_rows(plan, n_tiles, tile):  # the fp32 accumulator after each tile is what a call stores
        if idx:
            ii = torch.tensor(idx)
            g.copy_((g.double() + ys[ii].double().t() @ xs[ii].double()).float())


LLP_VCHUNK = 2048


def hopper_gemm(device):
    """The stand-in plays a Hopper device: linear_logp's glue then sizes and passes its logits scratch."""
    return True


def _scratch(logits, rows, cols, ldl, what):
    """The logits scratch the launcher was given, checked as the Hopper kernels would use it (rows x ldl fp32)."""
    if logits == 0:
        return None
    s = _t(logits)
    if s.dtype != torch.float32 or ldl < cols or s.numel() < rows * ldl:
        raise RuntimeError(f"{what}: logits scratch too small or not fp32 ({s.numel()} < {rows} x {ldl})")
    return _rows(logits, rows, cols, ldl)


def llp_forward(hidden, weight, targets, part, out, lse, rows, vocab, K, ldh, ldw, logits, ldl, device, stream,
                path=0):
    if logits and ldl % LLP_VCHUNK:
        raise RuntimeError("llp_forward: ldl must be a multiple of LLP_VCHUNK")
    z = _mm64(_rows(hidden, rows, K, ldh), _rows(weight, vocab, K, ldw)).float()
    if logits:  # the slab the Hopper path's last GEMM writes
        v0 = (vocab - 1) // ldl * ldl
        _scratch(logits, rows, vocab - v0, ldl, "llp_forward").copy_(z[:, v0:])
    t = _t(targets)[:rows]
    ls = torch.logsumexp(z.double(), 1)
    hit = (t >= 0) & (t < vocab)
    xt = z.double().gather(1, t.clamp(0, vocab - 1)[:, None])[:, 0]
    _t(out)[:rows] = torch.where(hit, xt - ls, torch.zeros_like(ls)).float()
    _t(lse)[:rows] = ls.float()


def llp_dlogits(hidden, weight, targets, lse, g, d, M, N, K, v0, vocab, ldh, ldw, ldd, logits, ldl, device, stream,
                path=0):
    z = _mm64(_rows(hidden, M, K, ldh), _rows(weight, N, K, ldw)).float()
    if logits:
        _scratch(logits, M, N, ldl, "llp_dlogits").copy_(z)
    _rows(d, M, N, ldd).copy_(_dlogits(z, _t(targets)[:M], _t(lse)[:M], _t(g)[:M], v0, vocab))


def build_info() -> dict:
    return {"cudart": "fake", "arch_list": "none"}


def copy_pieces(pieces, src, dst, n_pieces, longest, src_stride_bytes, row_bytes, device, stream):
    """The fold's staging copy by pieces (csrc/gather.cu): piece (source row, staging row, length) copies that many
    rows of src (src_stride_bytes apart) into the contiguous rows of dst."""
    size = _t(src).element_size()
    cols, ld = row_bytes // size, src_stride_bytes // size
    for s0, d0, n in _t(pieces).reshape(-1, 3)[:n_pieces].tolist():
        _rows(dst, d0 + n, cols, cols)[d0:].copy_(_rows(src, s0 + n, cols, ld)[s0:])


FAKE = SimpleNamespace(**{k: v for k, v in dict(globals()).items()
                          if callable(v) and not k.startswith("_") and k not in ("SimpleNamespace", "install")},
                       LLP_VCHUNK=LLP_VCHUNK)


def install(monkeypatch) -> SimpleNamespace:
    """Route gradsweep.cuda_kernels through the stand-in on CPU tensors (undone by the monkeypatch)."""
    from gradsweep.cuda_kernels import runtime as rt

    _REG.clear()

    def check_tensor(name: str, t: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> None:
        if not isinstance(t, torch.Tensor) or t.dtype != dtype:
            raise ValueError(f"{name}: expected {dtype}, got {getattr(t, 'dtype', type(t))}")

    monkeypatch.setattr(rt, "ext", lambda: FAKE)
    monkeypatch.setattr(rt, "load", lambda: FAKE)
    monkeypatch.setattr(rt, "cuda_status", lambda: (True, "ok: fake CPU stand-in"))
    monkeypatch.setattr(rt, "check_tensor", check_tensor)
    monkeypatch.setattr(rt, "launch", lambda t: (0, 0))
    monkeypatch.setattr(rt, "ptr", _ptr)
    return FAKE
