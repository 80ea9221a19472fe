"""Loading gradsweep._C, reporting whether it can run here, and the launch arguments of a tensor.

Why a status function that never raises: the harness must tell "not built" (blocked_c2) from "no
driver / no device / wrong SM" (blocked_hardware) without trying a kernel. ``_C.device_count()`` returns
the cudaError code of cudaGetDeviceCount instead of throwing (the CUDA runtime is linked statically, so
the module imports even where no driver exists).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

NOT_BUILT = "extension not built"
SUPPORTED_SM = ((9, 0),)  # the binary holds sm_90a and sm_90 images only

_ERR_STUB_LIBRARY = 34
_ERR_INSUFFICIENT_DRIVER = 35
_ERR_NO_DEVICE = 100


def load() -> ModuleType:
    """The compiled module; ImportError when it was not built."""
    return importlib.import_module("gradsweep._C")


def cuda_status() -> tuple[bool, str]:
    """(True, 'ok: <device name> sm_XY') when the kernels can run on the current device, else (False, why)."""
    try:
        ext = load()
    except ImportError as exc:
        return False, f"{NOT_BUILT}: cannot import gradsweep._C ({exc})"
    err, count = ext.device_count()
    if err == _ERR_INSUFFICIENT_DRIVER:
        return False, "no CUDA driver (cudaErrorInsufficientDriver, 35)"
    if err == _ERR_STUB_LIBRARY:
        return False, "no CUDA driver (cudaErrorStubLibrary, 34: only the stub libcuda is installed)"
    if err == _ERR_NO_DEVICE or (err == 0 and count == 0):
        return False, "no CUDA device (100)"
    if err != 0:
        return False, f"CUDA error: {ext.error_string(err)}"
    device = torch.cuda.current_device() if torch.cuda.is_available() else 0
    try:
        name, major, minor, _ = ext.device_info(device)
    except RuntimeError as exc:
        return False, f"CUDA error: {exc}"
    if (major, minor) not in SUPPORTED_SM:
        return False, (f"unsupported device {name} sm_{major}{minor}: "
                       "gradsweep._C is built for sm_90/sm_90a only")
    return True, f"ok: {name} sm_{major}{minor}"


def require() -> ModuleType:
    """The module, or a RuntimeError saying why the CUDA kernels cannot run."""
    ok, why = cuda_status()
    if not ok:
        raise RuntimeError(f"gradsweep CUDA kernels unavailable: {why}")
    return load()


_READY: ModuleType | None = None


def ext() -> ModuleType:
    """The module, checked once per process (ops call this on every launch)."""
    global _READY
    if _READY is None:
        _READY = require()
    return _READY


def check_tensor(name: str, t: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> None:
    """The kernels take CUDA tensors of one dtype only: say so instead of reading garbage."""
    if not isinstance(t, torch.Tensor) or not t.is_cuda:
        raise ValueError(f"{name}: expected a CUDA tensor, got {getattr(t, 'device', type(t))}")
    if t.dtype != dtype:
        raise ValueError(f"{name}: expected {dtype}, got {t.dtype}")


def _raw_stream_getter():
    """torch's raw current-stream lookup (what Triton's launcher calls): ~1 us, where building the
    ``torch.cuda.Stream`` object of ``current_stream()`` costs ~15 us on every launch; the public call where a
    torch build lacks it."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


_RAW_STREAM = _raw_stream_getter()


def launch(t: torch.Tensor) -> tuple[int, int]:
    """(device index, raw stream handle) for a launch on t's device and torch's current stream there.

    ``get_device()`` is the index as an int (a CUDA tensor's is never -1); ``t.device`` would build a
    ``torch.device`` object (twice here before), host time paid on every launch."""
    index = t.get_device()
    if index < 0:
        raise ValueError(f"a CUDA kernel got a tensor on {t.device}; its arguments must be on the GPU")
    return index, int(_RAW_STREAM(index))


def like(t: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t as a contiguous ``dtype`` tensor on other's device: t itself when it already is one (a fold's plan
    usually is; the checks cost less host time than ``.to(...).contiguous()`` on a tensor that needs nothing)."""
    if t.dtype == dtype and t.get_device() == other.get_device() and t.is_contiguous():
        return t
    return t.to(device=other.device, dtype=dtype).contiguous()


def ptr(t: torch.Tensor | None) -> int:
    """Raw device address (0 for None)."""
    return 0 if t is None else int(t.data_ptr())
