"""One worker per visible GPU: which profiles are placed, and which GPU each worker holds.

On a box with a visible GPU, each worker of a GPU profile (device cuda or auto) is started with
CUDA_VISIBLE_DEVICES set to one GPU that no other live worker holds, so every cell runs pinned to one
device, the GPUs work in parallel, and no two workers share a GPU's memory (two release-shape chain
cells on one H200 ran it out of memory: a GPU worker holds ~75 GB at the peak). On a one-GPU box the
GPU profiles therefore run one after another, while CPU profiles may run beside them. A profile whose
env sets CUDA_VISIBLE_DEVICES itself is left alone; CPU profiles and boxes without a GPU are unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

VISIBLE = "CUDA_VISIBLE_DEVICES"


def _device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # no torch, or a broken CUDA install: no GPU to place on
        return 0


def visible_gpus(env: Mapping[str, str] | None = None, count: int | None = None) -> list[str]:
    """The GPU ids this process sees, as CUDA_VISIBLE_DEVICES entries (its own ids when it sets them)."""
    env = os.environ if env is None else env
    n = _device_count() if count is None else count
    listed = env.get(VISIBLE)
    if listed is None:
        return [str(i) for i in range(n)]
    ids: list[str] = []
    for item in (x.strip() for x in listed.split(",")):
        if not item or item.startswith("-"):
            break  # CUDA stops at the first invalid entry; "-1" hides every GPU
        ids.append(item)
    return ids[:n]


def placed_profiles(devices: Mapping[str, str], envs: Mapping[str, Mapping[str, str]],
                    gpus: list[str]) -> frozenset[str]:
    """Profiles whose workers each get one GPU of ``gpus`` (none without a GPU)."""
    if not gpus:
        return frozenset()
    return frozenset(p for p, dev in devices.items() if dev in ("cuda", "auto") and VISIBLE not in envs.get(p, {}))


class GpuSlots:
    """The GPUs free for a new worker; a worker holds its GPU until it is dropped."""

    def __init__(self, gpus: list[str]):
        self.free = list(gpus)
        self.held: set[str] = set()

    def acquire(self) -> str | None:
        if not self.free:
            return None
        gpu = self.free.pop(0)
        self.held.add(gpu)
        return gpu

    def release(self, gpu: str | None) -> None:
        if gpu is not None and gpu in self.held:
            self.held.discard(gpu)
            self.free.append(gpu)
