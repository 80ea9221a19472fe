"""The CUDA C++ kernels of csrc/ (all but the Hopper ones), run on the CPU by a host emulation (tests/cuda_emu/).

The kernels' own sources (fragment addressing, masks, block and tile loops, the fold's bounds, the host launchers)
execute here with an independently written model of ldmatrix / mma.sync / shuffles, through the production Python
modules and the public kernel check: every layout bitwise invariant and accurate within the contract (dK / dV
FP32-class), kernel-level bitwise equalities (wide vs narrow programs, chunks, decode, a sample alone), bf16
operands missing the FP32-class rule, and a planted kernel bug (a partly visible key block run without its mask)
going red; rms_norm / qk_norm on every layout through both row paths (one warp per row for hidden <= 256, one block
per row above), the two paths bit for bit on the same rows, and a planted reduction order going red; the portable
GEMMs and the dW fold (det_gemm on every layout), and a planted fold that drops a call's last tile going red; SiLU,
SwiGLU, RoPE, embedding, pack, logp, batch-invariant logp, lm_head and linear_logp (its mma.sync kernels) on every
layout, and a planted batch-size-dependent logp going red; the folds' carried rows read in place (the kernel-level
checks of tests/test_cuda_fold_carried.py), and a planted wrong base going red. The
emulation's rounding is not the H200's: the GPU tests (tests/test_cuda_attention.py, -m gpu)
check the hardware's own bits. Skipped where g++ (C++20) or the CUDA headers are missing.
"""

from __future__ import annotations

import pytest
import torch

from gradsweep.cuda_kernels import attention as attn
from gradsweep.harness.kernel_check import check_kernel
from gradsweep.results import Status
from tests import test_cuda_attention as cuda_attention_tests
from tests import test_cuda_fold_carried as carried_tests
from tests import test_cuda_ops as cuda_ops_tests
from tests.cuda_emu import build

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::RuntimeWarning")]
_WHY = build.unavailable()
if _WHY is not None:
    pytest.skip(f"the CUDA emulation cannot be built here: {_WHY}", allow_module_level=True)

GQA = {"heads": 4, "kv_heads": 2, "head_dim": 32}
LENGTHS = [70, 5, 33, 1]


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return build.load(build.build(tmp_path_factory.mktemp("cuda_emu")))


@pytest.fixture
def kernels(emulated, monkeypatch: pytest.MonkeyPatch):
    return build.install(monkeypatch, emulated)


def test_attention_every_layout(kernels) -> None:
    report = check_kernel("attention", "cuda.attention", shape=GQA, lengths=LENGTHS)
    assert report.ok, report.first_failure


@pytest.mark.parametrize(("shape", "lengths"), [({"heads": 2, "kv_heads": 1, "head_dim": 128}, [70, 5, 1]),
                                               ({"heads": 8, "kv_heads": 2, "head_dim": 24}, [70, 5, 1]),
                                               ({"heads": 18, "kv_heads": 1, "head_dim": 16}, [40, 3, 1])])
def test_attention_head_dims_and_groups(kernels, shape, lengths) -> None:
    """head_dim 128 (the release size), 24 (zero-padded to 32 columns), 18 query heads per K/V head (one head per
    program)."""
    report = check_kernel("attention", "cuda.attention", shape=shape, lengths=lengths,
                          layouts=["bn_chunked", "bn_padded_left", "decode"])
    assert report.ok, report.first_failure


def test_attention_wide_narrow_chunks_decode_and_alone_agree_bitwise(kernels) -> None:
    lengths = [150, 37, 70]
    data = cuda_attention_tests._qkv(lengths, {"heads": 8, "kv_heads": 2, "head_dim": 32}, device="cpu")
    cuda_attention_tests.check_prefill_equals_other_layouts(data, lengths, decode_tail=6)


@pytest.mark.parametrize("fp32_grads", [True, False])
def test_attention_fp32_grads_meets_the_fp32_class(kernels, fp32_grads) -> None:
    cand = cuda_attention_tests._candidate("cuda.attention.grads", attn.AttnConfig(fp32_grads=fp32_grads))
    cell = check_kernel("attention", cand, shape=GQA, lengths=LENGTHS, layouts=["bn_chunked"],
                        contract=cuda_attention_tests._fp32_class_contract(True)).cells["bn_chunked"]
    assert all(m.bitwise_equal for m in cell.tensors)
    bad = {m.name for m in cell.tensors if m.accuracy_ok is False}
    assert bad == (set() if fp32_grads else {"dK", "dV"}), cell.reason


def test_a_planted_kernel_bug_goes_red(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward treats one more key block as seen whole by every row (no mask): later keys leak into o."""
    plant = ("attention_fwd", "const int nb_full = (static_cast<int>(pr.pos0) + 1) / C::BN;",
             "const int nb_full = (static_cast<int>(pr.pos0) + 1) / C::BN + 1;")
    build.install(monkeypatch, build.load(build.build(tmp_path, plant=plant)))
    report = check_kernel("attention", "cuda.attention", shape=GQA, lengths=LENGTHS, layouts=["bn_full"])
    assert not report.ok and "o forward_accuracy" in (report.first_failure or "")


@pytest.mark.parametrize("op", ["rl_ratio", "rl_kl", "rl_ppo", "rl_grpo", "rl_grpo_seq", "rl_dpo"])
def test_rl_every_layout(kernels, op: str) -> None:
    report = check_kernel(op, f"cuda.{op}")
    assert report.ok, report.first_failure


def test_rl_fp32_inputs_match_bf16_inputs_bitwise(kernels) -> None:
    """One launch reads one dtype: bf16 log-probs read as bf16 or widened to FP32 give the same bits."""
    from gradsweep.cuda_kernels import rl_token

    g = torch.Generator().manual_seed(3)
    lp, old, ref = ((torch.randn(700, generator=g) * 0.5).bfloat16() for _ in range(3))
    sample = torch.randint(-1, 9, (700,), generator=g)
    rewards = torch.rand(9, generator=g)
    a = rl_token.grpo_loss(lp, old, ref, sample, rewards, 3, 0.2, 0.2, 0.04, 1e-4)
    b = rl_token.grpo_loss(lp.float(), old, ref.float(), sample, rewards, 3, 0.2, 0.2, 0.04, 1e-4)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize(("op", "shape"), [("rms_norm", None), ("rms_norm", {"hidden": 264}),
                                           ("qk_norm", {"heads": 2, "head_dim": 128})])
def test_row_norms_every_layout(kernels, op: str, shape) -> None:
    """rms_norm and qk_norm (forward, dx, the canonical dweight fold) on every layout: hidden 96 and QK-norm's
    heads of 128 take the one-warp-per-row kernels, hidden 264 the one-block-per-row ones."""
    report = check_kernel(op, f"cuda.{op}", shape=shape)
    assert report.ok, report.first_failure


def _row_paths_differences(ext) -> list[str]:
    """The emulated rows of the one-warp path against the one-block path (test_cuda_ops' check, smaller sizes)."""
    return cuda_ops_tests.rms_row_path_differences(ext, "cpu", 0, 0, (1, 8, 60, 128, 256), (1, 6, 37), modes=(1,))


def test_rms_norm_warp_rows_equal_block_rows(emulated) -> None:
    assert not _row_paths_differences(emulated)


def test_a_planted_warp_reduction_order_goes_red(tmp_path) -> None:
    """The one-warp path summing its lanes in another butterfly order: its rows no longer equal the block path's."""
    plant = ("rms_norm", "for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
             "  return __fadd_rn(v, 0.0f);",
             "for (int o = 1; o < 32; o <<= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
             "  return __fadd_rn(v, 0.0f);")
    bad = _row_paths_differences(build.load(build.build(tmp_path, plant=plant)))
    assert any("rstd" in b for b in bad) and any(" dx" in b for b in bad), bad


def test_det_gemm_every_layout(kernels) -> None:
    """The portable GEMMs (mma.sync: forward, dX) and the canonical dW fold on every layout of the kernel check."""
    report = check_kernel("det_gemm", "cuda.det_gemm")
    assert report.ok, report.first_failure


def test_a_fold_that_drops_a_calls_last_tile_goes_red(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted in gemm.cu: the dW fold's token range one canonical tile short, so each call's last tile is never
    folded: a layout whose calls end their tiles elsewhere than the whole batch's (chunked) gets another dW."""
    plant = ("gemm", "const GemmArgs g{fy.call, ldy, fx.call, ldx, N, K, T, reinterpret_cast<const int32_t*>(plan)",
             "const GemmArgs g{fy.call, ldy, fx.call, ldx, N, K, T - tile, reinterpret_cast<const int32_t*>(plan)")
    build.install(monkeypatch, build.load(build.build(tmp_path, plant=plant)))
    report = check_kernel("det_gemm", "cuda.det_gemm", layouts=["bn_full", "bn_chunked"])
    assert report.cells["bn_chunked"].status == Status.RED_VERDICT, report.cells["bn_chunked"].first_failure


# (op, lengths): the vocabulary ops with fewer tokens (a 512-thread CTA per row is slow to emulate)
OTHER_OPS = [("silu", None), ("swiglu", None), ("rope", None), ("embedding", None), ("pack", None),
             ("logp", [9, 3, 1]), ("batch_invariant_logp", [9, 3, 1]), ("lm_head", [9, 3, 1]),
             ("linear_logp", [9, 3, 1])]


@pytest.mark.parametrize(("op", "lengths"), OTHER_OPS)
def test_other_ops_every_layout(kernels, op: str, lengths) -> None:
    """The rest of the CUDA family (the Hopper GEMMs aside) through its kernels' own sources on every layout."""
    report = check_kernel(op, f"cuda.{op}", lengths=lengths)
    assert report.ok, report.first_failure


def test_a_batch_size_dependent_logp_goes_red(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted in logp.cu: calls of more than 5 rows leave the vocabulary's last column out of the forward (an
    arithmetic that follows the batch): the layouts whose calls are small no longer match the full batch."""
    plant = ("logp", "reinterpret_cast<float*>(out), reinterpret_cast<float*>(lse), V, ld);",
             "reinterpret_cast<float*>(out), reinterpret_cast<float*>(lse), V - (R > 5 ? 1 : 0), ld);")
    build.install(monkeypatch, build.load(build.build(tmp_path, plant=plant)))
    report = check_kernel("logp", "cuda.logp", lengths=[9, 3, 1], layouts=["bn_full", "b1_singleton"])
    assert report.cells["b1_singleton"].status == Status.RED_VERDICT, report.cells["b1_singleton"].first_failure


def test_folds_read_carried_rows_in_place_as_the_concatenated_rows(emulated) -> None:
    """Kernel level, as the GPU tests of tests/test_cuda_fold_carried.py: the mma.sync dW fold and the rms_norm /
    qk_norm dweight tiles over two bases give the concatenated rows' bits (NaN around both bases, split calls)."""
    bad = carried_tests.dw_fold_differences(emulated, 0, 0, [1], "cpu", shapes=((72, 136), (24, 40)))
    for hidden in (200, 100):
        bad += carried_tests.norm_tiles_differences(emulated, 0, 0, hidden, "cpu")
    assert not bad, bad


def test_a_fold_reading_carried_rows_from_the_call_goes_red(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted in gemm.cu: the mma.sync fold handed the call's bases for the carried rows (the row space's first
    n_stage rows read from the wrong tensor): the kernel-level check and the chunked layout's dW both catch it."""
    plant = ("gemm", "fy.stage, stage_ldy, fx.stage, stage_ldx, fy.n_stage};",
             "fy.call, stage_ldy, fx.call, stage_ldx, fy.n_stage};")
    planted = build.load(build.build(tmp_path, plant=plant))
    bad = carried_tests.dw_fold_differences(planted, 0, 0, [1], "cpu", shapes=((24, 40),))
    assert any("differs from concatenated" in b for b in bad), bad
    build.install(monkeypatch, planted)
    report = check_kernel("det_gemm", "cuda.det_gemm", layouts=["bn_full", "bn_chunked"])
    assert report.cells["bn_chunked"].status == Status.RED_VERDICT, report.cells["bn_chunked"].first_failure
