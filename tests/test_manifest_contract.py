"""Bad manifests and contracts are refused with a message that names the field and the fix."""

from __future__ import annotations

import copy
import pathlib
import re

import pytest
import yaml

from gradsweep.contract import BitwiseRule, CheckKind, ContractError, RatioRule, load_contract
from gradsweep.manifest import DEFAULT_MANIFEST, MANIFEST_DIR, ManifestError, load_manifest
from gradsweep.ops.registry import BUILTIN_OPS, all_ops
from tests.helpers import write_manifest

BASE = yaml.safe_load(DEFAULT_MANIFEST.read_text())
BASE["contract"] = str(MANIFEST_DIR / "contract.yaml")


def _refused(tmp_path, mutate) -> str:
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(ManifestError) as info:
        load_manifest(write_manifest(tmp_path, data))
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_default_manifest_loads_and_enumerates_every_op():
    m = load_manifest(DEFAULT_MANIFEST)
    assert set(m.ops) == set(BUILTIN_OPS) <= set(all_ops())
    assert len(m.cells()) == len({k.id for k in m.cells()})
    for op in all_ops().values():
        assert any(c.family == "torch" for c in op.candidates.values()), op.name
        assert op.gradient_names(), op.name


def test_unknown_op(tmp_path):
    msg = _refused(tmp_path, lambda d: d["ops"].update({"softmaxx": {}}))
    assert "unknown op 'softmaxx'" in msg and "rms_norm" in msg


def test_unknown_layout(tmp_path):
    msg = _refused(tmp_path, lambda d: d["layouts"].update({"bn_sideways": {}}))
    assert "unknown layout 'bn_sideways'" in msg and "bn_chunked" in msg


@pytest.mark.parametrize("value", [0, -3])
def test_non_positive_sample_length(tmp_path, value):
    msg = _refused(tmp_path, lambda d: d["samples"].__setitem__("lengths", [4, value]))
    assert "samples.lengths.1" in msg and "greater than 0" in msg


def test_non_positive_shape(tmp_path):
    msg = _refused(tmp_path, lambda d: d["ops"]["rms_norm"]["shape"].__setitem__("hidden", 0))
    assert "ops.rms_norm.shape.hidden" in msg


def test_head_dim_not_matching_heads(tmp_path):
    msg = _refused(tmp_path, lambda d: d["ops"]["attention"].__setitem__(
        "shape", {"heads": 3, "head_dim": 30, "hidden": 96}))
    assert "ops.attention.shape" in msg and "head_dim" in msg


def test_chunks_not_summing_to_sample_length(tmp_path):
    msg = _refused(tmp_path, lambda d: d["layouts"]["bn_chunked"].__setitem__(
        "chunks", [[64, 37, 27, 21], [2, 3], [1, 31, 32], [1], [10, 7, 6], [32, 5]]))
    assert "bn_chunked.chunks[0]" in msg and "sum to 149" in msg and "150" in msg


def test_unknown_key_is_refused(tmp_path):
    msg = _refused(tmp_path, lambda d: d.__setitem__("colour", "red"))
    assert "colour" in msg


def test_profile_borrowing_another_family_is_refused(tmp_path):
    def borrow(d):
        d["profiles"]["triton_cuda_bf16"].setdefault("candidates", {})["rms_norm"] = {"impl": "torch.rms_norm"}

    msg = _refused(tmp_path, borrow)
    assert "never borrows" in msg


def test_malformed_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("manifest_version: 1\nops: [unclosed\n")
    with pytest.raises(ManifestError, match="malformed YAML"):
        load_manifest(path)


def test_tolerance_on_an_invariance_check_is_refused(tmp_path):
    data = yaml.safe_load((MANIFEST_DIR / "contract.yaml").read_text())
    data["accuracy"]["rules"].append({"kind": "gradient_invariance", "op": "rms_norm", "k": 2.0, "floor": 1e-3})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError, match="invariance"):
        load_contract(path)
    data = yaml.safe_load((MANIFEST_DIR / "contract.yaml").read_text())
    data["invariance"] = {"rule": "atol=1e-6"}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ContractError, match="bitwise"):
        load_contract(path)


def test_contract_resolver():
    c = load_contract(MANIFEST_DIR / "contract.yaml")
    assert isinstance(c.resolve(CheckKind.GRADIENT_INVARIANCE, "rms_norm", "dweight", "float32", "x"), BitwiseRule)
    default = c.resolve(CheckKind.FORWARD_ACCURACY, "silu", "y", "bfloat16", "triton_cuda_bf16")
    assert isinstance(default, RatioRule) and default.k == 2.0
    assert c.resolve(CheckKind.GRADIENT_ACCURACY, "pack", "dx", "bfloat16", "x").floor == 0.0
    assert c.version


# What a private tolerance looks like: a closeness helper, or a comparison against a small float literal
# (``err < 1e-3``, ``<= 2 ** -6``). Bitwise claims compare raw bits; accuracy bounds come from the contract.
_TOLERANCE = re.compile(r"atol\s*=|rtol\s*=|allclose\(|assert_close\(|isclose\("
                        r"|[<>]=?\s*-?\d*\.?\d+e-\d+|[<>]=?\s*2(\.0)?\s*\*\*\s*-\d+"
                        r"|\b[A-Z0-9_]*(BOUND|TOL|ULP|EPS\d+)[A-Z0-9_]*\b(\s*,\s*[A-Z0-9_]+)*\s*=[^=]")


def test_no_tolerance_outside_the_contract():
    """No private tolerance in the package, the tests or the benches: the contract is the only place."""
    root = pathlib.Path(__file__).resolve().parents[1]
    offenders = []
    for folder in ("gradsweep", "tests", "bench", "scripts"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.resolve() == pathlib.Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _TOLERANCE.search(line.split("#")[0]):
                    offenders.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert offenders == []


def test_the_tolerance_guard_sees_what_it_must():
    for planted in ("assert err < 1e-3", "ok = rel <= 2 ** -6", "torch.testing.assert_close(a, b)",
                    "np.allclose(a, b)", "x = f(a, atol=1)", "REL_BOUND = 2e-2",
                    "EPS32, EPS16 = 2.0 ** -24, 2.0 ** -8"):
        assert _TOLERANCE.search(planted), planted
    for fine in ("assert d.mismatched == 0", "scale = 2.0 ** -0.5", "floor: 1.0e-5"):
        assert not _TOLERANCE.search(fine), fine
