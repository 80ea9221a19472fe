"""CUDA C++ RL loss fragments (gradsweep.cuda_kernels.rl_token / rl_dpo, csrc/rl.cu).

CPU (every run): the launchers are built; every op's ``cuda.<op>`` candidate runs through the public kernel check
against a CPU stand-in of the launchers (tests/fakes/cuda_attention_ext.py), which exercises the Python side
(dtype codes, flattening, the DPO index plan and its refusals, argument order); a planted fault goes red.
GPU (``-m gpu``): the real kernels through the public kernel check, and bitwise checks of what the kernel check
does not vary: bf16 inputs read as bf16 or widened to FP32 give the same bits (the kernels convert exactly), and
FP32 log-prob inputs (a model's) run with FP32 gradients.
"""

from __future__ import annotations

import pytest
import torch

from gradsweep.canonical import RowIdentity
from gradsweep.cuda_kernels import rl_dpo, rl_token, runtime
from gradsweep.harness.kernel_check import check_kernel
from tests.cuda_gpu import needs_cuda_kernels
from tests.fakes import cuda_attention_ext

RL_OPS = ("rl_ratio", "rl_kl", "rl_ppo", "rl_grpo", "rl_grpo_seq", "rl_dpo")


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch):
    return cuda_attention_ext.install(monkeypatch)


def test_launchers_are_built() -> None:
    try:
        ext = runtime.load()
    except ImportError:
        pytest.skip("gradsweep._C is not built here")
    names = ("rl_ratio_fwd", "rl_ratio_bwd", "rl_kl_fwd", "rl_kl_bwd", "rl_policy", "rl_seq_sum", "rl_dpo")
    missing = [n for n in names if not hasattr(ext, n)]
    assert not missing, f"gradsweep._C lacks {missing}: rebuild (python setup.py build_ext --inplace)"
    assert int(ext.RL_SEQ_THREADS) == cuda_attention_ext.GEOMETRY["RL_SEQ_THREADS"]


@pytest.mark.parametrize("op", RL_OPS)
def test_every_layout_through_the_stand_in(stand_in, op: str) -> None:
    report = check_kernel(op, f"cuda.{op}")
    assert report.ok, report.first_failure


def test_stand_in_goes_red_on_a_planted_fault(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DPO sequence sum that walks a sample's rows in physical order from the call's first row (so a sample's
    sum follows where it sits in the call) is caught."""
    real = cuda_attention_ext.rl_seq_sum

    def physical(a, b, mask, order, start, len, out, n_samples, dtype, device, stream):
        real(a, b, mask, order, start, len, out, n_samples, dtype, device, stream)
        res = cuda_attention_ext._t(out)
        res += 1e-3 * cuda_attention_ext._t(order).view(-1)[:1].float()  # the first physical row of the call

    monkeypatch.setattr(stand_in, "rl_seq_sum", physical)
    report = check_kernel("rl_dpo", "cuda.rl_dpo", layouts=["bn_full", "bn_padded_left", "bn_permuted"])
    assert not report.ok


def test_dpo_refuses_a_split_pair(stand_in) -> None:
    lengths = [3, 2]
    rows = RowIdentity.packed([3], [0])
    x = torch.zeros(3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="pair partner"):
        rl_dpo.dpo_loss(x, x, torch.ones(3), rows, lengths, 0.1)
    with pytest.raises(ValueError, match="tokens in this call"):
        rl_dpo.dpo_loss(x[:2], x[:2], torch.ones(2), RowIdentity.packed([2], [0]), lengths, 0.1)


def test_shapes_and_devices_are_refused() -> None:
    x = torch.zeros(4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="one value per token"):
        rl_token.importance_ratio(x, x[:3])
    with pytest.raises(ValueError, match="CUDA tensor"):
        rl_token.importance_ratio(x, x)
    with pytest.raises(ValueError, match="group_size"):
        rl_token.grpo_loss(x, x, x, torch.zeros(4, dtype=torch.int64), torch.zeros(2), 0, 0.2, 0.2, 0.0, 1e-4)


# ----------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize("op", RL_OPS)
def test_every_layout_on_the_gpu(op: str) -> None:
    report = check_kernel(op, f"cuda.{op}", device="cuda")
    assert report.ok, report.first_failure
    report = check_kernel(op, f"cuda.{op}", device="cuda", lengths=[700, 3, 257, 1, 64, 90])
    assert report.ok, report.first_failure


def _bits32(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.gpu
@needs_cuda_kernels
def test_bf16_inputs_read_as_bf16_or_fp32_give_the_same_bits() -> None:
    g = torch.Generator(device="cuda").manual_seed(3)
    n = 5000
    lp, old, ref, adv = ((torch.randn(n, device="cuda", generator=g) * 0.5).bfloat16() for _ in range(4))
    sample = torch.randint(-1, 9, (n,), device="cuda", generator=g)
    rewards = torch.rand(9, device="cuda", generator=g)
    runs = {
        "ratio": lambda a, b, c, d: (rl_token.importance_ratio(a, b),),
        "kl": lambda a, b, c, d: rl_token.kl_estimators(a, c),
        "ppo": lambda a, b, c, d: (rl_token.ppo_loss(a, b, d, 0.2, 0.28),),
        "grpo": lambda a, b, c, d: (rl_token.grpo_loss(a, b, c, sample, rewards, 3, 0.2, 0.2, 0.04, 1e-4),),
    }
    for name, fn in runs.items():
        as_bf16 = fn(lp, old, ref, adv)
        as_fp32 = fn(lp.float(), old.float(), ref.float(), adv.float())
        mixed = fn(lp, old.float(), ref, adv.float())  # widened to FP32 inside: exact
        for a, b, c in zip(as_bf16, as_fp32, mixed):
            assert torch.equal(_bits32(a), _bits32(b)) and torch.equal(_bits32(a), _bits32(c)), name


@pytest.mark.gpu
@needs_cuda_kernels
def test_fp32_logp_gets_an_fp32_gradient_equal_to_the_bf16_path_before_rounding() -> None:
    """A model's FP32 log-probs: the gradient comes back FP32; for bf16-representable inputs its RNE rounding is
    the bf16 path's gradient, bit for bit."""
    g = torch.Generator(device="cuda").manual_seed(4)
    n = 4097
    lp16 = (torch.randn(n, device="cuda", generator=g) * 0.5).bfloat16()
    old = (torch.randn(n, device="cuda", generator=g) * 0.5).bfloat16()
    up = torch.randn(n, device="cuda", generator=g)
    x16 = lp16.clone().requires_grad_(True)
    x32 = lp16.float().requires_grad_(True)
    rl_token.importance_ratio(x16, old).backward(up)
    rl_token.importance_ratio(x32, old.float()).backward(up)
    assert x32.grad.dtype == torch.float32 and x16.grad.dtype == torch.bfloat16
    assert torch.equal(x32.grad.bfloat16().view(torch.int16), x16.grad.view(torch.int16))
