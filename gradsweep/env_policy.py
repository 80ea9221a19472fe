"""Which environment variables a manifest profile may set in its workers (manifests are data), and reading
a profile's env from the raw file before anything is imported (``check`` and ``drift`` apply it first).

A profile's ``env`` is applied in the worker before anything is imported, in the processes that
hold results which get signed. A variable that points the interpreter, the dynamic loader or a
compiler at other code (PYTHONPATH, LD_PRELOAD, TRITON_CACHE_DIR, ...) would let a manifest run code,
so only these are allowed:

- ``TRITON_*``: Triton's switches (TRITON_INTERPRET, TRITON_ALWAYS_COMPILE, ...);
- ``CUDA_*``: CUDA runtime switches (CUDA_VISIBLE_DEVICES, CUDA_LAUNCH_BLOCKING, CUDA_MODULE_LOADING);
- ``GRADSWEEP_*``: gradsweep's own switches;
- ``CUBLAS_WORKSPACE_CONFIG`` and ``NVIDIA_TF32_OVERRIDE``: they change stock torch's GEMM determinism
  and precision, which the torch_bf16 profile exists to show;
- ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``: host BLAS threading.

and, even under those prefixes, no name that names a location or a code hook (``*PATH*``, ``*DIR*``,
``*HOME*``, ``*LIB*``, ``*MANAGER*``, ``*PLUGIN*``, ``*HOOK*``), nor gradsweep's own code or key
selectors (GRADSWEEP_CELL_FN, GRADSWEEP_MANIFEST_LOADER, GRADSWEEP_KEY).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gradsweep.errors import BadInput

ALLOWED_PREFIXES: tuple[str, ...] = ("TRITON_", "CUDA_", "GRADSWEEP_")
ALLOWED_NAMES: frozenset[str] = frozenset({
    "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
})
_CODE_OR_LOCATION = re.compile(r"PATH|DIR|HOME|LIB|MANAGER|PLUGIN|HOOK")
REFUSED_NAMES: frozenset[str] = frozenset({"GRADSWEEP_CELL_FN", "GRADSWEEP_MANIFEST_LOADER", "GRADSWEEP_KEY"})


def env_problem(name: str) -> str | None:
    """Why a profile may not set ``name`` (None when it may)."""
    if name in REFUSED_NAMES or _CODE_OR_LOCATION.search(name):
        return f"{name} selects code, a key or a location, which a manifest may not do"
    if name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES):
        return None
    return f"{name} is not allowed (allowed: {', '.join(p + '*' for p in ALLOWED_PREFIXES)}, " \
           f"{', '.join(sorted(ALLOWED_NAMES))})"


def check_profile_env(env: dict[str, str]) -> None:
    """Raise ValueError (one line) on the first variable a profile may not set."""
    for name in env:
        problem = env_problem(str(name))
        if problem is not None:
            raise ValueError(f"{problem}; see docs/manifests.md")


def raw_profile_env(path: Path, profile: str) -> dict[str, str]:
    """A profile's env from the raw YAML, refused (BadInput) if a name is not allowlisted."""
    try:
        data = yaml.safe_load(path.read_text())
        env = data["profiles"][profile].get("env") or {}
        env = {str(k): str(v) for k, v in env.items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return {}  # the loader reports what is wrong with the file
    try:
        check_profile_env(env)
    except ValueError as exc:
        raise BadInput(f"manifest {path}: field 'profiles.{profile}.env': {exc}") from None
    return env
