"""Whether a csrc/ change altered the machine code: the SASS of translation units compiled from two trees, compared
kernel by kernel (a CPU-box check for refactors that claim "same instructions, same bits"; needs nvcc, and
cuobjdump on PATH or in triton's bundled tools).

    python scripts/sass_compare.py OLD_TREE NEW_TREE --tu attention_fwd --tu attention_dq

Each kernel is compared after register names (R, UR, P, UP) and immediates are normalised away (a change of
schedule or register allocation alone is not a change of arithmetic): ``identical`` then means the same
instruction sequence; otherwise the opcodes added and removed are listed, so a reader sees whether any
floating-point or tensor-core instruction moved (those carry the bits) or only integer / address set-up did.
Compiled for sm_90a with the extension's own nvcc flags and CUTLASS include (setup.py).
"""

from __future__ import annotations

import argparse
import ast
import collections
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_FUNCTION = re.compile(r"\s+Function : (\S+)")
_INSTRUCTION = re.compile(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?);")


def build_setup() -> tuple[str, list[str]]:
    """(nvcc, the sm_90a flags) as setup.py finds and uses them: its definitions run without its final
    ``setup(...)`` call (importing it would run the build)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    tree.body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call))]
    ns: dict = {"__file__": str(ROOT / "setup.py"), "__name__": "gradsweep_setup"}
    exec(compile(tree, str(ROOT / "setup.py"), "exec"), ns)
    nvcc = ns["find_nvcc"]()
    if nvcc is None:
        raise SystemExit("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    cutlass = ns["cutlass_include"]()  # the Hopper GEMM units (*_sm90.cu) include CUTLASS / CuTe
    return nvcc, list(ns["NVCC_SM90A_FLAGS"]) + ([f"-I{cutlass}"] if cutlass is not None else [])


def cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        raise SystemExit("cuobjdump not found (PATH, or triton's backends/nvidia/bin)") from None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not bundled.is_file():
        raise SystemExit("cuobjdump not found (PATH, or triton's backends/nvidia/bin)")
    return str(bundled)


def kernel_name(mangled: str) -> str:
    """A kernel's name as both trees spell it: the anonymous namespace's hash (``_GLOBAL__N__<hex>_``) follows the
    file's path and contents, so the same kernel of an edited file would otherwise look removed and added."""
    return re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__", mangled)


def normalise(instruction: str) -> str:
    """An instruction without its register names and immediates."""
    out = re.sub(r"\bU?R\d+\b", "R", instruction)
    out = re.sub(r"\bU?P\d\b", "P", out)
    return re.sub(r"0x[0-9a-f]+", "X", out)


def kernels(tree: Path, tu: str, work: Path, tools: tuple[str, list[str], str]) -> dict[str, list[str]]:
    """Normalised SASS of every kernel of csrc/<tu>.cu in ``tree``; ``tools``: (nvcc, its flags, cuobjdump)."""
    nvcc, flags, objdump = tools
    cubin = work / f"{tu}.cubin"
    subprocess.run([nvcc, "-cubin", *flags, "-I", str(tree / "csrc"), str(tree / "csrc" / f"{tu}.cu"),
                    "-o", str(cubin)], check=True)
    sass = subprocess.run([objdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
    out: dict[str, list[str]] = {}
    current = None
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = out.setdefault(kernel_name(m.group(1)), [])
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            current.append(normalise(m.group(1)))
    return out


def compare(old: dict[str, list[str]], new: dict[str, list[str]]) -> list[str]:
    lines = []
    for name in sorted(old.keys() | new.keys()):
        a, b = old.get(name), new.get(name)
        if a is None or b is None:
            lines.append(f"{name}: only in the {'new' if a is None else 'old'} tree")
        elif a == b:
            lines.append(f"{name}: identical ({len(a)} instructions)")
        else:
            ca = collections.Counter(i.split()[0] for i in a)
            cb = collections.Counter(i.split()[0] for i in b)
            lines.append(f"{name}: {len(a)} -> {len(b)} instructions; opcodes added {dict(cb - ca)}, "
                         f"removed {dict(ca - cb)}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--tu", action="append", required=True, help="a translation unit of csrc/, e.g. attention_fwd")
    args = ap.parse_args()
    tools = (*build_setup(), cuobjdump())
    with tempfile.TemporaryDirectory() as tmp:
        work_old, work_new = Path(tmp) / "old", Path(tmp) / "new"
        work_old.mkdir()
        work_new.mkdir()
        for tu in args.tu:
            old = kernels(args.old.resolve(), tu, work_old, tools)
            new = kernels(args.new.resolve(), tu, work_new, tools)
            print(f"== csrc/{tu}.cu")
            for line in compare(old, new):
                print("  " + line)


if __name__ == "__main__":
    main()
