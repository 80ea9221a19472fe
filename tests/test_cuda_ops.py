"""The CUDA family's ops of issue 10 (gradsweep.cuda_kernels: det_gemm, lm_head, linear_logp, logp,
batch_invariant_logp, embedding, qk_norm, pack).

- CPU: bad input fails with one-line ValueErrors; every new launcher is in the built extension (when built);
  the checks of bench/cuda_ops_check.py run through the production modules against a CPU stand-in of
  gradsweep._C (tests/fakes/cuda_ext.py), which exercises the Python glue (fold plans, carried rows, chunk
  loops, argument order) and proves the checks can fail (a planted fault goes red).
- GPU (``-m gpu``): the same checks on the real kernels, through the same production code path.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.cuda_kernels import runtime
from tests.fakes import cuda_ext

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = ("qk_norm_dw_tiles", "embedding_fwd", "embedding_fold", "pack_rows", "logp_fwd", "logp_bwd",
             "gemm_nt", "gemm_nn", "gemm_dw_fold", "llp_forward", "llp_dlogits")


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuda_ops_check", ROOT / "bench" / "cuda_ops_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


BENCH = _bench()
# The CPU stand-in computes GEMMs element by element in float64: the K=4096 row sweep and the widest
# vocabulary stay on the GPU, every other check runs here too.
_CPU_SKIP = ("det_gemm/rows/K4096N512", "linear_logp/K256V3000/invariance", "det_gemm/K512N256/invariance",
             "lm_head/K256V1000/invariance", "batch_invariant_logp/K256V1000/invariance")
CPU_CHECKS = [n for n in BENCH.CHECKS if n not in _CPU_SKIP]


@pytest.fixture
def fake_ext(monkeypatch: pytest.MonkeyPatch):
    ext = cuda_ext.install(monkeypatch)
    monkeypatch.setattr(BENCH, "DEV", "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reduction order for the stand-in's float64 sums
    yield ext
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", CPU_CHECKS)
def test_checks_on_cpu_stand_in(fake_ext, name: str) -> None:
    passed, detail = BENCH.CHECKS[name]()
    assert passed, detail


def test_checks_go_red_on_a_planted_fault(fake_ext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dW fold that ignores the loaded main grad, and one that folds a call's tiles in reverse, are caught."""
    real = fake_ext.gemm_dw_fold

    def no_load(plan, n_tiles, tile, dy, x, grad, N, K, ldy, ldx, ldg, device, stream):
        cuda_ext._rows(grad, N, K, ldg).zero_()
        real(plan, n_tiles, tile, dy, x, grad, N, K, ldy, ldx, ldg, device, stream)

    monkeypatch.setattr(fake_ext, "gemm_dw_fold", no_load)
    passed, detail = BENCH.CHECKS["det_gemm/K48N80/accuracy"]()
    assert not passed and "dW" in detail

    def reversed_tiles(plan, n_tiles, tile, dy, x, grad, N, K, ldy, ldx, ldg, device, stream):
        p = cuda_ext._t(plan).reshape(-1)[: n_tiles * tile].view(n_tiles, tile).flip(0).contiguous()
        real(cuda_ext._ptr(p), n_tiles, tile, dy, x, grad, N, K, ldy, ldx, ldg, device, stream)

    monkeypatch.setattr(fake_ext, "gemm_dw_fold", reversed_tiles)
    passed, detail = BENCH.CHECKS["det_gemm/K48N80/invariance"]()
    assert not passed and "main_grad" in detail


def test_checks_go_red_on_a_leaking_pad(fake_ext, monkeypatch: pytest.MonkeyPatch) -> None:
    """A logp whose rows see their neighbours (a batch-wide max) fails invariance."""
    real = fake_ext.logp_fwd

    def batch_max(logits, targets, out, lse, rows, vocab, ld, device, stream):
        real(logits, targets, out, lse, rows, vocab, ld, device, stream)
        z = cuda_ext._rows(logits, rows, vocab, ld).float()
        cuda_ext._t(out)[:rows] += torch.nan_to_num(z, nan=0.0, posinf=0.0, neginf=0.0).amax() * 1e-3

    monkeypatch.setattr(fake_ext, "logp_fwd", batch_max)
    passed, _ = BENCH.CHECKS["logp/V300/invariance"]()
    assert not passed


def test_launchers_are_built() -> None:
    try:
        ext = runtime.load()
    except ImportError:
        pytest.skip("gradsweep._C is not built here")
    missing = [n for n in LAUNCHERS if not hasattr(ext, n)]
    assert not missing, f"gradsweep._C lacks {missing}: rebuild (python setup.py build_ext --inplace)"
    assert int(ext.LLP_VCHUNK) % 128 == 0


def test_ops_reject_cpu_tensors_and_bad_shapes() -> None:
    from gradsweep.cuda_kernels import (
        batch_invariant_logp,
        embedding,
        gemm,
        linear_logp,
        lm_head,
        logp,
        pack,
        qk_norm,
    )

    x = torch.zeros(3, 8, dtype=torch.bfloat16)
    w = torch.zeros(5, 8, dtype=torch.bfloat16)
    t = torch.zeros(3, dtype=torch.int64)
    rows = RowIdentity.packed([3])
    for call in (lambda: gemm.det_linear(x, w, rows, None), lambda: lm_head.lm_head(x, w, rows, None),
                 lambda: linear_logp.linear_logp(x, w, t, rows, None), lambda: logp.selected_logp(x, t),
                 lambda: batch_invariant_logp.batch_invariant_logp(x, w, t, rows, None),
                 lambda: embedding.embedding(t, w, rows, None),
                 lambda: qk_norm.qk_norm(x.view(3, 1, 8), torch.ones(8, dtype=torch.bfloat16), 1e-6, rows, None),
                 lambda: pack.pack(x.view(1, 3, 8), torch.tensor([3]))):
        with pytest.raises(ValueError, match="CUDA tensor"):
            call()
    with pytest.raises(ValueError, match="do not match"):
        gemm.det_linear(x, torch.zeros(5, 7, dtype=torch.bfloat16), rows, None)
    with pytest.raises(ValueError, match="head_dim"):
        qk_norm.qk_norm(x.view(3, 1, 8), torch.ones(7, dtype=torch.bfloat16), 1e-6, rows, None)


def test_fold_required_on_cpu_stand_in(fake_ext) -> None:
    from gradsweep.cuda_kernels import embedding, gemm, linear_logp

    x = torch.ones(3, 16, dtype=torch.bfloat16)
    w = torch.ones(32, 16, dtype=torch.bfloat16, requires_grad=True)
    rows = RowIdentity.packed([3])
    with pytest.raises(ValueError, match="fold"):
        gemm.det_linear(x, w, rows, None)
    with pytest.raises(ValueError, match="fold"):
        linear_logp.linear_logp(x, w, torch.zeros(3, dtype=torch.int64), rows, None)
    with pytest.raises(ValueError, match="fold"):
        embedding.embedding(torch.zeros(3, dtype=torch.int64), w, rows, None)
    fold = CanonicalFold(torch.zeros(32, 16), [3], 40)  # 40 is not a multiple of 16
    y = gemm.det_linear(x, w, rows, fold)
    with pytest.raises(ValueError, match="multiple of 16"):
        y.backward(torch.ones_like(y))


# ----------------------------------------------------------------------------------------------- GPU
def _gpu_ready() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA in torch"
    return runtime.cuda_status()


_GPU_OK, _GPU_WHY = _gpu_ready()


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU_OK, reason=f"CUDA kernels cannot run here: {_GPU_WHY}")
@pytest.mark.parametrize("name", list(BENCH.CHECKS))
def test_gpu_check(name: str) -> None:
    passed, detail = BENCH.CHECKS[name]()
    assert passed, detail
