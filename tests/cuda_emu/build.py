"""Build the CUDA kernels of csrc/ (all but the Hopper ones: attention, RL, row norms, the portable GEMMs and dW fold,
pointwise, gather, logp, linear_logp) for the host (a CPU emulation) and load them as a stand-in of gradsweep._C.

Why: the kernels only run on the lent GPU, yet most of what can go wrong in them (fragment addressing, masks,
the block and tile loops, the fold's bounds, the host launchers' grids and parameters) is plain arithmetic that a
CPU can execute. The sources are copied with mechanical rewrites (inline-PTX helpers replaced by emu_mma.h, launch
syntax by ``emu_launch``, device guards dropped), compiled with the host compiler against the CUDA headers, and
exposed through ctypes with gradsweep._C's launcher signatures. The tensor-core model is exact per product and
row-local, like the hardware, but its rounding is not the hardware's: bits seen here are the emulation's own, so
bitwise checks here test the kernels' structure (which rows and keys meet, in which order), not the H200's bits.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
HERE = Path(__file__).resolve().parent
KERNELS = ("attention_fwd", "attention_dq", "attention_dkdv", "rl", "rms_norm", "qk_norm", "gemm", "pointwise",
           "gather", "logp", "linear_logp")


def cuda_include() -> Path | None:
    """The CUDA headers next to nvcc (cuda_bf16.h, cuda_runtime.h), or None."""
    nvcc = shutil.which("nvcc")
    roots = [Path(nvcc).resolve().parent.parent] if nvcc else []
    roots += [Path("/usr/local/cuda")]
    for root in roots:
        for inc in (root / "targets" / "x86_64-linux" / "include", root / "include"):
            if (inc / "cuda_bf16.h").is_file() and (inc / "cuda_runtime.h").is_file():
                return inc
    return None


def unavailable() -> str | None:
    """Why the emulation cannot be built here, or None."""
    if shutil.which("g++") is None:
        return "no g++"
    if cuda_include() is None:
        return "no CUDA headers (cuda_bf16.h)"
    probe = subprocess.run(["g++", "-std=c++20", "-x", "c++", "-E", "-"], input="#include <barrier>\n",
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return "g++ lacks C++20 <barrier>"
    return None


def _drop_function(src: str, signature: str) -> str:
    """Remove the function whose definition holds ``signature`` (and a ``template`` line right before it)."""
    i = src.index(signature)
    start = src.rfind("\n", 0, i) + 1
    prev = src.rfind("\n", 0, start - 1) + 1
    if src[prev:start].startswith("template"):
        start = prev
    k, depth = src.index("{", i), 0
    while True:
        depth += {"{": 1, "}": -1}.get(src[k], 0)
        if depth == 0:
            return src[:start] + src[k + 1:]
        k += 1


def _static_shared(m: re.Match) -> str:
    """``__shared__ T a[n], b[m];`` as CTA-wide buffers of the emulation (emu.h, EmuCta::static_shared)."""
    decls = re.findall(r"(\w+)\[([^\]]+)\]", m.group(2))
    return " ".join(f'{m.group(1)}* {name} = emu_cta->static_shared<{m.group(1)}>("{name}", {size});'
                    for name, size in decls)


def _host_kernel_source(src: str) -> str:
    # dynamic shared memory (`extern __shared__ [__align__(n)] T name[];`): the CTA's buffer; static arrays: their own
    src = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?([\w ]+?) (\w+)\[\];",
                 r"\1* \2 = reinterpret_cast<\1*>(emu_cta->shared());", src)
    src = re.sub(r"__shared__ (\w+) ([^;]+);", _static_shared, src)
    src = re.sub(r"\n\s*DeviceGuard guard\(device\);", "\n  (void)device;", src)
    src = re.sub(r"\n\s*GS_TRY\(guard.status\(\)\);", "", src)
    src = re.sub(r"\n\s*GS_TRY\(dynamic_smem_once<[^;]*;", "", src)
    src = src.replace("cudaGetLastError()", "cudaSuccess")
    return re.sub(r"([\w:<>, ]+?)<<<(.+?), (.+?), (.+?), (.+?)>>>\(", r"emu_launch(\1, \2, \3, \4, ", src, flags=re.S)


_WRAP = """#include <cuda_runtime.h>

#include <cstdint>
#include "attention.h"
#include "gradsweep.h"
#include "rl.h"
#define U uintptr_t
extern "C" {
int emu_rms_norm_fwd(U x, U w, U y, U r, int64_t rows, int64_t h, float eps, int warp_rows) {
  return gs::rms_norm_fwd(x, w, y, r, rows, h, eps, 0, 0, warp_rows);
}
int emu_rms_norm_bwd_dx(U dy, U x, U w, U r, U dx, int64_t rows, int64_t h, int warp_rows) {
  return gs::rms_norm_bwd_dx(dy, x, w, r, dx, rows, h, 0, 0, warp_rows);
}
int emu_rms_norm_dw_tiles(U plan, int64_t n, int64_t tile, U dy, U x, U r, U part, int64_t h, U sdy, U sx, U sr,
                          int64_t ns) {
  return gs::rms_norm_dw_tiles(plan, n, tile, dy, x, r, part, h, 0, 0, sdy, sx, sr, ns);
}
int emu_fold_tiles(U part, int64_t n, U grad, int64_t cols) { return gs::fold_tiles(part, n, grad, cols, 0, 0); }
int emu_qk_norm_dw_tiles(U plan, int64_t n, int64_t tile, U dy, U x, U r, U part, int64_t heads, int64_t d, U sdy,
                         U sx, U sr, int64_t ns) {
  return gs::qk_norm_dw_tiles(plan, n, tile, dy, x, r, part, heads, d, 0, 0, sdy, sx, sr, ns);
}
int emu_gemm_nt(U a, U b, U c, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc) {
  return gs::gemm_nt(a, b, c, M, N, K, lda, ldb, ldc, 0, 0, gs::kGemmPortable);
}
int emu_gemm_nn(U a, U b, U c, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, int out) {
  return gs::gemm_nn(a, b, c, M, N, K, lda, ldb, ldc, out, 0, 0, gs::kGemmPortable);
}
int emu_gemm_dw_fold(U plan, int64_t n, int64_t tile, U dy, U x, U g, int64_t rows, int64_t N, int64_t K,
                     int64_t ldy, int64_t ldx, int64_t ldg, U sdy, U sx, int64_t ns, int64_t sldy, int64_t sldx) {
  return gs::gemm_dw_fold(plan, n, tile, dy, x, g, rows, N, K, ldy, ldx, ldg, 0, 0, gs::kGemmPortable, sdy, sx, ns,
                          sldy, sldx);
}
int emu_silu_fwd(U x, U y, int64_t n) { return gs::silu_fwd(x, y, n, 0, 0); }
int emu_silu_bwd(U x, U dy, U dx, int64_t n) { return gs::silu_bwd(x, dy, dx, n, 0, 0); }
int emu_swiglu_fwd(U g, U u, U y, int64_t n) { return gs::swiglu_fwd(g, u, y, n, 0, 0); }
int emu_swiglu_bwd(U g, U u, U dy, U dg, U du, int64_t n) { return gs::swiglu_bwd(g, u, dy, dg, du, n, 0, 0); }
int emu_rope(U x, U pos, U y, int64_t rows, int64_t heads, int64_t d, float theta, int inverse) {
  return gs::rope(x, pos, y, rows, heads, d, theta, inverse != 0, 0, 0);
}
int emu_embedding_fwd(U ids, U w, U y, int64_t rows, int64_t V, int64_t H) {
  return gs::embedding_fwd(ids, w, y, rows, V, H, 0, 0);
}
int emu_embedding_fold(U sorted, U src, int64_t n, U dy, U grad, int64_t V, int64_t H) {
  return gs::embedding_fold(sorted, src, n, dy, grad, V, H, 0, 0);
}
int emu_pack_rows(U src, U dst, U meta, int64_t ns, int64_t max_len, int64_t H, int unpack) {
  return gs::pack_rows(src, dst, meta, ns, max_len, H, unpack != 0, 0, 0);
}
int emu_logp_fwd(U logits, U t, U out, U lse, int64_t R, int64_t V, int64_t ld) {
  return gs::logp_fwd(logits, t, out, lse, R, V, ld, 0, 0);
}
int emu_logp_bwd(U logits, U t, U lse, U g, U d, int64_t R, int64_t V, int64_t ld, int64_t ldd) {
  return gs::logp_bwd(logits, t, lse, g, d, R, V, ld, ldd, 0, 0);
}
int emu_llp_forward(U h, U w, U t, U part, U out, U lse, int64_t R, int64_t V, int64_t K, int64_t ldh, int64_t ldw,
                    U logits, int64_t ldl) {
  return gs::llp_forward(h, w, t, part, out, lse, R, V, K, ldh, ldw, logits, ldl, 0, 0, gs::kGemmPortable);
}
int emu_llp_dlogits(U h, U w, U t, U lse, U g, U d, int64_t M, int64_t N, int64_t K, int64_t v0, int64_t V,
                    int64_t ldh, int64_t ldw, int64_t ldd, U logits, int64_t ldl) {
  return gs::llp_dlogits(h, w, t, lse, g, d, M, N, K, v0, V, ldh, ldw, ldd, logits, ldl, 0, 0, gs::kGemmPortable);
}
int64_t emu_llp_vchunk() { return gs::kLlpVChunk; }
int64_t emu_attn_rows(int narrow, int dq) { return gs::attn_rows(narrow != 0, dq != 0); }
int64_t emu_attn_fold_keys() { return gs::attn_fold_keys(); }
int64_t emu_attn_fold_tile() { return gs::attn_fold_tile(); }
int64_t emu_attn_block_n() { return gs::attn_block_n(); }
int64_t emu_attn_max_head_dim() { return gs::attn_max_head_dim(); }
int64_t emu_rl_seq_threads() { return gs::kRlSeqThreads; }
// no device here: the Hopper check (hopper_gemm) asks for an attribute, and the portable path is forced anyway
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) {
  *value = 0;
  return cudaErrorNoDevice;
}
int emu_attn_fwd(U q, U k, U v, U o, U lse, U w, int64_t nw, U nr, int64_t nn, int64_t pack, int64_t HQ, int64_t HKV,
                 int64_t D, int64_t T, float s) {
  return gs::attn_fwd(q, k, v, o, lse, w, nw, nr, nn, pack, HQ, HKV, D, T, s, 0, 0);
}
int emu_attn_dq(U q, U k, U v, U o, U dout, U dq, U lse, U delta, U w, int64_t nw, U nr, int64_t nn, int64_t pack,
                int64_t HQ, int64_t HKV, int64_t D, int64_t T, float qk, float sm, int exact) {
  return gs::attn_dq(q, k, v, o, dout, dq, lse, delta, w, nw, nr, nn, pack, HQ, HKV, D, T, qk, sm, exact != 0, 0, 0);
}
int emu_attn_dkdv(U k, U v, U q, U dout, U lse, U delta, U dk, U dv, U work, int64_t n, int64_t HQ, int64_t HKV,
                  int64_t D, int64_t T, float qk, float sm, int load_acc, int fp32) {
  return gs::attn_dkdv(k, v, q, dout, lse, delta, dk, dv, work, n, HQ, HKV, D, T, qk, sm, load_acc != 0, fp32 != 0,
                       0, 0);
}
int emu_attn_scatter(U sa, U da, U sb, U db, U rows, U toks, int64_t n, int64_t e) {
  return gs::attn_scatter(sa, da, sb, db, rows, toks, n, e, 0, 0);
}
int emu_rl_ratio_fwd(U lp, U old, U out, int64_t n, int dt) { return gs::rl_ratio_fwd(lp, old, out, n, dt, 0, 0); }
int emu_rl_ratio_bwd(U lp, U old, U g, U d, int64_t n, int dt, int gdt) {
  return gs::rl_ratio_bwd(lp, old, g, d, n, dt, gdt, 0, 0);
}
int emu_rl_kl_fwd(U lp, U ref, U k1, U k2, U k3, int64_t n, int dt) {
  return gs::rl_kl_fwd(lp, ref, k1, k2, k3, n, dt, 0, 0);
}
int emu_rl_kl_bwd(U lp, U ref, U g1, U g2, U g3, U d, int64_t n, int dt, int gdt) {
  return gs::rl_kl_bwd(lp, ref, g1, g2, g3, d, n, dt, gdt, 0, 0);
}
int emu_rl_policy(U lp, U old, U ref, U adv, U sample, U rewards, U g, U out, int64_t n, int64_t ns, int64_t group,
                  float lo, float hi, float beta, float eps, int grouped, int kl, int dt, int gdt) {
  return gs::rl_policy(lp, old, ref, adv, sample, rewards, g, out, n, ns, group, lo, hi, beta, eps, grouped != 0,
                       kl != 0, dt, gdt, 0, 0);
}
int emu_rl_seq_sum(U a, U b, U m, U order, U start, U len, U out, int64_t ns, int dt) {
  return gs::rl_seq_sum(a, b, m, order, start, len, out, ns, dt, 0, 0);
}
int emu_rl_dpo(U seq, U gseq, U sample, U mask, U out, int64_t n, int64_t ns, float beta, int gdt) {
  return gs::rl_dpo(seq, gseq, sample, mask, out, n, ns, beta, gdt, 0, 0);
}
}
"""


def build(out: Path, plant: tuple[str, str, str] | None = None) -> Path:
    """Write the rewritten sources under ``out`` and compile libemu.so; ``plant`` = (kernel file stem, old text, new
    text) changes one kernel source first (to show that the emulated checks can fail)."""
    src = out / "src"
    src.mkdir(parents=True, exist_ok=True)
    common = _drop_function((CSRC / "common.cuh").read_text(), "float ex2(").replace(
        "#include <cuda_runtime.h>", '#include <cuda_runtime.h>\n#include "emu.h"').replace(
        "cudaGetLastError()", "cudaSuccess")  # launch_aligned's error read: no runtime here
    (src / "common.cuh").write_text(common.replace("namespace gs {\n", "namespace gs {\n"
                                                   "inline float ex2(float x) { return exp2f(x); }\n", 1))
    mma = (CSRC / "mma_gemm.cuh").read_text()
    for sig in ("uint32_t smem_addr(", "void cp_async16(", "void cp_async_commit(", "void cp_async_wait(",
                "void ldmatrix_x4(", "void ldmatrix_x4_trans(", "void mma_bf16("):
        mma = _drop_function(mma, sig)
    mma = mma.replace('#include "common.cuh"', '#include "common.cuh"\n#include "emu_mma.h"')
    (src / "mma_gemm.cuh").write_text(mma)
    # the portable GEMMs' kernel and launch live in a header: rewritten as the kernel sources are
    (src / "gemm_epilogue.cuh").write_text(_host_kernel_source((CSRC / "gemm_epilogue.cuh").read_text()))
    att = _drop_function((CSRC / "attention.cuh").read_text(), "void cp_async4(")
    att = att.replace("namespace attn {\n", "namespace attn {\n"
                      "inline void cp_async4(void* d, const void* s) { std::memcpy(d, s, 4); }\n", 1)
    (src / "attention.cuh").write_text(att)
    for header in ("attention.h", "attention_dkdv.cuh", "attention_dq.cuh", "attention_fwd.cuh", "rl.h",
                   "gradsweep.h"):
        shutil.copy(CSRC / header, src / header)
    for stem in KERNELS:
        text = (CSRC / f"{stem}.cu").read_text()
        if plant is not None and plant[0] == stem:
            if plant[1] not in text:
                raise ValueError(f"plant: {plant[1]!r} not in csrc/{stem}.cu")
            text = text.replace(plant[1], plant[2])
        (src / f"{stem}.cpp").write_text(_host_kernel_source(text))
    (src / "wrap.cpp").write_text(_WRAP)
    lib = out / "libemu.so"
    # GS_NO_SM90_GEMM: the Hopper (wgmma) paths are not emulated; their launchers are not built here
    cmd = ["g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-w", "-DGS_NO_SM90_GEMM",
           f"-I{HERE}",
           f"-I{src}", f"-I{cuda_include()}", *[str(src / f"{s}.cpp") for s in KERNELS], str(src / "wrap.cpp"),
           "-o", str(lib)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"emulation build failed:\n{res.stderr[-6000:]}")
    return lib


def _copy_pieces(pieces, src, dst, n_pieces, longest, src_stride_bytes, row_bytes, device, stream) -> None:
    """gradsweep._C.copy_pieces on host memory: piece (source row, staging row, length) moves that many rows of
    row_bytes from src (src_stride_bytes apart) to the contiguous rows of dst."""
    table = (ctypes.c_int32 * (3 * n_pieces)).from_address(pieces) if n_pieces else []
    for p in range(n_pieces):
        s0, d0, n = table[3 * p], table[3 * p + 1], table[3 * p + 2]
        for r in range(n):
            ctypes.memmove(dst + (d0 + r) * row_bytes, src + (s0 + r) * src_stride_bytes, row_bytes)


def load(lib: Path) -> SimpleNamespace:
    """gradsweep._C's attention, RL and row-norm launchers (and sizes) backed by the emulated kernels of ``lib``."""
    so = ctypes.CDLL(str(lib))
    U, L, F, N = ctypes.c_size_t, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    sigs = {
        "attn_fwd": [U] * 5 + [U, L, U, L, L, L, L, L, L, F],
        "attn_dq": [U] * 8 + [U, L, U, L, L, L, L, L, L, F, F, N],
        "attn_dkdv": [U] * 9 + [L, L, L, L, L, F, F, N, N],
        "attn_scatter": [U] * 6 + [L, L],
        "rl_ratio_fwd": [U, U, U, L, N], "rl_ratio_bwd": [U, U, U, U, L, N, N],
        "rl_kl_fwd": [U] * 5 + [L, N], "rl_kl_bwd": [U] * 6 + [L, N, N],
        "rl_policy": [U] * 8 + [L, L, L, F, F, F, F, N, N, N, N],
        "rl_seq_sum": [U] * 7 + [L, N], "rl_dpo": [U] * 5 + [L, L, F, N],
        "rms_norm_dw_tiles": [U, L, L, U, U, U, U, L], "fold_tiles": [U, L, U, L],
        "qk_norm_dw_tiles": [U, L, L, U, U, U, U, L, L],
        "gemm_nt": [U, U, U, L, L, L, L, L, L], "gemm_nn": [U, U, U, L, L, L, L, L, L, N],
        "gemm_dw_fold": [U, L, L, U, U, U, L, L, L, L, L, L],
        "silu_fwd": [U, U, L], "silu_bwd": [U, U, U, L], "swiglu_fwd": [U, U, U, L], "swiglu_bwd": [U] * 5 + [L],
        "rope": [U, U, U, L, L, L, F, N], "embedding_fwd": [U, U, U, L, L, L], "embedding_fold": [U, U, L, U, U, L, L],
        "pack_rows": [U, U, U, L, L, L, N], "logp_fwd": [U] * 4 + [L, L, L], "logp_bwd": [U] * 5 + [L, L, L, L],
        "llp_forward": [U] * 6 + [L] * 5 + [U, L], "llp_dlogits": [U] * 6 + [L] * 8 + [U, L],
    }
    # keyword arguments of the real launchers, passed on after the positional ones (0: not given): the folds'
    # carried rows (csrc/common.cuh, FoldRows)
    keywords = {name: ("stage_dy", "stage_x", "stage_rstd", "n_stage")
                for name in ("rms_norm_dw_tiles", "qk_norm_dw_tiles")}
    keywords["gemm_dw_fold"] = ("stage_dy", "stage_x", "n_stage", "stage_ldy", "stage_ldx")
    for name, kws in keywords.items():
        sigs[name] = sigs[name] + [L if k.startswith(("n_", "stage_ld")) else U for k in kws]
    ns = SimpleNamespace()
    for name, argtypes in sigs.items():
        fn = getattr(so, f"emu_{name}")
        fn.argtypes = argtypes
        kws = keywords.get(name, ())
        n_args = len(argtypes) - len(kws)

        def launcher(*args, _fn=fn, _n=n_args, _name=name, _kws=kws, **kw):  # the real ones end (device, stream)
            unknown = set(kw) - set(_kws)
            if unknown:
                raise TypeError(f"emulated {_name}: unexpected keyword arguments {sorted(unknown)}")
            rc = _fn(*[int(a) if isinstance(a, bool) else a for a in args[:_n]], *[int(kw.get(k, 0)) for k in _kws])
            if rc != 0:
                raise RuntimeError(f"emulated {_name}: CUDA error {rc}")

        setattr(ns, name, launcher)
    for name, argtypes in (("rms_norm_fwd", [U] * 4 + [L, L, F, N]), ("rms_norm_bwd_dx", [U] * 5 + [L, L, N])):
        fn = getattr(so, f"emu_{name}")
        fn.argtypes = argtypes
        n_args = len(argtypes) - 1  # the real launchers: (..., device, stream, warp_rows=-1)

        def rows_launcher(*args, warp_rows: int = -1, _fn=fn, _n=n_args, _name=name):
            rc = _fn(*args[:_n], int(args[_n + 2]) if len(args) > _n + 2 else warp_rows)
            if rc != 0:
                raise RuntimeError(f"emulated {_name}: CUDA error {rc}")

        setattr(ns, name, rows_launcher)
    for name in ("emu_attn_fold_keys", "emu_attn_fold_tile", "emu_attn_block_n", "emu_attn_max_head_dim",
                 "emu_rl_seq_threads", "emu_llp_vchunk"):
        getattr(so, name).restype = L
    so.emu_attn_rows.restype = L
    ns.LLP_VCHUNK = so.emu_llp_vchunk()
    ns.hopper_gemm = lambda device: False  # the portable (mma.sync) kernels: the Hopper ones are not emulated
    so.emu_attn_rows.argtypes = [N, N]
    ns.ATTN_FWD_ROWS, ns.ATTN_DQ_ROWS = so.emu_attn_rows(0, 0), so.emu_attn_rows(0, 1)
    ns.ATTN_NARROW_ROWS, ns.ATTN_FOLD_KEYS = so.emu_attn_rows(1, 0), so.emu_attn_fold_keys()
    ns.ATTN_FOLD_TILE, ns.ATTN_BLOCK_N = so.emu_attn_fold_tile(), so.emu_attn_block_n()
    ns.ATTN_MAX_HEAD_DIM, ns.RL_SEQ_THREADS = so.emu_attn_max_head_dim(), so.emu_rl_seq_threads()
    ns.copy_pieces = _copy_pieces  # csrc/gather.cu is not emulated: its byte copy, by ctypes
    ns.library = so  # keeps the library loaded while the namespace lives
    return ns


def install(monkeypatch, ext: SimpleNamespace) -> SimpleNamespace:
    """Route gradsweep.cuda_kernels through ``ext`` on CPU tensors (real pointers; undone by the monkeypatch)."""
    from gradsweep.cuda_kernels import runtime as rt

    def check_tensor(name: str, t: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> None:
        if not isinstance(t, torch.Tensor) or t.dtype != dtype:
            raise ValueError(f"{name}: expected {dtype}, got {getattr(t, 'dtype', type(t))}")

    monkeypatch.setattr(rt, "ext", lambda: ext)
    monkeypatch.setattr(rt, "check_tensor", check_tensor)
    monkeypatch.setattr(rt, "launch", lambda t: (0, 0))
    monkeypatch.setattr(rt, "ptr", lambda t: 0 if t is None else int(t.data_ptr()))
    return ext
