"""Compile the Triton family's GEMM / vocabulary kernels for sm_90 offline (no GPU) and print one digest per
specialisation of the PTX with line information stripped.

Why: a refactor of jit code (a loop written once and called from several kernels, a constexpr parameter
replaced by a module constant) must leave the GPU code identical. Run this on the tree before and after the
change and compare the output line by line:

    python scripts/triton_ptx_digest.py [DUMP_DIR] > before.txt     # in a checkout of the old tree
    python scripts/triton_ptx_digest.py [DUMP_DIR] > after.txt      # in this tree
    diff before.txt after.txt && echo "PTX identical"

Each specialisation is what the launchers really ask for on the GPU: pointer arguments 16-byte aligned, integer
arguments equal to 1 specialised to the constant 1 (Triton does that at launch), the others divisible by 16,
and the constexprs and warps / stages of the shipped configurations. A constexpr named here that a kernel does
not take (e.g. a parameter removed by the change) is dropped, so the old and the new signature compile the
same specialisation. Needs no GPU; TRITON_INTERPRET must be unset.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("unset TRITON_INTERPRET: the GPU code is what is compiled")
sys.path.insert(0, str(Path.cwd()))  # the tree to compile is the current directory's

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)

# (module, kernel, runtime argument types, constants (runtime ints specialised to 1, constexprs), warps, stages)
DW_TILES = [(128, 256, 8, 3), (256, 128, 8, 4), (128, 128, 4, 4)]  # (BN, BK, warps, stages) of both dW folds
GEMM_TILES = [(16, 64, 128, 4, 4), (64, 128, 64, 4, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3)]
MM_TYPES = {"A": "*bf16", "B": "*bf16", "C": "*bf16", "M": "i32", "N": "i32", "K": "i32", "s_am": "i32",
            "s_ak": "i32", "s_bk": "i32", "s_bn": "i32", "s_cm": "i32", "s_cn": "i32"}
DW_TYPES = {"DESC": "*i32", "X": "*bf16", "DY": "*bf16", "XS": "*bf16", "DYS": "*bf16", "G": "*fp32",
            "n_tiles": "i32", "N": "i32", "K": "i32", "s_x": "i32", "s_dy": "i32", "s_g": "i32"}
FWD_TYPES = {"H": "*bf16", "W": "*bf16", "T": "*i64", "PM": "*fp32", "PS": "*fp32", "PT": "*fp32", "R": "i32",
             "V": "i32", "K": "i32", "n_chunks": "i32", "s_h": "i32", "s_w": "i32"}
COMBINE_TYPES = {"PM": "*fp32", "PS": "*fp32", "PT": "*fp32", "T": "*i64", "OUT": "*fp32", "LSE": "*fp32",
                 "R": "i32", "V": "i32", "n_chunks": "i32"}
DLOG_TYPES = {"H": "*bf16", "W": "*bf16", "T": "*i64", "LSE": "*fp32", "G": "*fp32", "D": "*bf16", "M": "i32",
              "N": "i32", "K": "i32", "v0": "i32", "V": "i32", "s_h": "i32", "s_w": "i32", "s_d": "i32"}
LOGP_FWD_TYPES = {"L": "*bf16", "T": "*i64", "OUT": "*fp32", "LSE": "*fp32", "R": "i32", "V": "i32", "s_l": "i32"}
LOGP_BWD_TYPES = {"L": "*bf16", "T": "*i64", "LSE": "*fp32", "G": "*fp32", "D": "*bf16", "R": "i32", "V": "i32",
                  "s_l": "i32", "s_d": "i32"}
FOLD_TYPES = {"part_ptr": "*fp32", "acc_ptr": "*fp32", "n_tiles": "i32", "n_cols": "i32"}
FWD_TMA_TYPES = {"T": "*i64", "PM": "*fp32", "PS": "*fp32", "PT": "*fp32", "R": "i32", "V": "i32", "k_tiles": "i32",
                 "n_chunks": "i32"}
DLOG_TMA_TYPES = {"T": "*i64", "LSE": "*fp32", "G": "*fp32", "D": "*bf16", "M": "i32", "N": "i32", "k_tiles": "i32",
                  "v0": "i32", "V": "i32", "s_d": "i32"}
DW_TMA_TYPES = {"DESC": "*i32", "G": "*fp32", "n_tiles": "i32", "N": "i32", "K": "i32", "s_g": "i32",
                "staged": "i32"}
TMA_TYPES = {"a_desc": "tensordesc<bf16[128,64]>", "w_desc": "tensordesc<bf16[256,64]>",
             "c_desc": "tensordesc<bf16[128,256]>", "M": "i32", "N": "i32", "K": "i32"}


def specs() -> list[tuple[str, str, dict, dict, int, int, str]]:
    out = []
    for bm, bn, bk, w, s in GEMM_TILES:
        tile = {"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8, "UPCAST": False}
        # forward (b = W^T: unit stride along K), dX (b = W: unit stride along N, hinted), fp32 accumulate
        for even in (True, False):
            out.append(("gemm", "_mm_kernel", MM_TYPES, {**tile, "s_ak": 1, "s_bk": 1, "s_cn": 1, "ACC_IN": False,
                                                        "EVEN_K": even, "HINT_N": False}, w, s, f"fwd even={even}"))
        for hint in (True, False):
            out.append(("gemm", "_mm_kernel", MM_TYPES, {**tile, "s_ak": 1, "s_bn": 1, "s_cn": 1, "ACC_IN": False,
                                                        "EVEN_K": True, "HINT_N": hint}, w, s, f"dX hint={hint}"))
        acc_types = {**MM_TYPES, "C": "*fp32"}
        out.append(("gemm", "_mm_kernel", acc_types, {**tile, "s_ak": 1, "s_bn": 1, "s_cn": 1, "ACC_IN": True,
                                                     "EVEN_K": True, "HINT_N": True}, w, s, "accumulate"))
        for even in (True, False):
            out.append(("linear_logp", "_dlogits_kernel", DLOG_TYPES, {**tile, "EVEN_K": even}, w, s,
                        f"dlogits even={even}"))
    for bn, bk, w, s in DW_TILES:
        out.append(("gemm", "_dw_kernel", DW_TYPES, {"BN": bn, "BK": bk, "BT": 64, "GROUP_M": 8}, w, s, "dW fold"))
    fwd = {"BM": 128, "BV": 256, "BK": 64, "VCHUNK": 2048, "GROUP_M": 8}  # linear_logp.FWD_CFG on the GPU
    for even in (True, False):
        out.append(("linear_logp", "_fused_fwd_kernel", FWD_TYPES, {**fwd, "EVEN_K": even}, 8, 3,
                    f"fused fwd even={even}"))
    if hasattr(importlib.import_module("gradsweep.triton_kernels.linear_logp"), "_fused_fwd_tma_kernel"):
        types = {**FWD_TMA_TYPES, "h_desc": "tensordesc<bf16[128,64]>", "w_desc": "tensordesc<bf16[256,64]>"}
        out.append(("linear_logp", "_fused_fwd_tma_kernel", types, fwd, 8, 3, "fused fwd by TMA"))
        for bm, bn, bk, w, s in GEMM_TILES:
            types = {**DLOG_TMA_TYPES, "h_desc": f"tensordesc<bf16[{bm},{bk}]>",
                     "w_desc": f"tensordesc<bf16[{bn},{bk}]>"}
            out.append(("linear_logp", "_dlogits_tma_kernel", types, {"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8},
                        w, s, "dlogits by TMA"))
    out.append(("linear_logp", "_combine_kernel", COMBINE_TYPES, {"BR": 128}, 4, 3, "combine"))
    out.append(("logp", "_logp_fwd_kernel", LOGP_FWD_TYPES, {"ROWS": 1, "BLOCK": 4096}, 8, 2, "logp fwd"))
    out.append(("logp", "_logp_bwd_kernel", LOGP_BWD_TYPES, {"ROWS": 1, "BLOCK": 2048, "SOFT_RNE": False}, 4, 3,
                "logp bwd"))
    out.append(("_common", "_fold_kernel", FOLD_TYPES, {"BLOCK": 32, "UNROLL": 64}, 1, 3, "fold"))
    if hasattr(importlib.import_module("gradsweep.triton_kernels.gemm"), "_mm_tma_kernel"):
        out.append(("gemm", "_mm_tma_kernel", TMA_TYPES, {"BM": 128, "BN": 256, "BK": 64, "GROUP_M": 8,
                                                         "PROGRAMS": 132, "B_T": True}, 8, 3, "TMA fwd"))
    if hasattr(importlib.import_module("gradsweep.triton_kernels.gemm"), "_dw_tma_kernel"):
        for bn, bk, w, s in DW_TILES:
            types = {**DW_TMA_TYPES, "dy_desc": f"tensordesc<bf16[1,64,{bn}]>",
                     "x_desc": f"tensordesc<bf16[1,64,{bk}]>"}
            out.append(("gemm", "_dw_tma_kernel", types, {"BN": bn, "BK": bk, "BT": 64, "GROUP_M": 8}, w, s,
                        "dW fold by TMA"))
    return out


def strip_lines(ptx: str) -> str:
    """PTX without line information: .loc / .file directives, debug sections, and the ``$L__tmpN:`` labels that
    only mark debug ranges (an inlined jit helper adds some; no instruction refers to them: branch targets are
    ``$L__BB`` labels, and a ``$L__tmp`` label that anything but the debug sections names is kept)."""
    text = re.sub(r"\.section\s+\.debug_\w+\s*\{.*?\n\s*\}", "", ptx, flags=re.S)
    keep = [ln for ln in text.splitlines() if not re.match(r"\s*\.(loc|file)\b", ln)]
    label = re.compile(r"\$L__tmp\d+:")
    named = {m for ln in keep if not label.fullmatch(ln.strip()) for m in re.findall(r"\$L__tmp\d+", ln)}
    return "\n".join(ln for ln in keep if not (label.fullmatch(ln.strip()) and ln.strip()[:-1] not in named))


def compile_ptx(module: str, kernel: str, types: dict, consts: dict, warps: int, stages: int) -> str:
    fn = getattr(importlib.import_module(f"gradsweep.triton_kernels.{module}"), kernel)
    names = fn.arg_names
    params = {p.name: p for p in fn.params}
    constexprs = {n: v for n, v in consts.items() if n in names}
    signature = {n: ("constexpr" if (n in constexprs) else types[n]) for n in names}
    attrs = {}
    for i, n in enumerate(names):
        if n in constexprs or params[n].is_constexpr or types[n].startswith("tensordesc"):
            continue
        attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=TARGET, options={"num_warps": warps, "num_stages": stages})
    return compiled.asm["ptx"]


def main() -> int:
    dump = Path(sys.argv[1]) if len(sys.argv) > 1 else None  # optional: write each stripped PTX there (to diff)
    only = os.environ.get("PTX_DIGEST_ONLY")  # e.g. _mm_tma_kernel: compile that kernel's specialisations only
    for n, (module, kernel, types, consts, warps, stages, what) in enumerate(specs()):
        if only and kernel != only:
            continue
        ptx = strip_lines(compile_ptx(module, kernel, types, consts, warps, stages))
        digest = hashlib.sha256(ptx.encode()).hexdigest()[:16]
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            (dump / f"{n:02d}_{module}.{kernel}.ptx").write_text(ptx)
        print(f"{module}.{kernel} [{what}] {sorted(consts.items())} w{warps} s{stages}: {digest} "
              f"({ptx.count(chr(10)) + 1} lines)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
