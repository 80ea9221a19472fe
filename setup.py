"""Build of gradsweep._C (csrc/*.cu with nvcc, csrc/*.cpp and the link with the host compiler) and of
gradsweep._fold_plan (csrc/host/fold_plan.cpp: the canonical fold's host planner, host compiler only).

The fold planner needs no CUDA: it is built wherever a C++ compiler is (every box that builds _C, and CPU boxes
without nvcc), and skipped with a warning where it fails, never failing the install (gradsweep/canonical.py
then plans in numpy: the same plans, tests/test_fold_plan_native.py).

Why not torch.utils.cpp_extension: the CPU machines and CI run a CPU-only torch that cannot link CUDA,
so the module is a plain pybind11 extension taking raw device pointers, with the CUDA runtime linked
statically (it imports on a machine without a driver and reports that through device_count()).
When nvcc is missing (or GRADSWEEP_SKIP_CUDA=1) the extension is skipped with a warning, never failing
the install: the cuda_bf16 profile then reports itself blocked.

Target flags: ``-gencode=arch=compute_90a,code=sm_90a`` is Hopper's arch-specific target (needed by any
wgmma / setmaxnreg kernel added later; the "a" image loads only on CC 9.0); ``compute_90,code=sm_90`` is
the plain Hopper image, so the kernels are also compiled (and checked) without any arch-specific feature.
``-fmad=false``: no compiler FMA contraction, so a 16-byte vector path and its scalar twin execute the same
IEEE operations (the kernels spell their FMAs explicitly).

CUTLASS: the Hopper GEMMs (csrc/*_sm90.cu) include CUTLASS 3.x / CuTe headers from the pinned
``nvidia-cutlass`` package (its ``cutlass_library/source/include``; ``GRADSWEEP_CUTLASS_INCLUDE`` overrides).
They are compiled for sm_90a only (wgmma has no plain-sm_90 form) and with ``-DNDEBUG`` (a device assert is a
call, and a call between wgmma instructions serialises them: ptxas warns C7510). Without the headers those
files are left out and ``GS_NO_SM90_GEMM`` makes the portable mma.sync kernels the only path (the module's
``sm90_gemm_built()`` says which build this is).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"
EXT_NAME = "gradsweep._C"
PLAN_EXT_NAME = "gradsweep._fold_plan"
PLAN_SOURCE = "csrc/host/fold_plan.cpp"
NVCC_FLAGS = [
    "-O3", "-std=c++17", "-fmad=false", "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_90,code=sm_90",
]
NVCC_SM90A_FLAGS = ["-O3", "-std=c++17", "-fmad=false", "--expt-relaxed-constexpr", "-DNDEBUG",
                    "-gencode=arch=compute_90a,code=sm_90a"]
CXX_FLAGS = ["-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-Wall"]
SM90_SUFFIX = "_sm90.cu"
# A reproducible build: the same sources and toolchain give the same bytes wherever the tree, the build directory
# and the headers live. nvcc names its intermediate host file after its process id (tmpxft_<pid>_...), which lands
# in the object's local symbols, so the link strips the symbol table (the module's exports are dynamic symbols);
# header paths in assert messages are mapped to fixed names, and cudafe++ is told each source's path inside the
# tree (it hashes that path into anonymous-namespace names, device code's included).
LINK_STRIP = "-s"


def prefix_maps(cutlass: Path | None = None) -> list[str]:
    """``-ffile-prefix-map`` flags naming the tree and the header directories (pybind11, Python, CUTLASS when
    given) by fixed labels (``__FILE__`` in the build's asserts). The tree comes first: where maps overlap
    (headers in a virtualenv inside the tree) the compiler takes the last match, so the header directories win."""
    import pybind11

    dirs = {"gradsweep": ROOT, "cutlass": cutlass, "pybind11": pybind11.get_include(),
            "python": sysconfig.get_paths()["include"]}
    return [f"-ffile-prefix-map={d}={label}" for label, d in dirs.items() if d]


def _first_line(cmd: list[str], pick: str = "") -> str:
    """The first output line of ``cmd`` containing ``pick`` ("" when the command fails)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return next((line.strip() for line in out.splitlines() if pick in line), "")


def toolchain(nvcc: str, cxx: str, cutlass: Path | None) -> str:
    """What a re-verifier needs to rebuild these bytes (the build is reproducible for one toolchain): nvcc's and
    the host compiler's versions, Python's, pybind11's and the CUTLASS headers' package (``build_info()``)."""
    from importlib import metadata

    import pybind11

    def pkg(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "none"

    nv = _first_line([nvcc, "--version"], "release").split(", ")[-1]
    return "; ".join([f"nvcc {nv or '?'}", f"host {_first_line([cxx, '--version']) or cxx}",
                      f"python {sys.version.split()[0]}", f"pybind11 {pybind11.__version__}",
                      f"nvidia-cutlass {pkg('nvidia-cutlass') if cutlass is not None else 'none'}"])


def cutlass_include() -> Path | None:
    """The CUTLASS / CuTe include directory of the installed ``nvidia-cutlass`` package (None when absent)."""
    override = os.environ.get("GRADSWEEP_CUTLASS_INCLUDE")
    candidates = [Path(override)] if override else []
    import importlib.util

    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "source" / "include" for p in spec.submodule_search_locations]
    for c in candidates:
        if (c / "cutlass" / "cutlass.h").is_file() and (c / "cute" / "tensor.hpp").is_file():
            return c
    return None


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME/bin, else PATH; None when absent."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def cudart_static_dir(nvcc: str) -> str | None:
    """Directory holding libcudart_static.a, asked of nvcc itself (its dry run lists its -L paths)."""
    candidates: list[str] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            home = os.environ[var]
            candidates += [os.path.join(home, d) for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
    try:
        out = subprocess.run([nvcc, "-dryrun", "-cudart", "static", "-o", "/dev/null", "x.o"],
                             capture_output=True, text=True, timeout=60)
        candidates += re.findall(r'-L"?([^"\s]+)"?', out.stdout + out.stderr)
    except (OSError, subprocess.SubprocessError):
        pass
    real = Path(nvcc).resolve().parent.parent
    candidates += [str(real / d) for d in ("lib64", "lib", "targets/x86_64-linux/lib")]
    candidates += ["/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/local/cuda/targets/x86_64-linux/lib"]
    for c in candidates:
        if (Path(c) / "libcudart_static.a").is_file():
            return str(Path(c).resolve())
    return None


def skip_reason() -> str | None:
    """Why the CUDA extension is not built here, or None when it is."""
    if os.environ.get("GRADSWEEP_SKIP_CUDA") == "1":
        return "GRADSWEEP_SKIP_CUDA=1"
    if find_nvcc() is None:
        return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    return None


class NvccBuildExt(build_ext):
    """Compiles .cu files with nvcc and .cpp files with the host compiler, links with the host compiler."""

    def finalize_options(self) -> None:
        super().finalize_options()
        reason = skip_reason()
        if reason is not None:
            warnings.warn(f"gradsweep: skipping the CUDA extension {EXT_NAME}: {reason}; "
                          "the cuda_bf16 profile will report itself blocked", stacklevel=1)
            print(f"WARNING: gradsweep: skipping {EXT_NAME}: {reason}", file=sys.stderr)
            self.extensions = [e for e in self.extensions if e.name != EXT_NAME]

    def build_extension(self, ext: Extension) -> None:
        if ext.name == PLAN_EXT_NAME:
            self._build_host(ext)
            return
        try:
            self._build(ext)
        except Exception as exc:  # a broken CUDA build must not break the install
            if os.environ.get("GRADSWEEP_REQUIRE_CUDA") == "1":
                raise
            warnings.warn(f"gradsweep: building {EXT_NAME} failed, skipping it: {exc}", stacklevel=1)
            print(f"WARNING: gradsweep: building {EXT_NAME} failed, skipping it "
                  f"(GRADSWEEP_REQUIRE_CUDA=1 makes this fatal): {exc}", file=sys.stderr)

    def _build_host(self, ext: Extension) -> None:
        """The fold planner with the host compiler (setuptools' own build); a failure warns and skips it."""
        try:
            import pybind11

            ext.include_dirs = [pybind11.get_include(), *ext.include_dirs]
            ext.extra_compile_args = ["-O3", "-std=c++17", "-fvisibility=hidden", "-Wall", *prefix_maps()]
            ext.extra_link_args = [LINK_STRIP]
            ext.language = "c++"
            super().build_extension(ext)
        except Exception as exc:  # the numpy planner gives the same plans: never fail the install for this
            warnings.warn(f"gradsweep: building {PLAN_EXT_NAME} failed, planning in numpy: {exc}", stacklevel=1)
            print(f"WARNING: gradsweep: building {PLAN_EXT_NAME} failed (planning in numpy): {exc}", file=sys.stderr)

    def _build(self, ext: Extension) -> None:
        nvcc = find_nvcc()
        assert nvcc is not None
        libdir = cudart_static_dir(nvcc)
        cxx = os.environ.get("CXX", "c++")
        tmp = Path(self.build_temp) / "gradsweep_csrc"
        tmp.mkdir(parents=True, exist_ok=True)
        import pybind11

        py_inc = sysconfig.get_paths()["include"]
        cutlass = cutlass_include()
        if cutlass is None:
            warnings.warn("gradsweep: nvidia-cutlass headers not found: building without the Hopper GEMMs "
                          "(pip install nvidia-cutlass==4.2.0.0)", stacklevel=1)
        defines = [] if cutlass is not None else ["-DGS_NO_SM90_GEMM"]
        maps = prefix_maps(cutlass)
        host_maps = [flag for m in maps for flag in ("-Xcompiler", m)]
        flags_str = " ".join(NVCC_FLAGS + defines)
        tools = toolchain(nvcc, cxx, cutlass)
        jobs: list[list[str]] = []
        objects: list[str] = []
        for src in (str(ROOT / s) for s in ext.sources):
            if src.endswith(SM90_SUFFIX) and cutlass is None:
                continue
            obj = str(tmp / (Path(src).name + ".o"))
            objects.append(obj)
            # cudafe++ names anonymous namespaces (device symbols too) after a hash of the source's absolute path:
            # given the path inside the tree, a build elsewhere names them alike
            in_tree = ["-Xcudafe", f"--orig_src_path_name={Path(src).relative_to(ROOT)}"]
            if src.endswith(SM90_SUFFIX):
                jobs.append([nvcc, "-c", src, "-o", obj, *NVCC_SM90A_FLAGS, "-Xcompiler", "-fPIC", *host_maps, *in_tree,
                             f"-I{CSRC}", f"-I{cutlass}"])
            elif src.endswith(".cu"):
                jobs.append([nvcc, "-c", src, "-o", obj, *NVCC_FLAGS, *defines, "-Xcompiler", "-fPIC", *host_maps,
                             *in_tree,
                             f"-I{CSRC}"])
            else:
                jobs.append([cxx, "-c", src, "-o", obj, *CXX_FLAGS, *maps, *defines, f"-I{CSRC}",
                             f"-I{pybind11.get_include()}", f"-I{py_inc}",
                             f'-DGS_BUILD_FLAGS="{flags_str}"', f'-DGS_TOOLCHAIN="{tools}"'])
        workers = max(1, min(len(jobs), os.cpu_count() or 1))
        with ThreadPoolExecutor(workers) as pool:
            for cmd, res in zip(jobs, pool.map(self._run, jobs)):
                if res.returncode != 0:
                    raise RuntimeError(f"gradsweep: compile failed: {' '.join(cmd)}\n"
                                       f"{res.stdout}{res.stderr}")
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        if libdir is not None:
            link = [cxx, "-shared", LINK_STRIP, "-o", str(out), *objects, f"-L{libdir}", "-lcudart_static",
                    "-lrt", "-lpthread", "-ldl", "-Wl,--exclude-libs,ALL"]
        else:  # nvcc knows where its own runtime lives
            link = [nvcc, "-shared", "-cudart", "static", "-Xlinker", "--strip-all", "-o", str(out), *objects]
        res = self._run(link)
        if res.returncode != 0:
            raise RuntimeError(f"gradsweep: link failed: {' '.join(link)}\n{res.stdout}{res.stderr}")

    @staticmethod
    def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        print(" ".join(cmd))
        return subprocess.run(cmd, capture_output=True, text=True)


def extensions() -> list[Extension]:
    """gradsweep._C from every source of csrc/ (sorted: a stable build), and the fold planner of csrc/host/."""
    out = [Extension(PLAN_EXT_NAME, sources=[PLAN_SOURCE], optional=True)] if (ROOT / PLAN_SOURCE).is_file() else []
    sources = sorted(str(p.relative_to(ROOT)) for p in CSRC.glob("*.cu"))
    sources += sorted(str(p.relative_to(ROOT)) for p in CSRC.glob("*.cpp"))
    if not sources:
        return out
    depends = sorted(str(p.relative_to(ROOT)) for p in CSRC.glob("*.*h"))
    return [Extension(EXT_NAME, sources=sources, optional=True, depends=depends), *out]


setup(ext_modules=extensions(), cmdclass={"build_ext": NvccBuildExt})
