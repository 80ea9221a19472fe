"""The CUDA family: a real nvcc build of csrc/ (CPU, CI) and, on a CUDA box, its GPU checks.

The build test compiles gradsweep._C from this tree into a temporary directory (the shipped flags, both
Hopper targets), imports that copy, and checks what cuda_status() says: on a GPU-less box a driver/device
reason, on a CUDA box 'ok'. The family's GPU checks (every op through ``check_kernel``, the contract's bounds,
bitwise invariance) live in tests/test_cuda_ops.py.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from gradsweep.cuda_kernels import runtime
from tests.cuda_gpu import needs_cuda_kernels

ROOT = Path(__file__).resolve().parents[1]


def _load_built(lib_dir: Path) -> ModuleType:
    found = sorted(lib_dir.glob("gradsweep/_C*.so"))
    assert found, f"no gradsweep/_C*.so under {lib_dir}"
    spec = importlib.util.spec_from_file_location("gradsweep._C", found[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"), reason="nvcc not found")
def test_nvcc_build_and_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = dict(os.environ, GRADSWEEP_REQUIRE_CUDA="1")
    env.pop("GRADSWEEP_SKIP_CUDA", None)
    cmd = [sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path / "lib"),
           "--build-temp", str(tmp_path / "tmp")]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"build failed:\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    ext = _load_built(tmp_path / "lib")
    launchers = ("rms_norm_fwd", "silu_fwd", "rope", "qk_norm_dw_tiles", "embedding_fwd", "embedding_fold",
                 "pack_rows", "logp_fwd", "logp_bwd", "gemm_nt", "gemm_nn", "gemm_dw_fold", "llp_forward",
                 "llp_dlogits", "copy_pieces")
    assert not [n for n in launchers if not hasattr(ext, n)], "a launcher is missing from the fresh build"

    err, count = ext.device_count()  # never raises, even without a driver
    assert isinstance(err, int) and isinstance(count, int)
    info = ext.build_info()
    assert info["cudart"] == "static" and "900" in info["arch_list"]
    assert "sm_90a" in info["nvcc_flags"] and "code=sm_90" in info["nvcc_flags"]
    # the toolchain that rebuilds these bytes, recorded in every sweep's provenance (cuda_extension)
    for tool in ("nvcc V", "host ", "python 3.", "pybind11 ", "nvidia-cutlass 4.2.0.0"):
        assert tool in info["toolchain"], (tool, info["toolchain"])
    # setup.sh installs the nvidia-cutlass headers: a build here must carry the Hopper GEMMs
    assert info["sm90_gemm"] is True, "built without the CUTLASS headers (pip install nvidia-cutlass==4.2.0.0)"
    assert "cudaErrorInsufficientDriver" in ext.error_string(35)
    # A TMA descriptor the driver would not encode stops a CUTLASS GEMM before its launch, and says so.
    says = ext.error_string(ext.tma_encode_error() + 201)
    assert "cuTensorMapEncodeTiled returned CUresult 201" in says and "nothing was launched" in says
    # The fold launcher refuses bad arguments by name before it touches a device (null pointers never read).
    fold_args = dict(plan=0, n_tiles=1, tile=64, dy=0, x=0, grad=0, rows=64, N=16, K=16, ldy=16, ldx=16, ldg=16,
                     device=0, stream=0)
    for field, bad, says in (("rows", -1, "rows"), ("tile", 40, "multiple of 16"), ("ldx", 8, "leading"),
                             ("path", 3, "path")):
        with pytest.raises(ValueError, match=says):
            ext.gemm_dw_fold(**{**fold_args, field: bad})

    _same_bytes_as_the_installed_build(tmp_path / "lib")

    monkeypatch.setitem(sys.modules, "gradsweep._C", ext)
    ok, why = runtime.cuda_status()
    if torch.cuda.is_available():
        assert ok and why.startswith("ok: "), why
    elif ok:
        assert why.startswith("ok: ")  # a CPU-only torch on a GPU box: the module still sees the device
    else:
        assert why.startswith(("no CUDA driver", "no CUDA device")), why
        with pytest.raises(RuntimeError, match="unavailable"):
            runtime.require()
        with pytest.raises(RuntimeError, match=r"gradsweep\._C\.device_info"):
            ext.device_info(0)


def _inputs_mtime() -> float:
    """The newest input of a build: csrc/ and setup.py."""
    return max(p.stat().st_mtime for p in [ROOT / "setup.py", *(ROOT / "csrc").rglob("*")] if p.is_file())


def _same_bytes_as_the_installed_build(lib_dir: Path) -> None:
    """A reproducible build (setup.py's LINK_STRIP, prefix maps, cudafe++'s source path): this fresh build, made
    in another build directory, has the bytes of the checkout's own build of the same inputs (CI: setup.sh's
    editable install, minutes earlier). That is what lets ``gradsweep verify`` compare a re-verifier's build with
    the evidence's without ``--allow-other-build`` when the toolchain is the same. Skipped where the checkout's
    build is older than its inputs (a developer's stale build)."""
    import hashlib

    newest_input = _inputs_mtime()
    for name in ("_C", "_fold_plan"):
        fresh = sorted(lib_dir.glob(f"gradsweep/{name}.cpython-*.so"))
        installed = sorted((ROOT / "gradsweep").glob(fresh[0].name)) if fresh else []
        if not fresh or not installed or installed[0].stat().st_mtime < newest_input:
            continue
        digests = [hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in (fresh[0], installed[0])]
        assert digests[0] == digests[1], (f"{name}: two builds of the same inputs differ ({digests[0]} in "
                                          f"{fresh[0].parent}, {digests[1]} in the checkout): the build is not "
                                          "reproducible (setup.py)")


def test_the_reproducibility_check_can_fail(tmp_path: Path) -> None:
    """Planted: a "fresh build" one byte off the checkout's own is refused (the check above is not vacuous)."""
    installed = sorted((ROOT / "gradsweep").glob("_C.cpython-*.so"))
    if not installed or installed[0].stat().st_mtime < _inputs_mtime():
        pytest.skip("no build of these inputs in the checkout")
    fake = tmp_path / "gradsweep" / installed[0].name
    fake.parent.mkdir()
    fake.write_bytes(installed[0].read_bytes() + b"\0")
    with pytest.raises(AssertionError, match="not reproducible"):
        _same_bytes_as_the_installed_build(tmp_path)
    fake.write_bytes(installed[0].read_bytes())
    _same_bytes_as_the_installed_build(tmp_path)


def test_status_reports_not_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gradsweep._C", None)  # import of gradsweep._C raises ImportError
    ok, why = runtime.cuda_status()
    assert not ok and why.startswith(runtime.NOT_BUILT)


def test_ops_reject_cpu_tensors() -> None:
    from gradsweep.cuda_kernels import rms_norm, rope, silu, swiglu

    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA tensor"):
        silu.silu(x)
    with pytest.raises(ValueError, match="CUDA tensor"):
        swiglu.swiglu(x, x)
    with pytest.raises(ValueError, match="CUDA tensor"):
        rope.rope(x.view(2, 1, 8), torch.zeros(2, dtype=torch.int64), 10000.0)
    with pytest.raises(ValueError, match="CUDA tensor"):
        rms_norm.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), 1e-6, None, None)


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_fold_required() -> None:
    from gradsweep.cuda_kernels import rms_norm

    x = torch.zeros(2, 8, dtype=torch.bfloat16, device="cuda")
    w = torch.ones(8, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    with pytest.raises(ValueError, match="fold is None"):
        rms_norm.rms_norm(x, w, 1e-6, None, None)
