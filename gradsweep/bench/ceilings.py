"""The run's own ceilings, measured in the same run as the cases: device-to-device copy bandwidth and the
cuBLAS bf16 GEMM rate. Fractions of them (``copy_fraction``, ``gemm_fraction``) compare a kernel with what
this very GPU did, not with a datasheet.

Two host figures beside them, for reading host-bound rows across runs (they judge nothing): the lent boxes' hosts
differ, and a step whose host / e2e is ~1.00x follows its host more than its code (the CUDA rms_norm backward,
unchanged code, ran 1.92x, 1.33x and 0.67x torch on three boxes). ``host_launch``: one stock torch launch end to
end (an in-place add on a one-element tensor: dispatch and launch, no device work to wait for); ``host_python``:
a fixed pure-Python loop (the interpreter speed that the Triton family's host glue runs at).

Two autograd figures, the floor under every ``bwd`` row: a backward through one stock node (``x.view_as(x)``,
``ViewBackward``) and through one Python ``torch.autograd.Function`` that does nothing (its backward returns the
gradient it gets), each a forward and ``torch.autograd.grad`` end to end, no kernel either way. Every family's
backward is a Python Function (the CUDA family's too: ``_C`` is a plain pybind11 module, it cannot register a C++
autograd node), so their difference is what any backward of ours pays before its first line runs, on the
engine thread the run's backwards use (measured inside the bench's ``set_multithreading_enabled``: on the device
thread the GIL and the thread hand-off are in it)."""

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
    host_launch: Ceiling | None = None  # absent in evidence written before the host figures
    host_python: Ceiling | None = None
    host_autograd_stock: Ceiling | None = None  # absent in evidence written before the autograd figures
    host_autograd_python: Ceiling | None = None

    def host_text(self) -> str:
        """``"; host: torch launch 4.1 us, Python loop 2.0 us"``, or "" where the run has no host figures."""
        if self.host_launch is None or self.host_python is None:
            return ""
        text = f"; host: torch launch {self.host_launch.value:.1f} us, Python loop {self.host_python.value:.1f} us"
        if self.host_autograd_stock is not None and self.host_autograd_python is not None:
            text += (f", a backward through one stock node {self.host_autograd_stock.value:.1f} us / one Python "
                     f"Function {self.host_autograd_python.value:.1f} us")
        return text

    @property
    def copy_gbps(self) -> float:
        return self.copy_bandwidth.value

    @property
    def gemm_tflops(self) -> float:
        return self.gemm_rate.value


def measure_ceilings(timer: Timer, device: torch.device, quick: bool) -> Ceilings:
    """A 1 GiB copy (8 MiB in --quick) and an n^3 bf16 product (n = 8192; 256 in --quick), then the host figures
    (the autograd pair on whichever engine thread the caller's ``set_multithreading_enabled`` chose)."""
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
    tiny = torch.zeros(1, device=device)
    t_launch = timer.e2e([lambda: tiny.add_(1)])
    t_python = timer.host(_python_loop)  # the timers' own host clock: warm-up, samples from the budget
    leaf = torch.zeros(8, device=device, requires_grad=True)
    upstream = torch.ones(8, device=device)
    t_stock = timer.e2e([lambda: torch.autograd.grad([leaf.view_as(leaf)], [leaf], [upstream])])
    node = _passthrough_node()
    t_node = timer.e2e([lambda: torch.autograd.grad([node.apply(leaf)], [leaf], [upstream])])
    return Ceilings(
        copy_bandwidth=Ceiling(value=moved / t_copy.median_ms / 1e6, unit="GB/s", timing=t_copy,
                     what=f"device-to-device copy of {elements * 2 / 2**20:.0f} MiB (bytes read + written)"),
        gemm_rate=Ceiling(value=2 * n**3 / t_mm.median_ms / 1e9, unit="TFLOP/s", timing=t_mm,
                     what=f"cuBLAS bf16 {n}x{n}x{n} product (torch.matmul)"),
        host_launch=Ceiling(value=t_launch.median_ms * 1e3, unit="us", timing=t_launch,
                            what="one stock torch launch end to end (in-place add on a one-element tensor)"),
        host_python=Ceiling(value=t_python.median_ms * 1e3, unit="us", timing=t_python,
                            what=f"a fixed pure-Python loop ({PYTHON_LOOP} iterations of attribute, dict and "
                                 "tuple work)"),
        host_autograd_stock=Ceiling(value=t_stock.median_ms * 1e3, unit="us", timing=t_stock,
                                    what="forward and torch.autograd.grad through one stock node (x.view_as(x)), "
                                         "end to end, no kernel"),
        host_autograd_python=Ceiling(value=t_node.median_ms * 1e3, unit="us", timing=t_node,
                                     what="forward and torch.autograd.grad through one Python autograd.Function "
                                          "whose backward returns its gradient, end to end, no kernel"))


PYTHON_LOOP = 200


def _passthrough_node() -> type:
    """The no-op Python autograd node (a class made on call: this module imports torch lazily)."""
    import torch

    class Passthrough(torch.autograd.Function):
        """y = x (a view); dx = dy: a Python node that does no work of its own."""

        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            return x.view_as(x)

        @staticmethod
        def backward(ctx, dy):  # type: ignore[override]
            return dy
    return Passthrough


class _Probe:
    __slots__ = ("a", "b")

    def __init__(self) -> None:
        self.a, self.b = 1, 2


def _python_loop() -> int:
    """Attribute reads, a dict lookup and a small tuple per iteration: the shape of a launch's host glue."""
    probe, table, acc = _Probe(), {"k": 3}, 0
    for i in range(PYTHON_LOOP):
        key = (probe.a, i & 7, probe.b)
        acc += table.get("k", 0) + key[1]
    return acc
