"""Drift attribution on the Qwen3 chain: boundaries restored and compared bitwise, the first differing boundary
found, each boundary's effect on the final logp of loss-carrying tokens measured by substitution, the RL
fragments compared, repeatability checked only where advertised, unsupported roles reported with a reason.

Tiny shapes and few tokens: the Triton roles run under the interpreter. A planted layout-dependent o_proj
must be named as the first differing boundary, and must carry the logp drift that follows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from gradsweep.drift import DriftPlan, Pair, Role, chain_boundaries, run_drift_plan
from gradsweep.drift.metrics import tensor_drift
from gradsweep.drift.plan import ProfileState, profile_state
from gradsweep.drift.rl import RL_FRAGMENTS
from gradsweep.drift.runner import ChainSetup, draw_weights, run_role
from gradsweep.layouts import build_calls
from gradsweep.manifest import DEFAULT_MANIFEST, MANIFEST_DIR, load_manifest
from gradsweep.nn import modules
from gradsweep.nn.qwen3 import Qwen3Shape
from gradsweep.workload import Workload

LENGTHS = [6, 1, 4]
CHUNKS = [[2, 4], [1], [3, 1]]
SHAPE = Qwen3Shape(layers=1)
TRITON, TORCH = "triton_interpret", "torch_bf16"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def manifest_file(tmp: Path, **ops) -> Path:
    data = yaml.safe_load(DEFAULT_MANIFEST.read_text())
    data["contract"] = str(MANIFEST_DIR / "contract.yaml")
    data["samples"]["lengths"] = LENGTHS
    data["layouts"] = {"bn_full": {}, "bn_chunked": {"chunks": CHUNKS}, "decode": {}}
    data["ops"]["chain"].pop("layouts", None)  # the sweep's restriction names layouts this manifest drops
    data["ops"].update(ops)
    path = tmp / "drift.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return load_manifest(manifest_file(tmp_path_factory.mktemp("drift")))


def _pair(profile: str, infer: str = "bn_chunked", infer_profile: str | None = None) -> Pair:
    return Pair(Role(profile, "bn_full"), Role(infer_profile or profile, infer))


@pytest.fixture(scope="module")
def triton_report(manifest):
    """The Triton chain, packed vs chunked prefill, with its deterministic logp advertised."""
    state = profile_state(manifest, TRITON)
    state.deterministic_logp = True
    plan = DriftPlan(manifest, SHAPE, [_pair(TRITON)], dlogp=True, profiles={TRITON: state})
    return run_drift_plan(plan)


def test_invariant_chain_is_bitwise_equal_at_every_boundary(triton_report):
    (pair,) = triton_report["pairs"]
    assert pair["claim"] == "bitwise" and pair["status"] == "compared"
    names = [b["name"] for b in pair["boundaries"]]
    assert names == [b.name for b in chain_boundaries(SHAPE.layers)]
    assert {"embedding", "L0.rope_q", "L0.rope_k", "L0.attention", "L0.swiglu", "final_norm", "logp"} <= set(names)
    assert all(b["mismatched"] == 0 and b["numel"] > 0 for b in pair["boundaries"])
    assert pair["first_difference"] is None and pair["logp_active"]["mismatched"] == 0
    assert all(b["dlogp"]["max_abs"] == 0.0 for b in pair["boundaries"] if b["name"] != "logp")


def test_rl_fragments_run_as_boundaries(triton_report):
    (pair,) = triton_report["pairs"]
    seen = {(e["fragment"], e["tensor"]) for e in pair["rl"]}
    assert {f for f, _ in seen} == set(RL_FRAGMENTS) and all((f, "dlogp") in seen for f in RL_FRAGMENTS)
    assert all(e["status"] == "compared" and e["mismatched"] == 0 for e in pair["rl"])
    ratio = next(e for e in pair["rl"] if e["fragment"] == "rl_ratio" and e["tensor"] == "ratio")
    assert ratio["train_value"] == ratio["infer_value"]
    assert pair["trainer_view"]["ratio_not_one"] == 0 and pair["trainer_view"]["clipped_fraction"] == 0.0


def test_repeatability_is_checked_only_where_advertised(triton_report, manifest):
    (rep,) = triton_report["repeatability"]
    assert rep["advertised"] and rep["checked"] and rep["ok"] is True
    assert {r["layout"] for r in rep["runs"]} == {"bn_full", "bn_chunked"}
    plan = DriftPlan(manifest, SHAPE, [_pair(TORCH, "bn_full")], dlogp=False, rl=False)
    (silent,) = run_drift_plan(plan)["repeatability"]
    assert silent == {"profile": TORCH, "advertised": False, "checked": False, "note": silent["note"]}
    assert "no claim" in silent["note"]


def _planted_o_proj(monkeypatch, family: str) -> None:
    """o_proj of layer 0 scales its output when a call holds part of the step (a layout-dependent kernel)."""
    original = modules.Linear.forward

    def forward(self, x, ctx):
        y = original(self, x, ctx)
        w = self.weight
        partial = int((ctx.rows.sample >= 0).sum()) < ctx.total
        if self.family == family and w.name == "o_proj" and w.layer == 0 and partial:
            return y * 1.0625
        return y

    monkeypatch.setattr(modules.Linear, "forward", forward)


def test_planted_layout_dependent_operator_is_found_and_carries_the_drift(manifest, monkeypatch):
    _planted_o_proj(monkeypatch, "triton")
    report = run_drift_plan(DriftPlan(manifest, SHAPE, [_pair(TRITON)], rl=True))
    (pair,) = report["pairs"]
    assert pair["first_difference"] == "L0.o_proj"
    by = {b["name"]: b for b in pair["boundaries"]}
    names = list(by)
    before = names[:names.index("L0.o_proj")]
    assert all(by[n]["mismatched"] == 0 and by[n]["dlogp"]["max_abs"] == 0.0 for n in before)
    planted = by["L0.o_proj"]
    assert planted["mismatched"] > 0 and planted["max_abs"] > 0 and planted["p99_abs"] <= planted["max_abs"]
    # the only defect is at o_proj: substituting its inference tensor reproduces the inference logp exactly
    assert planted["dlogp"]["mean_abs"] > 0 and planted["dlogp"]["share"] == 1.0
    assert pair["logp_active"]["mismatched"] > 0 and by["logp"]["mismatched"] > 0
    assert pair["layers"][0]["first_difference"] == "L0.o_proj" and pair["layers"][0]["growth_max"] is None
    assert any(e["mismatched"] for e in pair["rl"] if e["fragment"] == "rl_ratio")
    assert pair["trainer_view"]["ratio_not_one"] > 0


def test_a_profile_that_cannot_run_reports_why(manifest):
    state = ProfileState("cuda_like", "cuda", "cpu", "the cuda family has no kernel for attention, linear",
                         {"attention": "no attention kernel yet", "linear": "missing_required: no GEMM yet"})
    plan = DriftPlan(manifest, SHAPE, [_pair("cuda_bf16")], profiles={"cuda_bf16": state})
    (pair,) = run_drift_plan(plan)["pairs"]
    assert pair["status"] == "unsupported" and pair["role"] == "train" and "attention" in pair["reason"]
    by = {b["name"]: b for b in pair["boundaries"]}
    assert len(by) == len(chain_boundaries(SHAPE.layers))
    assert by["L0.attention"]["reason"] == "no attention kernel yet"
    assert by["L0.q_proj"]["reason"] == "missing_required: no GEMM yet"
    assert by["L0.input_norm"]["status"] == "unsupported" and by["L0.input_norm"]["reason"].startswith("not run:")


def test_cuda_profile_on_a_cpu_box_names_the_requirement(manifest):
    if torch.cuda.is_available():
        pytest.skip("this box has a GPU")
    state = profile_state(manifest, "cuda_bf16")
    assert not state.runnable and "cuda" in state.reason


def test_rl_fragment_declared_missing_is_unsupported(tmp_path):
    path = manifest_file(tmp_path, rl_dpo={"shape": {}}, rl_ratio={"shape": {}})
    data = yaml.safe_load(path.read_text())
    decls = data["profiles"][TORCH].setdefault("candidates", {})
    decls["rl_dpo"] = {"status": "missing_required", "reason": "no DPO here"}
    decls["rl_ratio"] = {"impl": "torch.rl_ratio"}
    path.write_text(yaml.safe_dump(data))
    m = load_manifest(path)
    (pair,) = run_drift_plan(DriftPlan(m, SHAPE, [_pair(TORCH, "bn_full")], dlogp=False))["pairs"]
    dpo = [e for e in pair["rl"] if e["fragment"] == "rl_dpo"]
    assert dpo and all(e["status"] == "unsupported" and "no DPO here" in e["reason"] for e in dpo)
    assert all(e["status"] == "compared" for e in pair["rl"] if e["fragment"] == "rl_ratio")


def test_parity_pairs_are_judged_by_the_contract_apart_from_bitwise_pairs(manifest):
    plan = DriftPlan(manifest, SHAPE, [_pair(TORCH, "decode"), _pair(TRITON, "decode", infer_profile=TORCH)],
                     dlogp=False, rl=False)
    report = run_drift_plan(plan)
    bitwise, parity = report["pairs"]
    assert bitwise["claim"] == "bitwise" and bitwise["parity"] is None
    assert parity["claim"] == "parity" and parity["parity"] is not None
    for side in ("train", "infer"):
        s = parity["parity"][side]
        assert s["error"] > 0 and s["stock_error"] > 0 and s["k"] >= 1.0
        assert s["ok"] is None or s["ok"] == (s["error"] <= s["bound"])


# ------------------------------------------------------------------------------------------- mechanics
def _setup(manifest) -> ChainSetup:
    w = Workload(manifest.seed, tuple(LENGTHS))
    return ChainSetup(SHAPE, w, draw_weights(SHAPE, manifest.seed, torch.device("cpu")), torch.device("cpu"))


def test_substituting_a_run_with_its_own_tensor_changes_nothing(manifest):
    setup = _setup(manifest)
    calls = build_calls("bn_chunked", manifest.layouts["bn_chunked"], LENGTHS, manifest.seed)
    base = run_role(setup, "torch", "bn_chunked", calls)
    assert set(base.tensors) == {b.name for b in setup.boundaries}
    assert base.tensors["L0.rope_q"].shape[1] == SHAPE.heads and base.tensors["L0.rope_k"].shape[1] == SHAPE.kv_heads
    for name in ("embedding", "L0.rope_k", "L0.swiglu", "L0.attn_residual", "final_norm"):
        same = run_role(setup, "torch", "bn_chunked", calls, capture=False, substitute=(name, base.tensors[name]))
        assert tensor_drift(base.logp, same.logp).mismatched == 0, name
    bumped = base.tensors["L0.swiglu"] * 2
    moved = run_role(setup, "torch", "bn_chunked", calls, capture=False, substitute=("L0.swiglu", bumped))
    assert tensor_drift(base.logp, moved.logp).mismatched > 0


def test_tensor_drift_counts_bits_and_measures_sizes():
    a = torch.tensor([1.0, 2.0, float("nan"), 0.0, -0.0, 4.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 2.5, float("nan"), 0.0, 0.0, 3.0], dtype=torch.bfloat16)
    d = tensor_drift(a, b)
    assert d.mismatched == 3 and d.numel == 6  # 2.0/2.5, -0.0/+0.0 (bits), 4/3; NaN == NaN
    assert d.max_abs == 1.0 and d.mean_abs == 1.5 / 6 and d.p99_abs == 1.0
    assert d.max_rel == 0.25 and tensor_drift(a, a).mismatched == 0
    rows = torch.tensor([True, False, True, True, True, False])
    assert tensor_drift(a.view(6, 1), b.view(6, 1), rows=rows).mismatched == 1
