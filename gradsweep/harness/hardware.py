"""Which requirements of a profile this box meets; a missing one blocks the cell, never a fallback."""

from __future__ import annotations

import os

import torch

from gradsweep.results import Status


def _cuda_ok() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA GPU visible to torch on this box"
    return True, "ok"


def _sm90_ok() -> tuple[bool, str]:
    ok, why = _cuda_ok()
    if not ok:
        return ok, why
    cap = torch.cuda.get_device_capability()
    return (cap == (9, 0), "ok" if cap == (9, 0) else f"needs sm_90, this GPU is sm_{cap[0]}{cap[1]}")


def _triton_ok() -> tuple[bool, str]:
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return False, f"triton is not installed ({exc})"
    return True, "ok"


def _interpret_ok() -> tuple[bool, str]:
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False, "TRITON_INTERPRET=1 is not set in this worker (the profile's env must set it)"
    return True, "ok"


def _cuda_ext_ok() -> tuple[bool, str]:
    from gradsweep.cuda_kernels.runtime import cuda_status

    return cuda_status()


_CHECKS = {"cuda": _cuda_ok, "cuda-sm90": _sm90_ok, "triton": _triton_ok, "triton-interpret": _interpret_ok,
           "cuda-ext": _cuda_ext_ok}


def check_requirements(requires: list[str]) -> tuple[Status, str] | None:
    """None when every requirement holds, else (blocked status, reason)."""
    for req in requires:
        ok, why = _CHECKS[req]()
        if not ok:
            status = Status.BLOCKED_C2 if "not built" in why else Status.BLOCKED_HARDWARE
            return status, f"{req}: {why}"
    return None


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
