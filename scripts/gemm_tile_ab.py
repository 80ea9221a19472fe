"""Device time of the Triton persistent TMA GEMM under other tiles, warps, stages and Hopper warp specialisation,
next to cuBLAS and the kernel gradsweep runs today, with every variant's bits compared (a diagnostic for the
next kernel change, never evidence).

Why: the twenty-ninth session's kernel census showed Triton's ``_mm_tma_kernel`` at M = 256, N = K = 4096 25%
slower than cuBLAS's one 128 x 64 kernel with the same tile count and one wave; what differs is the pipeline
inside a program. This times the candidates in one run: cuBLAS's tile shape at two consumer warp groups, deeper
pipelines, and Triton 3.6's Hopper warp specialisation of the K loop (a TMA producer beside the MMA warps).

A second part does the same for the canonical dW fold (``_dw_tma_kernel``, the bench's T = 4096 and 16384 packed
steps of 13 samples, N = K = 4096): the census put its floor at 1.09x cuBLAS with the FP32 main grad's load and
store hidden, 1.25x with them serialised, and the fold at 1.26x. Today's tiles hold one program per SM; the
candidates add 128 x 128 tiles with stages few enough for two programs per SM (one program's main-grad epilogue
then overlaps the other's loop), forced through the production launch path (the tuner's choice set, its launch
memo cleared).

Each variant's product must equal today's kernel's to the bit (the same ascending k16 chain over K): a variant
whose bits differ is reported and would be a defect, never a candidate. Device time is graph-replayed (host
excluded); the bench's end-to-end rows carry host cost. Output: one line per (case, variant), and a JSON file.

    python3 scripts/gemm_tile_ab.py OUT/gemm_tile_ab.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gradsweep.bench.cases import irregular
from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.triton_kernels import gemm
from gradsweep.triton_kernels._common import mma, tile_ids
from gradsweep.triton_kernels.gemm import _ensure_allocator, _mm_tma_kernel, _tma_tiles, matmul_invariant
from scripts.gemm_tile_probe import graph_time_us, heat


@triton.jit
def _ws_tma_kernel(a_desc, w_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, B_T: tl.constexpr):
    """gradsweep's ``_mm_tma_kernel`` with its K loop warp-specialised (the only variant that needs a kernel of its
    own: every other variant runs the production kernel itself, so its time is the one a change would ship)."""
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for t in tl.range(tl.program_id(0), n_m * n_n, PROGRAMS):
        pid_m, pid_n = tile_ids(t, n_m, n_n, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in tl.range(k_tiles, warp_specialize=True):
            a = a_desc.load([pid_m * BM, ki * BK])
            if B_T:
                w = w_desc.load([pid_n * BN, ki * BK])
                acc = mma(a, w.T, acc)
            else:
                b = w_desc.load([ki * BK, pid_n * BN])
                acc = mma(a, b, acc)
        c_desc.store([pid_m * BM, pid_n * BN], acc.to(c_desc.dtype))


# (name, BM, BN, BK, warps, stages, warp-specialised)
VARIANTS = [
    ("64x128x64 w4 s5", 64, 128, 64, 4, 5, False),
    ("64x128x64 w4 s7", 64, 128, 64, 4, 7, False),
    ("64x128x128 w4 s3", 64, 128, 128, 4, 3, False),
    ("128x64x64 w4 s5", 128, 64, 64, 4, 5, False),
    ("128x64x64 w8 s5", 128, 64, 64, 8, 5, False),
    ("128x64x64 w8 s6", 128, 64, 64, 8, 6, False),
    ("128x64x64 w8 s8", 128, 64, 64, 8, 8, False),
    ("64x128x64 w4 s5 ws", 64, 128, 64, 4, 5, True),
    ("128x64x64 w8 s5 ws", 128, 64, 64, 8, 5, True),
    ("128x128x64 w8 s4", 128, 128, 64, 8, 4, False),
    ("128x128x64 w8 s4 ws", 128, 128, 64, 8, 4, True),
    ("128x256x64 w8 s3", 128, 256, 64, 8, 3, False),
    ("128x256x64 w8 s3 ws", 128, 256, 64, 8, 3, True),
]
# (M, N, K, variants to try: None = all)
CASES = [(256, 4096, 4096, None), (512, 4096, 4096, None),
         (4096, 4096, 4096, {"128x256x64 w8 s3", "128x256x64 w8 s3 ws", "128x128x64 w8 s4 ws"}),
         (16384, 4096, 4096, {"128x256x64 w8 s3", "128x256x64 w8 s3 ws", "128x128x64 w8 s4 ws"})]


# dW fold variants (BN, BK, warps, stages): today's candidate list (``gemm._DW_SHAPES``) first, then tiles whose
# shared memory leaves room for two programs per SM
DW_VARIANTS = [*gemm._DW_SHAPES, (128, 128, 4, 3), (128, 128, 8, 3), (128, 128, 4, 2), (128, 128, 8, 2),
               (128, 256, 8, 2), (256, 128, 8, 2)]
DW_STEPS = (4096, 16384)  # tokens, in 13 samples as the bench's dW cases


def launch(variant: tuple, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, sms: int):
    """A closure running ``out = a @ b`` (b a transposed weight or a contiguous [K, N]) with one variant."""
    _, bm, bn, bk, warps, stages, ws = variant
    m, k = a.shape
    n = b.shape[1]
    b_t = b.stride(0) == 1
    a_desc = TensorDescriptor(a, [m, k], [k, 1], [bm, bk])
    b_desc = (TensorDescriptor(b.t(), [n, k], [k, 1], [bn, bk]) if b_t
              else TensorDescriptor(b, [k, n], [n, 1], [bk, bn]))
    c_desc = TensorDescriptor(out, [m, n], [n, 1], [bm, bn])
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

    def run() -> None:
        if ws:
            _ws_tma_kernel[grid](a_desc, b_desc, c_desc, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=8, PROGRAMS=sms,
                                 B_T=b_t, num_warps=warps, num_stages=stages)
        else:
            _mm_tma_kernel[grid](a_desc, b_desc, c_desc, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=8, PROGRAMS=sms,
                                 B_T=b_t, num_warps=warps, num_stages=stages)
    return run


def _only(cfg: tuple):
    """A tuner's candidate list of the one dW configuration ``cfg`` (BN, BK, warps, stages)."""
    bn, bk, warps, stages = cfg
    config = triton.Config({"BN": bn, "BK": bk, "GROUP_M": 8}, num_warps=warps, num_stages=stages)
    return lambda key: [config]


def _force_dw(cfg: tuple | None) -> None:
    """The dW fold launches with ``cfg`` from now on (None: the tuner chooses again), its launch memos dropped."""
    for tuner in (gemm._DW, gemm._DW_TMA):
        tuner.best.clear()
        tuner.launch._memo.clear()
        tuner.configs = gemm.dw_configs if cfg is None else _only(cfg)
    gemm._DW_CALLS.clear()


def _failed(rows: list, case: str, name: str, exc: Exception) -> None:
    """A variant that did not compile or fit (shared memory, registers): a finding, recorded, not a stop."""
    msg = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    print(f"{case:26} {name:22} failed: {msg}", flush=True)
    rows.append({"case": case, "variant": name, "error": msg})


def _timed(rows: list, case: str, name: str, us: float, stock_us: float, same: bool) -> None:
    """A variant's device time beside cuBLAS's, and whether its bits equal today's."""
    print(f"{case:26} {name:22} {us:8.1f} {stock_us:8.1f} {us / stock_us:6.2f}x  {'equal' if same else 'DIFFER'}",
          flush=True)
    rows.append({"case": case, "variant": name, "us": us, "cublas_us": stock_us, "bits_equal": same})


def dw_part(rows: list, gen: torch.Generator, steps: tuple[int, ...] = DW_STEPS, width: int = 4096,
            timer=graph_time_us, warm=heat) -> int:
    """Time and bit-check each dW variant; returns the number whose bits differ from today's. (``steps``, ``width``,
    ``timer`` and ``warm`` let the CPU test walk the same path under the interpreter, where every variant runs the
    interpreter's one configuration.)"""
    bad = 0
    n = k = width
    device = gen.device
    for t in steps:
        lengths = list(irregular(t, 13))
        x = torch.randn(t, k, device=device, generator=gen).bfloat16()
        dy = torch.randn(t, n, device=device, generator=gen).bfloat16()
        start = torch.randn(n, k, device=device, generator=gen)
        fold = CanonicalFold(torch.zeros_like(start), lengths, gemm.TILE)
        step = fold.take_tiles(RowIdentity.packed(lengths), (x, dy))
        case = f"dW T={t} N=K={n}"

        def stock(dy=dy, x=x) -> torch.Tensor:
            return dy.t() @ x
        warm(stock)
        t_stock = timer(stock)
        work = start.clone()

        def fold_once(step=step, x=x, dy=dy, work=work) -> None:
            gemm.dw_fold(step, x, dy, work)
        _force_dw(None)  # today's: the tuner's choice among its list
        fold_once()
        chosen = next(iter(gemm._DW_TMA.best.values()), None)
        work.copy_(start)
        fold_once()
        today_bits = work.view(torch.int32).clone()
        folded = not torch.equal(today_bits, start.view(torch.int32))  # else every variant is trivially "equal"
        bad += not folded
        t_today = timer(fold_once)
        label = f"today (tuned: {chosen})"
        print(f"{case:26} {label[:60]:60} {t_today:8.1f} {t_stock:8.1f} {t_today / t_stock:6.2f}x"
              f"{'' if folded else '  THE FOLD LEFT THE MAIN GRAD UNCHANGED'}", flush=True)
        rows.append({"case": case, "variant": label, "us": t_today, "cublas_us": t_stock, "folded": folded})
        for cfg in DW_VARIANTS:
            name = "BN={} BK={} w{} s{}".format(*cfg)
            try:
                _force_dw(cfg)
                work.copy_(start)
                fold_once()
                same = torch.equal(work.view(torch.int32), today_bits)
                t_cfg = timer(fold_once)
            except Exception as exc:
                _failed(rows, case, name, exc)
                continue
            bad += not same
            _timed(rows, case, name, t_cfg, t_stock, same)
        _force_dw(None)
    return bad


def main(path: str) -> int:
    _ensure_allocator()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows, bad = [], 0
    print(f"{torch.cuda.get_device_name(0)}, triton {triton.__version__}, {sms} SMs")
    print(f"{'case':26} {'variant':22} {'us':>8} {'cuBLAS':>8} {'ratio':>6}  bits")
    for index, (m, n, k, names) in enumerate(CASES):
        if index:
            save(path, rows)  # the cases so far
        if index == 1:  # the dW fold right after M = 256: the two rows the census asked about come first
            bad += dw_part(rows, gen)
            save(path, rows)
        x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        w = torch.randn(n, k, device="cuda", generator=gen).bfloat16()
        dy = torch.randn(m, n, device="cuda", generator=gen).bfloat16()
        for kind, a, b, stock in (("fwd", x, w.t(), lambda x=x, w=w: x @ w.t()),
                                  ("dX", dy, w, lambda dy=dy, w=w: dy @ w)):
            case = f"{kind} M={m} N={b.shape[1]} K={a.shape[1]}"
            weight = w if kind == "fwd" else w.t()  # matmul_invariant(a, weight) = a @ weight.T
            today_bits = matmul_invariant(a, weight).view(torch.int16).clone()
            heat(stock)
            t_stock = graph_time_us(stock)
            t_today = graph_time_us(lambda a=a, weight=weight: matmul_invariant(a, weight))
            cfg, warps, stages = _tma_tiles(m)
            label = f"today {cfg['BM']}x{cfg['BN']}x{cfg['BK']} w{warps} s{stages}"
            print(f"{case:26} {label:22} {t_today:8.1f} {t_stock:8.1f} {t_today / t_stock:6.2f}x", flush=True)
            rows.append({"case": case, "variant": label, "us": t_today, "cublas_us": t_stock})
            for variant in VARIANTS:
                if names is not None and variant[0] not in names:
                    continue
                out = torch.empty(m, b.shape[1], device="cuda", dtype=torch.bfloat16)
                try:
                    run = launch(variant, a, b, out, sms)
                    run()
                    torch.cuda.synchronize()
                    t = graph_time_us(run)
                except Exception as exc:
                    _failed(rows, case, variant[0], exc)
                    continue
                same = torch.equal(out.view(torch.int16), today_bits)
                bad += not same
                _timed(rows, case, variant[0], t, t_stock, same)
    save(path, rows)
    return 1 if bad else 0


def save(path: str, rows: list[dict]) -> None:
    """The rows so far (after every case: a run cut by the closeout's deadline keeps what it measured)."""
    Path(path).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "triton": triton.__version__,
                                      "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
