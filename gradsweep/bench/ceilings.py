"""The run's own ceilings, measured in the same run as the cases: device-to-device copy bandwidth and the
cuBLAS bf16 GEMM rate. Fractions of them (``copy_fraction``, ``gemm_fraction``) compare a kernel with what
this very GPU did, not with a datasheet."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from gradsweep.bench.timing import Timer, Timing

if TYPE_CHECKING:
    import torch


class Ceiling(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float
    unit: str
    what: str
    timing: Timing


class Ceilings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    copy_bandwidth: Ceiling
    gemm_rate: Ceiling

    @property
    def copy_gbps(self) -> float:
        return self.copy_bandwidth.value

    @property
    def gemm_tflops(self) -> float:
        return self.gemm_rate.value


def measure_ceilings(timer: Timer, device: torch.device, quick: bool) -> Ceilings:
    """A 1 GiB copy (8 MiB in --quick) and an n^3 bf16 product (n = 8192; 256 in --quick)."""
    import torch

    elements = (1 << 22) if quick else (1 << 29)
    src = torch.empty(elements, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = timer.e2e([lambda: dst.copy_(src)])
    moved = 2 * elements * 2  # bytes read + written
    src = dst = None  # free the 2 GiB before the product
    n = 256 if quick else 8192
    gen = torch.Generator(device=device).manual_seed(90)
    a = torch.randn(n, n, generator=gen, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, generator=gen, device=device).to(torch.bfloat16)
    t_mm = timer.e2e([lambda: a @ b])
    return Ceilings(
        copy_bandwidth=Ceiling(value=moved / t_copy.median_ms / 1e6, unit="GB/s", timing=t_copy,
                     what=f"device-to-device copy of {elements * 2 / 2**20:.0f} MiB (bytes read + written)"),
        gemm_rate=Ceiling(value=2 * n**3 / t_mm.median_ms / 1e9, unit="TFLOP/s", timing=t_mm,
                     what=f"cuBLAS bf16 {n}x{n}x{n} product (torch.matmul)"))
