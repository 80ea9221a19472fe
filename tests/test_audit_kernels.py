"""Audits of the kernel families' sources (CI, CPU): what would break invariance or independence by construction.

- csrc/ (the CUDA family) has no atomics: no atomic* intrinsic, no std::atomic / cuda::atomic, no PTX red.* /
  atom.* instruction. Comments are stripped first (a comment may say "no atomics").
- the Hopper GEMMs (csrc/*_sm90.cu, CUTLASS templates instantiated there) compile to PTX with wgmma and without
  any atom.* / red.* instruction: the audit of the generated code covers what the library headers bring in
  (a stream-K or split-K scheduler would need them).
- a cuda_bf16 kernel module never hands a kernel the address of a tensor nothing holds (`rt.ptr(x.contiguous())`);
- a cuda_bf16 kernel module (gradsweep/cuda_kernels/*.py) never imports Triton or the Triton family, and never
  calls a torch GEMM / softmax on its kernel path (matmul, mm, bmm, einsum, linear, softmax, log_softmax, ``@``
  and relatives); the Triton family never imports the CUDA family: a profile never borrows another's kernels.
Each scanner is shown to catch a planted offender, so the audit can fail.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
CUDA_PY = ROOT / "gradsweep" / "cuda_kernels"
TRITON_PY = ROOT / "gradsweep" / "triton_kernels"

_ATOMIC = re.compile(r"atomic|\b(red|atom)\s*\.\s*(global|shared|gpu|sys|cta|relaxed|release|acquire|acq_rel|"
                     r"add|inc|dec|cas|exch|min|max|and|or|xor|e?\w*\.)", re.IGNORECASE)
_FORBIDDEN_CALLS = frozenset({"matmul", "mm", "bmm", "baddbmm", "addmm", "addbmm", "addmv", "mv", "einsum",
                              "linear", "bilinear", "softmax", "log_softmax", "logsumexp", "tensordot",
                              "chain_matmul", "cross_entropy", "scaled_dot_product_attention", "inner", "dot",
                              "vdot", "matrix_power", "multi_dot"})


def strip_c_comments(src: str) -> str:
    """C/C++/CUDA source without // and /* */ comments (string literals kept: PTX lives in them)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif src[i] == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def atomic_offences(src: str) -> list[str]:
    code = strip_c_comments(src)
    return [line.strip() for line in code.splitlines() if _ATOMIC.search(line)]


def kernel_path_offences(src: str, forbidden_imports: tuple[str, ...]) -> list[str]:
    """Imports of another family and torch GEMM / softmax calls in a kernel module (docstrings ignored)."""
    bad = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            bad += [f"import {a.name}" for a in node.names if a.name.startswith(forbidden_imports)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(forbidden_imports):
            bad.append(f"from {node.module} import ...")
        elif isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(node.op, ast.MatMult):
            bad.append(f"line {node.lineno}: @ (a torch GEMM)")
        elif isinstance(node, ast.Attribute) and node.attr in _FORBIDDEN_CALLS:
            bad.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in _FORBIDDEN_CALLS:
            bad.append(f"line {node.lineno}: {node.id}")
    return bad


_CUDA_FORBIDDEN = ("triton", "gradsweep.triton_kernels")
_TRITON_FORBIDDEN = ("gradsweep.cuda_kernels", "gradsweep._C")


def test_no_atomics_in_csrc() -> None:
    files = sorted(p for p in CSRC.iterdir() if p.suffix in (".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc"))
    assert any(p.suffix == ".cu" for p in files), "csrc/ has no .cu file: the audit would check nothing"
    offenders = {p.name: atomic_offences(p.read_text(errors="replace")) for p in files}
    assert not {k: v for k, v in offenders.items() if v}, offenders


@pytest.mark.parametrize("planted", [
    "atomicAdd(&acc[c], v);",
    "  atomicCAS(p, 0, 1);",
    "std::atomic<int> n;",
    'asm volatile("red.global.add.f32 [%0], %1;" :: "l"(p), "f"(v));',
    'asm("atom.global.cas.b32 %0, [%1], %2, %3;" : "=r"(o) : "l"(p), "r"(a), "r"(b));',
    "cuda::atomic_ref<float> r(x);",
])
def test_atomic_scanner_catches_planted(planted: str) -> None:
    assert atomic_offences(f"// ok\n__global__ void k(float* p) {{\n{planted}\n}}\n")


def test_atomic_scanner_ignores_comments() -> None:
    assert not atomic_offences("// no atomics here\n/* atomicAdd would race */\nint x = 1;\n")


def test_cuda_kernel_modules_borrow_nothing() -> None:
    files = sorted(CUDA_PY.glob("*.py"))
    assert len(files) >= 10, "expected every CUDA op module"
    offenders = {p.name: kernel_path_offences(p.read_text(), _CUDA_FORBIDDEN) for p in files}
    assert not {k: v for k, v in offenders.items() if v}, offenders


def test_triton_kernel_modules_do_not_import_the_cuda_family() -> None:
    bad = {}
    for p in sorted(TRITON_PY.glob("*.py")):
        found = [o for o in kernel_path_offences(p.read_text(), _TRITON_FORBIDDEN) if "import" in o]
        if found:
            bad[p.name] = found
    assert not bad, bad


@pytest.mark.parametrize("planted", [
    "import triton\n", "from gradsweep.triton_kernels.gemm import det_linear\n", "y = x @ w.t()\n",
    "y = torch.matmul(x, w)\n", "y = F.linear(x, w)\n", "p = torch.softmax(z, -1)\n",
    "p = z.log_softmax(-1)\n", "y = torch.mm(a, b)\n", "y = torch.bmm(a, b)\n", "y = torch.einsum('ij,jk', a, b)\n",
    "acc @= w\n",
])
def test_kernel_path_scanner_catches_planted(planted: str) -> None:
    assert kernel_path_offences("import torch\n" + planted, _CUDA_FORBIDDEN)


def temporary_address_offences(src: str) -> list[str]:
    """``rt.ptr(<a call>)``: the address of a tensor that nothing holds (``x.contiguous()``, ``x.float()``,
    ``f(...)``). When the call makes a copy (a strided or other-dtype input), the copy is freed as soon as its
    address is taken, before the kernel that reads it runs: on the GPU the caching allocator and stream order
    happen to keep the bytes, the emulated kernels (tests/cuda_emu) read freed memory. Bind the tensor to a name
    first. (Found by ``bn_strided``: rl_ratio's backward took its strided upstream gradient's copy this way.)"""
    bad = []
    for node in ast.walk(ast.parse(src)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "ptr"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "rt"
                and any(isinstance(a, ast.Call) for a in node.args)):
            bad.append(f"line {node.lineno}: {ast.unparse(node)}")
    return bad


def test_cuda_kernel_modules_never_take_a_temporary_tensors_address() -> None:
    offenders = {p.name: temporary_address_offences(p.read_text()) for p in sorted(CUDA_PY.glob("*.py"))}
    assert not {k: v for k, v in offenders.items() if v}, offenders


@pytest.mark.parametrize("planted", ["f(rt.ptr(x.contiguous()))\n", "f(rt.ptr(up(g, n)))\n",
                                     "rt.ptr(x.float())\n"])
def test_temporary_address_scanner_catches_planted(planted: str) -> None:
    assert temporary_address_offences(planted)
    assert not temporary_address_offences("y = x.contiguous()\nf(rt.ptr(y), rt.ptr(None))\n")


def _cutlass_include() -> Path | None:
    spec = importlib.util.find_spec("cutlass_library")
    for p in (spec.submodule_search_locations or []) if spec else []:
        inc = Path(p) / "source" / "include"
        if (inc / "cutlass" / "cutlass.h").is_file():
            return inc
    return None


_PTX_ATOMIC = re.compile(r"^\s*(@!?%p\d+\s+)?(atom|red|multimem\.red)\.", re.MULTILINE)


def test_ptx_atomic_scanner_catches_planted() -> None:
    assert _PTX_ATOMIC.search("\tmov.u32 %r1, 0;\n\tred.global.add.f32 [%rd1], %f1;\n")
    assert _PTX_ATOMIC.search("\t@%p3 atom.global.cas.b32 %r2, [%rd4], %r5, %r6;\n")
    assert not _PTX_ATOMIC.search("\twgmma.fence.sync.aligned;\n\tst.global.v4.f32 [%rd1], {%f1,%f2,%f3,%f4};\n")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("source", sorted(p.name for p in CSRC.glob("*_sm90.cu")))
def test_hopper_gemm_ptx_uses_wgmma_and_no_atomics(source: str, tmp_path: Path) -> None:
    include = _cutlass_include()
    if include is None:
        pytest.skip("nvidia-cutlass headers not installed")
    ptx = tmp_path / "k.ptx"
    cmd = ["nvcc", "-ptx", str(CSRC / source), "-o", str(ptx), "-O3", "-std=c++17", "--expt-relaxed-constexpr",
           "-DNDEBUG", "-arch=sm_90a", f"-I{CSRC}", f"-I{include}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    text = ptx.read_text()
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16", text), "no wgmma"
    hits = [m.group(0) for m in _PTX_ATOMIC.finditer(text)]
    assert not hits, f"{source}: atomic instructions in the generated PTX: {hits[:5]}"


_LAYOUT_CHECK = r"""
#include <cstdio>
#include "cute/tensor.hpp"
#include "fold_sm90_layout.cuh"
using namespace cute;
using Elem = cutlass::bfloat16_t;
// Every element of the tile: CuTe's offset (the layout the wgmma descriptors are built from) against the
// producer's cp.async chunk formula, and against where a TMA box (64 columns x BK rows, 128-byte swizzle:
// row t of the box at 128 t, its 16-byte chunk j at chunk j ^ (t % 8)) starting at box_offset writes it.
template <int ROWS, int BK, int S>
long mismatches() {
  using L = gs::fold90::FoldSmemLayout<ROWS, BK, S>;
  Elem* base = reinterpret_cast<Elem*>(uintptr_t(1) << 20);  // 1 KiB aligned, never dereferenced
  Tensor s = make_tensor(make_smem_ptr(base), L{});
  long bad = 0;
  for (int st = 0; st < S; ++st)
    for (int t = 0; t < BK; ++t)
      for (int c = 0; c < ROWS / 8; ++c)
        for (int e = 0; e < 8; ++e) {
          long cute_off = reinterpret_cast<char*>(&s(c * 8 + e, t, st)) - reinterpret_cast<char*>(base);
          long chunk = long(gs::fold90::swizzled_offset<ROWS, BK>(st, c, t) ^ PLANT) + 2 * e;
          long box = long(gs::fold90::box_offset<ROWS, BK>(st, c / 8) ^ PLANT) + 128 * t + 16 * ((c % 8) ^ (t % 8)) +
                     2 * e;
          bad += (cute_off != chunk) + (cute_off != box);
        }
  return bad;
}
int main() {
  constexpr int BK = gs::fold90::kFoldSlotsPerStage;
  long bad = mismatches<128, BK, 4>() + mismatches<256, BK, 4>() + mismatches<64, BK, 2>();
  printf("mismatches %ld\n", bad);
  return bad != 0;
}
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_hopper_fold_chunk_addresses_match_the_cute_layout(tmp_path: Path) -> None:
    """The fold's producer writes each 16-byte chunk and each TMA box where wgmma's CuTe layout expects it.

    fold_sm90_layout.cuh's chunk formula and box offsets (with TMA's 128-byte swizzle inside a box) are
    compiled on the host beside the CuTe layout the wgmma descriptors are built from (FoldSmemLayout) and
    compared on every element of the tile shapes the kernel uses; a planted swizzle slip (chunk index XOR 1,
    PLANT=16) must be reported, so the comparison can fail.
    """
    include = _cutlass_include()
    if include is None:
        pytest.skip("nvidia-cutlass headers not installed")
    src = tmp_path / "layout.cu"
    src.write_text(_LAYOUT_CHECK)
    results = {}
    for plant in ("0", "16"):
        exe = tmp_path / f"layout{plant}"
        cmd = ["nvcc", str(src), "-o", str(exe), "-std=c++17", "--expt-relaxed-constexpr", f"-DPLANT={plant}",
               f"-I{CSRC}", f"-I{include}"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        results[plant] = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    good, planted = results.values()
    assert good.returncode == 0, good.stdout
    assert planted.returncode != 0, "a planted extra mismatch was not reported"
