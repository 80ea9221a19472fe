"""Where the Triton dW fold's time goes at T = 4096 and 16384 (a diagnostic, never evidence), and whether a
persistent fold whose main-grad load / store overlaps the neighbouring output tiles' tensor-core work buys it.

Why: the fold's kernels-only time sits at 1.29-1.35x cuBLAS's bf16 ``dY^T X`` at T = 4096 (1.08-1.17x at 16384),
and notes/triton_gemm_vocab.md ("Twenty-ninth session") puts the floor at 1.09x with the FP32 main grad's read and
write hidden behind the MMA, ~1.25x with them serialised. This probe measures that split directly and tries the
overlap the floor needs, on the production kernel's tile (the tuner's choice, BN 128 BK 256 w8 s3 on Hopper):

- ``prod``: ``gemm.dw_fold`` as a training step calls it (tuned, memoised launches);
- ``nonpersist``: this script's copy of ``_dw_tma_kernel`` (one program per output tile), for a like-for-like
  launch path against the variants below;
- ``noload`` / ``nostore`` / ``neither``: the same kernel with the main grad's load replaced by zeros and / or its
  store skipped at run time (a runtime flag the compiler cannot see through): what the FP32 traffic costs. Not
  canonical (their bits are not compared);
- ``persist`` / ``persist_flat`` / ``persist_flat_ws``: one program per SM walking the output tiles in the
  production order (``tile_ids``, GROUP_M 8) with ``tl.range`` plain, flattened (Triton pipelines the next tile's
  TMA loads across the epilogue) and flattened with warp specialisation; each output tile is the same chain from the
  same loaded main grad, so their bits must equal ``prod``'s (exit 1 otherwise).
  The ``_s2`` variants run at 2 stages (the flattened loop did not fit in shared memory at 3 on an H200).

Cases: the bench's packed steps (13 samples, ``irregular``), N = K = 4096; CUDA events over 10 calls a sample,
sides interleaved round by round after 150 ms of heat, median of 15 rounds; beside them cuBLAS's bf16 ``dY^T X``
and cuBLAS with an FP32 C read and written (``addmm(G, dY^T, X, out_dtype=float32)``). A variant that fails to
compile is reported and skipped.

    python3 scripts/dw_overlap_probe.py OUT/dw_overlap.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fold_io_probe import K, N, cublas_sides, packed_operands, time_sides  # the same cases, timed the same way

from gradsweep.canonical import CanonicalFold, RowIdentity, clear_plan_caches
from gradsweep.triton_kernels import gemm
from gradsweep.triton_kernels._common import mma, tile_ids

CFG = {"BN": 128, "BK": 256, "GROUP_M": 8}
WARPS, STAGES = 8, 3


@triton.jit
def _probe_kernel(DESC, dy_desc, x_desc, G, n_tiles, N, K, s_g, staged, load_g, store_g,
                  BN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, GROUP_M: tl.constexpr,
                  PERSIST: tl.constexpr, FLAT: tl.constexpr, WS: tl.constexpr):
    """``gemm._dw_tma_kernel``'s body, one output tile per loop trip (PERSIST: one program per SM walks them)."""
    num_n = tl.cdiv(N, BN)
    num_k = tl.cdiv(K, BK)
    n_out = num_n * num_k
    first = tl.program_id(0)
    step = tl.num_programs(0) if PERSIST else n_out
    last = n_tiles - 1
    for out in tl.range(first, n_out, step, flatten=FLAT, warp_specialize=WS):
        pid_n, pid_k = tile_ids(out, num_n, num_k, GROUP_M)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = pid_k * BK + tl.arange(0, BK)
        g_ptr = G + rn.to(tl.int64)[:, None] * s_g + rk[None, :]
        g_mask = (rn < N)[:, None] & (rk < K)[None, :] & (load_g != 0)
        acc = tl.load(g_ptr, mask=g_mask, other=0.0)
        nxt_row0 = tl.load(DESC)
        nxt_count = tl.load(DESC + 1)
        for t in range(0, n_tiles):
            row0 = nxt_row0
            count = nxt_count
            nt = tl.minimum(t + 1, last)
            nxt_row0 = tl.load(DESC + 2 * nt)
            nxt_count = tl.load(DESC + 2 * nt + 1)
            src = tl.where(staged != 0, -row0 - 1, row0)
            skip = BT - count
            dy = dy_desc.load([src - skip, skip, pid_n * BN]).reshape(BT, BN)
            x = x_desc.load([src - skip, skip, pid_k * BK]).reshape(BT, BK)
            acc = mma(tl.trans(dy), x, acc)
        s_mask = (rn < N)[:, None] & (rk < K)[None, :] & (store_g != 0)
        tl.store(g_ptr, acc, mask=s_mask)


VARIANTS = {  # name -> (load_g, store_g, PERSIST, FLAT, WS, stages)
    "nonpersist": (1, 1, False, False, False, STAGES),
    "noload": (0, 1, False, False, False, STAGES),
    "nostore": (1, 0, False, False, False, STAGES),
    "neither": (0, 0, False, False, False, STAGES),
    "persist": (1, 1, True, False, False, STAGES),
    "persist_flat": (1, 1, True, True, False, STAGES),
    "persist_flat_ws": (1, 1, True, True, True, STAGES),
    # flattened, 3 stages asked 278552 bytes of shared memory (the H200 has 232448); one 48 KiB stage less should fit
    "nonpersist_s2": (1, 1, False, False, False, 2),
    "persist_flat_s2": (1, 1, True, True, False, 2),
    "persist_flat_ws_s2": (1, 1, True, True, True, 2),
}
CANONICAL = ("nonpersist", "persist", "persist_flat", "persist_flat_ws", "nonpersist_s2", "persist_flat_s2",
             "persist_flat_ws_s2")


def _launcher(name: str, step, x, dy, sms: int):
    """A callable folding ``step`` into its argument with variant ``name`` (TMA stretches only; GATHER
    stretches go through the production gather kernel, as ``dw_fold`` sends them)."""
    load_g, store_g, persist, flat, ws, stages = VARIANTS[name]
    n_out = triton.cdiv(N, CFG["BN"]) * triton.cdiv(K, CFG["BK"])
    grid = (min(sms, n_out) if persist else n_out,)
    parts = []
    for a, b, kind in gemm.stretches(step.host_desc, gemm.TILE):
        if kind == gemm.GATHER:
            parts.append(("gather", a, b, None))
            continue
        src_x, src_dy = (step.stage[0], step.stage[1]) if kind == gemm.TMA_STAGED else (x, dy)
        descs = (gemm._window(src_dy, CFG["BN"]), gemm._window(src_x, CFG["BK"]))
        parts.append(("tma", a, b, (descs, int(kind == gemm.TMA_STAGED))))

    def run(g: torch.Tensor) -> None:
        for kind, a, b, extra in parts:
            part = step.desc[a:b]
            if kind == "gather":
                gemm.dw_fold_tiles(part, x, dy, g, step.stage[0], step.stage[1])
                continue
            (dy_d, x_d), staged = extra
            _probe_kernel[grid](part, dy_d, x_d, g, gemm.loop_bound(b - a), gemm.loop_bound(N), gemm.loop_bound(K),
                                g.stride(0), staged, load_g, store_g, **CFG, BT=gemm.TILE, PERSIST=persist,
                                FLAT=flat, WS=ws, num_warps=WARPS, num_stages=stages)
    return run


def case(t: int, sms: int) -> dict:
    lengths, x, dy, g0 = packed_operands(t)
    clear_plan_caches()
    fold = CanonicalFold(torch.zeros(N, K, device="cuda"), lengths, gemm.TILE)
    step = fold.take_tiles(RowIdentity.packed(lengths), (x, dy))
    out: dict = {"T": t, "tiles": step.num_tiles, "stretches": gemm.stretches(step.host_desc, gemm.TILE),
                 "bits": {}, "us": {}, "failed": {}}
    ref = g0.clone()
    gemm.dw_fold(step, x, dy, ref)
    torch.cuda.synchronize()
    sides = {"prod": lambda g: gemm.dw_fold(step, x, dy, g)}
    for name in VARIANTS:
        try:
            run = _launcher(name, step, x, dy, sms)
            g = g0.clone()
            run(g)
            torch.cuda.synchronize()
        except Exception as exc:  # a diagnostic: record the failure, time the rest
            out["failed"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
            continue
        if name in CANONICAL:
            out["bits"][name] = bool(torch.equal(g.view(torch.int32), ref.view(torch.int32)))
        sides[name] = run
    work = g0.clone()
    calls = {k: (lambda fn=fn: fn(work)) for k, fn in sides.items()}
    baselines, missing = cublas_sides(work, dy, x)
    calls.update(baselines)
    if missing is not None:
        out["failed"]["cublas_f32c"] = missing
    out["us"], out["spread"] = time_sides(calls)
    return out


def main() -> int:
    props = torch.cuda.get_device_properties(0)
    print(torch.cuda.get_device_name(), "SMs", props.multi_processor_count, "triton", triton.__version__)
    results = [case(t, props.multi_processor_count) for t in (4096, 16384)]
    ok = True
    for r in results:
        cub = r["us"]["cublas"]
        print(f"T={r['T']} ({r['tiles']} tiles of 64, stretches {r['stretches']}), N=K={N}, "
              f"BN {CFG['BN']} BK {CFG['BK']} w{WARPS} s{STAGES}")
        print(f"  bits equal to prod: {r['bits']}")
        for name, why in r["failed"].items():
            print(f"  {name}: FAILED {why}")
        ok &= all(r["bits"].values())
        for k, us in r["us"].items():
            lo, hi = r["spread"][k]
            print(f"  {k:16s} {us:8.1f} us  ({us / cub:.3f}x cuBLAS bf16; rounds {lo:.1f}-{hi:.1f})")
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(results, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
