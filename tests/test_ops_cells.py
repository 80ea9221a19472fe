"""Every op through the real harness: stock torch on CPU, and the Triton family under the interpreter.

Stock torch is the status quo: it may be red on any layout but bn_full, and no expectation about which
layouts is written here. The Triton family must be green on every layout of the default manifest (issues 4 and 5).
"""

from __future__ import annotations

import pytest

from gradsweep.harness import run_cell
from gradsweep.manifest import DEFAULT_MANIFEST, load_manifest
from gradsweep.results import CellKey, Status

MANIFEST = load_manifest(DEFAULT_MANIFEST)


@pytest.mark.parametrize("op", list(MANIFEST.ops))
def test_stock_torch_runs_every_op_and_is_deterministic(op):
    full = run_cell(MANIFEST, CellKey(op=op, profile="torch_bf16", layout="bn_full"))
    assert full.status == Status.GREEN, full.reason  # reruns of bn_full on a CPU: the same bits
    assert full.tensors and all(t.bitwise_equal for t in full.tensors)
    # the stock path on its own reference layout IS the accuracy baseline: reported, never judged against itself
    assert {t.accuracy_class for t in full.tensors if t.accuracy_error is not None} == {"baseline"}
    assert all(t.accuracy_bound is None for t in full.tensors)


TRITON_OPS = [op for op, decl in MANIFEST.profiles["triton_interpret"].candidates.items() if decl.impl]


@pytest.mark.parametrize("op", TRITON_OPS)
def test_triton_family_is_green_on_every_layout_under_the_interpreter(op):
    bad = []
    for lay in MANIFEST.layouts_for(op):
        r = run_cell(MANIFEST, CellKey(op=op, profile="triton_interpret", layout=lay))
        names = {t.name for t in r.tensors}
        if r.status != Status.GREEN:
            bad.append(f"{lay}: {r.status.value}: {r.reason}")
        elif lay == "bn_chunked":
            from gradsweep.ops.registry import get_op

            spec = get_op(op)
            assert names == {o.name for o in spec.outputs} | set(spec.gradient_names())
    assert bad == []


def test_gpu_profiles_are_blocked_on_a_cpu_box():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this box has a GPU")
    r = run_cell(MANIFEST, CellKey(op="rms_norm", profile="triton_cuda_bf16", layout="bn_full"))
    assert r.status == Status.BLOCKED_HARDWARE and "cuda" in r.reason
    r = run_cell(MANIFEST, CellKey(op="attention", profile="cuda_bf16", layout="bn_full"))
    assert r.status == Status.BLOCKED_HARDWARE and "cuda" in r.reason
