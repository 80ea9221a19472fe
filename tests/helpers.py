"""Shared test helpers: small manifests written to a temp dir."""

from __future__ import annotations

from pathlib import Path

import yaml

from gradsweep.manifest import MANIFEST_DIR, load_manifest

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
