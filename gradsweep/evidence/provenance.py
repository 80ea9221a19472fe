"""Where and with what a sweep ran, measured by the run itself: every field is queried, never assumed.

A value that cannot be queried (no GPU, no git, no nvidia-smi) is recorded as null.
"""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from gradsweep.evidence.host_facts import blas_facts, cpu_model


class Provenance(BaseModel):
    """The machine and software stack of one run."""

    model_config = ConfigDict(extra="forbid")
    host: str
    platform: str
    cpu_model: str | None = None
    blas: dict[str, str | int | float | bool | None] | None = None
    python: str
    gradsweep: str | None = None
    torch: str | None = None
    triton: str | None = None
    cuda_available: bool = False
    cuda_runtime: str | None = None
    gpu_name: str | None = None
    gpu_count: int = 0
    sm: str | None = None
    driver: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None
    cuda_extension: dict[str, object] | None = None


def _extension_build() -> dict[str, object] | None:
    """Build facts of gradsweep._C as compiled (nvcc flags, arch list, cudart), or None if not built."""
    try:
        from gradsweep import _C  # type: ignore[attr-defined]
    except ImportError:
        return None
    return {str(k): (v if isinstance(v, (int, str)) else str(v)) for k, v in dict(_C.build_info()).items()}


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def gpu_names(indices: list[int]) -> list[str] | None:
    """The names of these GPUs (CUDA indices as nvidia-smi numbers them), in order; [] for none; None where
    nvidia-smi cannot say. A resumed sweep must run on the same cards as its finished cells (their verdicts and
    times were reached there, and the evidence names one device), and asking nvidia-smi leaves CUDA untouched
    in the sweep's parent process."""
    if not indices:
        return []
    listed = _run(["nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader"])
    if listed is None:
        return None
    names = {}
    for line in listed.splitlines():
        index, _, name = line.partition(",")
        if index.strip().isdigit():
            names[int(index)] = name.strip()
    return [names.get(i, "?") for i in indices]


def git_state(root: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, whether the work tree differs from it); (None, None) outside a git checkout."""
    commit = _run(["git", "rev-parse", "--verify", "HEAD"], cwd=root)
    if commit is None:
        return None, None
    status = _run(["git", "status", "--porcelain", "--untracked-files=normal"], cwd=root)
    return commit, (None if status is None else bool(status))


def _torch_facts() -> dict[str, object]:
    try:
        import torch
    except ImportError:
        return {}
    facts: dict[str, object] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda}
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        major, minor = torch.cuda.get_device_capability(0)
        facts.update(cuda_available=True, gpu_count=count, gpu_name=torch.cuda.get_device_name(0),
                     sm=f"sm_{major}{minor}")
        driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        facts["driver"] = driver.splitlines()[0].strip() if driver else None
    return facts


def collect_provenance(root: Path) -> Provenance:
    """Query this process's machine; torch.cuda is touched only when CUDA is available."""
    commit, dirty = git_state(root)
    triton = _dist_version("triton")
    return Provenance(host=socket.gethostname(), platform=platform.platform(), cpu_model=cpu_model(),
                      blas=blas_facts(),
                      python=sys.version.split()[0], gradsweep=_dist_version("gradsweep"), triton=triton,
                      git_commit=commit, git_dirty=dirty, cuda_extension=_extension_build(),
                      **_torch_facts())  # type: ignore[arg-type]
