"""Compile the Triton family's swapped small-M GEMM for sm_90 on a box without a GPU, and write its TTGIR and PTX
(a diagnostic for notes/triton_gemm_vocab.md; not evidence).

Triton specialises an integer argument equal to 1 as a constant, so the swapped launch at M = 1 (the kernel's N)
runs a different binary from M = 2 .. 16: this shows what differs. On 2026-12-04 (triton 3.6, the (64, 16, 128)
x 4 warps x 4 stages configuration, N = K = 4096): the main loops are the same (40 cp.async.cg and 8
wgmma m64n16k16 per iteration); only the prologue's index arithmetic differs.

    python3 scripts/gemm_swap_asm.py OUT_DIR [M ...]      (default M: 1 16)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile, make_backend
from triton.runtime.jit import create_function_from_signature

from gradsweep.triton_kernels import gemm

TARGET = GPUTarget("cuda", 90, 32)
CONFIG = (64, 16, 128, 4, 4)  # BM over N, BN over M, BK, warps, stages (the swap's first M <= 16 candidate)


def compile_swapped(m: int, n_out: int = 4096, k: int = 4096):
    """The compiled kernel ``_launch_mm_swapped`` would launch for x [m, k] @ W[n_out, k]^T (specialised as
    Triton's own launch specialises it: dtypes, 16-byte alignment, ints == 1 and % 16)."""
    backend = make_backend(TARGET)
    fn = gemm._mm_kernel
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bm, bn, bk, warps, stages = CONFIG
    x = torch.empty(m, k, dtype=torch.bfloat16)
    b = torch.empty(n_out, k, dtype=torch.bfloat16).t()
    out = torch.empty(m, n_out, dtype=torch.bfloat16)
    sa, sb, so = x.stride(), b.stride(), out.stride()
    args = [b, x, out, n_out, m, k, sb[1], sb[0], sa[1], sa[0], so[1], so[0]]
    kw = dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, ACC_IN=False, EVEN_K=k % bk == 0, HINT_N=False, num_warps=warps,
              num_stages=stages)
    bound, spec, options = binder(*args, **kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, options)
    return compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)


def main(out: Path, ms: list[int]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for m in ms:
        kernel = compile_swapped(m)
        for ext in ("ttgir", "ptx"):
            (out / f"swapped_m{m}.{ext}").write_text(kernel.asm[ext])
        ptx = kernel.asm["ptx"]
        print(f"M = {m}: {ptx.count('cp.async.cg')} cp.async.cg, {ptx.count('wgmma.mma_async')} wgmma, "
              f"shared {kernel.metadata.shared} B")


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(a) for a in sys.argv[2:]] or [1, 16])
