"""Shared test helpers: small manifests written to a temp dir; the refusals both attention APIs share; a script run
in a clean process with compiled kernels (the GPU tests); a real kernel's candidate with a planted defect."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gradsweep import canonical
from gradsweep.canonical import RowIdentity
from gradsweep.manifest import MANIFEST_DIR, load_manifest
from gradsweep.ops.base import CallContext, CallOutput, Candidate
from gradsweep.ops.registry import get_op
from tests.fakes.helpers import REPO


def run_clean(argv: list[str], timeout: float, drop: tuple[str, ...] = ("TRITON_INTERPRET",),
              env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python *argv`` from the repository root in a fresh process without ``drop``'s variables (so Triton takes
    its GPU code paths instead of interpreting: TRITON_INTERPRET is read when a kernel is decorated), plus ``env``;
    the caller checks the output."""
    run_env = {k: v for k, v in os.environ.items() if k not in drop} | dict(env or {})
    return subprocess.run([sys.executable, *argv], env=run_env, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


def run_compiled(script: str, timeout: float, drop: tuple[str, ...] = ("TRITON_INTERPRET",),
                 env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -c script`` through ``run_clean`` (the GPU tests); the caller checks the output for its own marker."""
    return run_clean(["-c", script], timeout, drop, env)


LENGTHS = [37, 5, 64, 1, 23]
CHUNKS = [[20, 17], [2, 3], [1, 30, 33], [1], [10, 6, 7]]
LAYOUTS = {"bn_full": {}, "bn_chunked": {"chunks": CHUNKS}, "b1_singleton": {}, "bn_padded_right": {},
           "bn_padded_left": {}, "bn_permuted": {"order": [3, 0, 4, 2, 1]},
           "bn_mask_density": {"filler_lengths": [9, 16, 3]}, "bn_neighbors": {"groups": [[2, 0], [1, 3], [4]]},
           "prefix_cache": {"prefix": [20, 2, 1, 1, 10]}, "decode": {}}


def planted_manifest_dict(impl: str, **extra) -> dict:
    data = {
        "manifest_version": 1, "name": "planted", "contract": str(MANIFEST_DIR / "contract.yaml"), "seed": 7,
        "plugins": ["tests.planted_ops"], "samples": {"lengths": LENGTHS}, "layouts": LAYOUTS,
        "ops": {"planted_rowsum": {"shape": {"features": 256}}},
        "profiles": {"planted": {"family": "torch", "device": "cpu",
                                 "candidates": {"planted_rowsum": {"impl": impl}}}},
    }
    data.update(extra)
    return data


def write_manifest(tmp_path: Path, data: dict, name: str = "m.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def load_dict(tmp_path: Path, data: dict):
    return load_manifest(write_manifest(tmp_path, data), allow_plugins=True)  # planted ops are plugins


def check_attention_cache_refusals(attn, q, k, v) -> None:
    """The refusals both families' attention APIs share (``attn``: gradsweep.{triton,cuda}_kernels.attention),
    on a cache of samples [8, 4], 2 query heads over 1 K/V head, head_dim 32, and bf16 q / k / v of 2 rows: a
    row whose key slot was never written, a slot written twice, a position outside its sample, a fold finished
    before every token's backward, and a query-head count that is no multiple of the K/V heads."""
    cache = attn.AttentionCache([8, 4], 2, 32, "cpu", kv_heads=1)
    with pytest.raises(ValueError, match="never written"):
        attn.attention(q, k, v, RowIdentity.packed([2], [0], [3]), cache)
    attn.attention(q, k, v, RowIdentity.packed([2], [0], [0]), cache)
    with pytest.raises(ValueError, match="written twice"):
        attn.attention(q, k, v, RowIdentity.packed([2], [0], [1]), cache)
    with pytest.raises(ValueError, match="outside its sample"):
        attn.attention(q, k, v, RowIdentity.packed([2], [1], [3]), cache)
    with pytest.raises(ValueError, match="never reached the backward"):
        cache.finish()
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        attn.AttentionCache([4], 3, 32, "cpu", kv_heads=2)


@contextmanager
def seeing_fold_uploads(see: Callable[[np.ndarray], None]) -> Iterator[None]:
    """Every host array the canonical fold uploads (staging copy indices, descriptors, row tables), shown to
    ``see`` in upload order while the block runs (the fold's plan tests pin or hash them)."""
    real, real_parts = canonical.upload, canonical.upload_parts

    def upload(a: np.ndarray, device: torch.device) -> torch.Tensor:
        see(np.array(a))
        return real(a, device)

    def upload_parts(parts, device: torch.device) -> list[torch.Tensor]:
        for a in parts:  # one pinned copy on a GPU, but every array is shown, in order
            see(np.array(a))
        return real_parts(parts, device)

    canonical.upload, canonical.upload_parts = upload, upload_parts
    try:
        yield
    finally:
        canonical.upload, canonical.upload_parts = real, real_parts


def planted_candidate(op: str, impl: str, run: Callable[[Candidate, CallContext], CallOutput],
                      name: str | None = None) -> Candidate:
    """The real candidate ``impl`` of ``op`` with its run replaced by ``run(real, ctx)``: a planted defect (or a spy)
    keeps the real kernel's family, parameter gradients and fold tiles, so the harness judges it as it judges the
    real one and only the planted behaviour differs."""
    real = get_op(op).candidates[impl]
    return Candidate(name or f"{impl}_planted", real.family, lambda ctx: run(real, ctx),
                     param_grads=real.param_grads, fold_tiles=real.fold_tiles)
