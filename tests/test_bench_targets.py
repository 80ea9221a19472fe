"""The targets file: the shipped one loads against the catalog; a bad entry is one line naming it and the fix."""

from __future__ import annotations

import copy

import pytest
import yaml

from gradsweep.bench.api import _validation_catalog
from gradsweep.bench.catalog import catalog
from gradsweep.bench.targets import DEFAULT_TARGETS, Target, TargetsError, load_targets

CATALOG = _validation_catalog()
SHIPPED = yaml.safe_load(DEFAULT_TARGETS.read_text())


def _refused(tmp_path, mutate) -> str:
    data = copy.deepcopy(SHIPPED)
    mutate(data)
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(TargetsError) as info:
        load_targets(path, CATALOG)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_shipped_targets_name_real_cases_and_metrics():
    parsed = load_targets(DEFAULT_TARGETS, CATALOG)
    assert parsed.version >= 1 and len(parsed.targets) >= 40
    ids = {c.id for c in catalog(False)}
    for t in parsed.targets:
        assert f"{t.op}/{t.case}" in ids, t
    # every issue the bench answers has its targets in the file, none in code
    assert {"10", "11", "12", "13", "14"} <= {t.issue for t in parsed.targets}


def test_unknown_op(tmp_path):
    msg = _refused(tmp_path, lambda d: d["targets"][0].update(op="softmaxx"))
    assert "targets.0" in msg and "unknown op 'softmaxx'" in msg and "det_gemm" in msg


def test_unknown_case(tmp_path):
    msg = _refused(tmp_path, lambda d: d["targets"][0].update(case="fwd_m3"))
    assert "no bench case 'fwd_m3'" in msg and "fwd_m1_n4096" in msg


def test_metric_the_case_cannot_report(tmp_path):
    msg = _refused(tmp_path, lambda d: d["targets"][0].update(metric="e2e_vs_sdpa"))
    assert "does not report 'e2e_vs_sdpa'" in msg and "e2e_vs_stock" in msg


def test_family_that_does_not_run_the_case(tmp_path):
    def mutate(d):
        d["targets"].append({"op": "chain", "case": "step", "family": "cuda", "metric": "e2e_vs_stock", "max": 1.3,
                             "issue": "14"})
    assert "family 'cuda' does not run this case" in _refused(tmp_path, mutate)


@pytest.mark.parametrize("bounds", [{}, {"max": 1.1, "min": 0.5}])
def test_exactly_one_bound(tmp_path, bounds):
    def mutate(d):
        d["targets"][0].pop("max", None)
        d["targets"][0].update(bounds)
    assert "exactly one of max or min" in _refused(tmp_path, mutate)


def test_duplicate_target(tmp_path):
    assert "second target" in _refused(tmp_path, lambda d: d["targets"].append(dict(d["targets"][0])))


def test_unknown_key_and_format(tmp_path):
    assert "colour" in _refused(tmp_path, lambda d: d["targets"][0].update(colour="red"))
    assert "format" in _refused(tmp_path, lambda d: d.update(format=2))


def test_malformed_and_missing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("targets: [unclosed\n")
    with pytest.raises(TargetsError, match="malformed YAML"):
        load_targets(bad, CATALOG)
    with pytest.raises(TargetsError, match="cannot read"):
        load_targets(tmp_path / "absent.yaml", CATALOG)


def test_bounds_are_judged_by_their_sense():
    ratio = Target(op="x", case="y", metric="e2e_vs_stock", max=1.10, issue="12")
    assert ratio.met_by(1.10) and not ratio.met_by(1.1000001)
    fraction = Target(op="x", case="y", metric="copy_fraction", min=0.8, issue="4")
    assert fraction.met_by(0.8) and not fraction.met_by(0.7999)
    assert ratio.applies("x", "y", "cuda") and not Target(op="x", case="y", metric="m", max=1, issue="1",
                                                          family="triton").applies("x", "y", "cuda")
