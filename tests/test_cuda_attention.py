"""CUDA C++ causal attention with grouped-query heads (gradsweep.cuda_kernels.attention, csrc/attention*.cu).

CPU (every run): the launchers and compiled sizes are in the built extension; the whole Python side (plans,
program tables, logical stores, the fold's work list and trigger, pads and fillers) runs through the public
kernel check on every layout against a CPU stand-in of the launchers (tests/fakes/cuda_attention_ext.py), which
decodes the tables exactly as the kernels do; planted faults in the stand-in go red; refusals.
GPU (``-m gpu``, the H200): the real kernels through the public kernel check (bitwise invariance over every
layout, contract accuracy with FP32-class dK / dV) at the test sizes and the release shape; and kernel-level bitwise
checks the kernel check cannot make: wide (128 / 64-row) and narrow (16-row) programs give a row the same bits, a
sample computed alone equals the same sample in a batch, decode equals prefill, the signed zero of a masked key
never reaches o; bf16 operands (fp32_grads off) miss the FP32-class rule that the default meets.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gradsweep.canonical import RowIdentity
from gradsweep.contract import Contract, load_contract
from gradsweep.cuda_kernels import attention as attn
from gradsweep.cuda_kernels import runtime
from gradsweep.harness.compare import raw_bits
from gradsweep.harness.kernel_check import candidate_from, check_kernel
from gradsweep.manifest import DEFAULT_MANIFEST, load_manifest
from gradsweep.ops.base import CallContext, CallOutput
from gradsweep.ops.registry import get_op
from tests.cuda_gpu import needs_cuda_kernels
from tests.fakes import cuda_attention_ext, cuda_ext
from tests.helpers import check_attention_cache_refusals

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

LENGTHS = [70, 5, 33, 1]                  # sample 0 spans 2 key blocks, 3 fold tiles and several programs
LONG = [300, 70, 129, 1, 64]              # several 64-key blocks, wide programs, fold blocks; exact block edges
GQA = {"heads": 4, "kv_heads": 2, "head_dim": 32}
RELEASE = {"heads": 32, "kv_heads": 8, "head_dim": 128}


def _candidate(name: str, config: attn.AttnConfig):
    """The shipped adapter with another AttnConfig."""

    def run(ctx: CallContext) -> CallOutput:
        q, k = ctx.inputs["q"], ctx.inputs["k"]
        cache = ctx.state.get("cache")
        if cache is None:
            cache = ctx.state["cache"] = attn.AttentionCache(ctx.lengths, q.shape[1], q.shape[2], q.device,
                                                             kv_heads=k.shape[1], config=config)
        return CallOutput({"o": attn.attention(q, k, ctx.inputs["v"], ctx.rows, cache)})

    def grads(state: dict) -> dict[str, torch.Tensor]:
        dk, dv = state["cache"].finish()
        return {"dK": dk, "dV": dv}

    return candidate_from("attention", name, "cuda", run, folded_input_grads=grads)


def _fp32_class_contract(fp32_attention: bool) -> Contract:
    """The shipped contract (attention's dK / dV FP32-class), or the same with them moved to the bf16 class."""
    base = load_contract(load_manifest(DEFAULT_MANIFEST).contract_path)
    data = base.model_dump(mode="json")
    if not fp32_attention:
        data["accumulation"]["fp32"] = [e for e in data["accumulation"]["fp32"] if e["op"] != "attention"]
    return Contract.model_validate(data)


# ----------------------------------------------------------------------------------------------- CPU
@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch):
    ext = cuda_attention_ext.install(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reduction order for the stand-in's float64 sums
    yield ext
    torch.set_num_threads(threads)


def test_launchers_and_sizes_are_built() -> None:
    try:
        ext = runtime.load()
    except ImportError:
        pytest.skip("gradsweep._C is not built here")
    missing = [n for n in ("attn_fwd", "attn_dq", "attn_dkdv", "attn_scatter") if not hasattr(ext, n)]
    assert not missing, f"gradsweep._C lacks {missing}: rebuild (python setup.py build_ext --inplace)"
    built = {n: int(getattr(ext, n)) for n in cuda_attention_ext.GEOMETRY}
    assert built == cuda_attention_ext.GEOMETRY, "the CPU stand-in must decode tables with the compiled sizes"
    assert built["ATTN_FOLD_TILE"] == attn.TILE and built["ATTN_MAX_HEAD_DIM"] == attn.MAX_HEAD_DIM


def test_every_layout_through_the_stand_in(stand_in) -> None:
    calls = {"attn_fwd": 0, "attn_dq": 0, "attn_dkdv": 0}
    for name in calls:
        real = getattr(stand_in, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        setattr(stand_in, name, counted)
    report = check_kernel("attention", "cuda.attention", shape=GQA, lengths=LENGTHS)
    assert report.ok, report.first_failure
    assert set(report.cells) == set(get_op("attention").layouts)
    assert all(calls.values()), calls  # the kernel check reached every launcher


@pytest.mark.parametrize("shape", [{"heads": 8, "kv_heads": 2, "head_dim": 24}, {"heads": 2, "head_dim": 16},
                                   {"heads": 40, "kv_heads": 2, "head_dim": 8}])
def test_groups_padding_and_wide_groups_through_the_stand_in(stand_in, shape) -> None:
    """4 query heads per K/V head with head_dim 24; plain multi-head; 20 per K/V head (one head per program)."""
    report = check_kernel("attention", "cuda.attention", shape=shape, lengths=LONG,
                          layouts=["bn_chunked", "bn_padded_left", "decode"])
    assert report.ok, report.first_failure


def test_wide_programs_only_through_the_stand_in(stand_in) -> None:
    cand = _candidate("cuda.attention.wide", attn.AttnConfig(narrow=False))
    report = check_kernel("attention", cand, shape=GQA, lengths=LENGTHS, layouts=["bn_chunked", "decode"])
    assert report.ok, report.first_failure


def test_stand_in_goes_red_on_planted_faults(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward whose rows see one key past their position when their program reaches further, and a fold that
    ignores the main grad it was handed, are caught: the stand-in checks can fail."""
    real_fwd = cuda_attention_ext.attn_fwd

    def leaky(q, k, v, o, lse, wide, n_wide, narrow, n_narrow, pack, HQ, HKV, D, T, qk_scale, device, stream,
              path=0):
        real_fwd(q, k, v, o, lse, wide, n_wide, narrow, n_narrow, pack, HQ, HKV, D, T, qk_scale, device, stream,
                 path)
        t = cuda_ext._t(wide)
        if n_wide and int(t[0, 3]) > 1:  # the first row of a multi-token program gets its neighbour's value
            rows = cuda_ext._t(o).view(-1, HQ, D)
            rows[int(t[0, 0])] = rows[int(t[0, 0]) + 1]

    monkeypatch.setattr(stand_in, "attn_fwd", leaky)
    report = check_kernel("attention", "cuda.attention", shape=GQA, lengths=LENGTHS, layouts=["bn_chunked"])
    assert not report.ok and "o forward_invariance" in report.cells["bn_chunked"].reason
    monkeypatch.setattr(stand_in, "attn_fwd", real_fwd)

    real_fold = cuda_attention_ext.attn_dkdv

    def no_load(k, v, q, dout, lse, delta, dk, dv, work, n_work, HQ, HKV, D, T, qk, sm, load_acc, fp32, dev, st,
                path=0):
        real_fold(k, v, q, dout, lse, delta, dk, dv, work, n_work, HQ, HKV, D, T, qk, sm, False, fp32, dev, st, path)

    monkeypatch.setattr(stand_in, "attn_dkdv", no_load)
    cand = _candidate("cuda.attention.acc", attn.DEFAULT_CONFIG)

    def with_main_grads(ctx: CallContext) -> CallOutput:  # the fold handed nonzero main grads
        if "cache" not in ctx.state:
            q, k = ctx.inputs["q"], ctx.inputs["k"]
            shape = (sum(ctx.lengths), k.shape[1], k.shape[2])
            ctx.state["start"] = torch.full(shape, 0.25), torch.full(shape, -0.5)
            ctx.state["cache"] = attn.AttentionCache(ctx.lengths, q.shape[1], q.shape[2], q.device,
                                                     kv_heads=k.shape[1], dk=ctx.state["start"][0].clone(),
                                                     dv=ctx.state["start"][1].clone())
        return cand.run(ctx)

    def minus_start(state: dict) -> dict[str, torch.Tensor]:
        dk, dv = state["cache"].finish()
        return {"dK": dk - state["start"][0], "dV": dv - state["start"][1]}

    planted = candidate_from("attention", "cuda.attention.noload", "cuda", with_main_grads,
                             folded_input_grads=minus_start)
    report = check_kernel("attention", planted, shape=GQA, lengths=LENGTHS, layouts=["bn_full"])
    assert not report.ok and "dK" in (report.first_failure or "")


def test_refusals_name_the_problem(stand_in) -> None:
    with pytest.raises(ValueError, match="supported head_dims: 1 to 128"):
        attn.AttentionCache([4], 2, 256, "cpu")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 32, generator=g).bfloat16() for h in (2, 1, 1))
    check_attention_cache_refusals(attn, q, k, v)
    cache = attn.AttentionCache([8, 4], 2, 32, "cpu", kv_heads=1)
    with pytest.raises(ValueError, match="bfloat16"):
        attn.attention(q.float(), k, v, RowIdentity.packed([2], [0], [2]), cache)


def test_cpu_tensors_are_refused_without_the_stand_in() -> None:
    cache = attn.AttentionCache([2], 2, 32, "cpu", kv_heads=1)
    q, k = torch.zeros(2, 2, 32, dtype=torch.bfloat16), torch.zeros(2, 1, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA tensor"):
        attn.attention(q, k, k, RowIdentity.packed([2]), cache)


def test_rewound_decode_step_repeats_its_bits_on_the_stand_in(stand_in) -> None:
    lengths = [9, 6]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(sum(lengths), h, 32, generator=g).bfloat16() for h in (2, 1, 1))
    cache = attn.AttentionCache(lengths, 2, 32, "cpu", kv_heads=1)
    idx = torch.tensor([*range(8), *range(9, 14)])
    attn.attention(q[idx], k[idx], v[idx], RowIdentity.packed([8, 5], [0, 1]), cache)
    mark = cache.mark()
    step, last = RowIdentity.packed([1, 1], [0, 1], [8, 5]), torch.tensor([8, 14])
    first = attn.attention(q[last], k[last], v[last], step, cache)
    cache.rewind(mark)
    again = attn.attention(q[last], k[last], v[last], step, cache)
    assert torch.equal(first.view(torch.int16), again.view(torch.int16))


# ----------------------------------------------------------------------------------------------- GPU


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(raw_bits(a), raw_bits(b))


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize(("shape", "lengths"), [
    (GQA, None),                                             # the default manifest's workload and shape
    (GQA, LONG),
    ({"heads": 8, "kv_heads": 2, "head_dim": 64}, LONG),
    (RELEASE, LONG),                                         # the release manifest's heads
    ({"heads": 8, "kv_heads": 2, "head_dim": 24}, LENGTHS),  # head_dim padded to 32 columns
    ({"heads": 2, "head_dim": 16}, LENGTHS),                 # plain multi-head, the chain's head_dim
    ({"heads": 40, "kv_heads": 2, "head_dim": 64}, LENGTHS), # 20 query heads per K/V head: one head per program
])
def test_every_layout_on_the_gpu(shape, lengths) -> None:
    report = check_kernel("attention", "cuda.attention", shape=shape, lengths=lengths, device="cuda")
    assert report.ok, report.first_failure
    assert set(report.cells) == set(get_op("attention").layouts)


@pytest.mark.gpu
@needs_cuda_kernels
def test_wide_programs_only_on_the_gpu() -> None:
    cand = _candidate("cuda.attention.wide", attn.AttnConfig(narrow=False))
    report = check_kernel("attention", cand, shape=GQA, lengths=LONG, device="cuda",
                          layouts=["bn_chunked", "b1_singleton", "decode"])
    assert report.ok, report.first_failure


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize("fp32_grads", [True, False])
def test_fp32_grads_meets_the_fp32_class_and_bf16_operands_do_not(fp32_grads) -> None:
    cand = _candidate("cuda.attention.grads", attn.AttnConfig(fp32_grads=fp32_grads))
    cell = check_kernel("attention", cand, shape=GQA, lengths=LONG, device="cuda", layouts=["bn_chunked"],
                        contract=_fp32_class_contract(True)).cells["bn_chunked"]
    assert all(m.bitwise_equal for m in cell.tensors)
    judged = {m.name: m for m in cell.tensors if m.accuracy_ok is not None}
    assert judged["dK"].accuracy_class == judged["dV"].accuracy_class == "fp32"
    bad = {name for name, m in judged.items() if not m.accuracy_ok}
    assert bad == (set() if fp32_grads else {"dK", "dV"}), cell.reason


def _qkv(lengths, shape, seed: int = 0, device: str = "cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    n = sum(lengths)
    h, kvh, d = shape["heads"], shape.get("kv_heads", shape["heads"]), shape["head_dim"]
    q, do = (torch.randn(n, h, d, device=device, generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(n, kvh, d, device=device, generator=g).bfloat16() for _ in range(2))
    return q, k, v, do


def _step(calls, lengths, shape, data, config=attn.DEFAULT_CONFIG, grad=True):
    """Calls of (sample, start, stop) pieces over the step's samples; forwards, then backwards in reverse.
    Returns o, dq (in the logical token order of ``lengths``) and dK, dV."""
    q, k, v, do = data
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    cache = attn.AttentionCache(lengths, q.shape[1], q.shape[2], q.device, kv_heads=k.shape[1], config=config)
    o_all, dq_all, pending = torch.zeros_like(q), torch.zeros_like(q), []
    for pieces in calls:
        idx = torch.cat([torch.arange(starts[s] + a, starts[s] + b) for s, a, b in pieces]).to(q.device)
        rows = RowIdentity.packed([b - a for _, a, b in pieces], [s for s, _, _ in pieces], [a for _, a, _ in pieces])
        qi = q[idx].detach().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            o = attn.attention(qi, k[idx], v[idx], rows, cache)
        o_all[idx] = o.detach()
        pending.append((o, qi, idx))
    out = {"o": o_all}
    if grad:
        for o, qi, idx in reversed(pending):
            o.backward(do[idx])
            dq_all[idx] = qi.grad
        out["dq"] = dq_all
        out["dk"], out["dv"] = cache.finish()
    return out


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize("shape", [RELEASE, {"heads": 8, "kv_heads": 2, "head_dim": 64}])
def test_decode_narrow_and_alone_equal_prefill_bit_for_bit(shape) -> None:
    """Full prefill (wide programs) vs: wide programs only; chunks whose tails run on narrow programs; decode of
    the last 20 tokens (narrow programs); each sample alone in its own step (its rows never share a program)."""
    check_prefill_equals_other_layouts(_qkv([200, 37, 129], shape), [200, 37, 129], decode_tail=20)


def check_prefill_equals_other_layouts(data, lengths: list[int], decode_tail: int) -> None:
    """The kernel-level bitwise checks of the GPU test above (also run on the CPU emulation of the kernels)."""
    shape = {"heads": data[0].shape[1], "kv_heads": data[1].shape[1], "head_dim": data[0].shape[2]}
    full = _step([[(s, 0, n) for s, n in enumerate(lengths)]], lengths, shape, data)
    wide = _step([[(s, 0, n) for s, n in enumerate(lengths)]], lengths, shape, data, attn.AttnConfig(narrow=False))
    cuts = [sorted({0, min(n, n // 3 + 7 * s), (2 * n) // 3, n}) for s, n in enumerate(lengths)]  # varied cuts
    chunks = _step([[(s, c[i], c[i + 1]) for s, c in enumerate(cuts) if i + 1 < len(c)] for i in range(3)],
                   lengths, shape, data)
    decode = _step([[(s, 0, n - decode_tail) for s, n in enumerate(lengths)]]
                   + [[(s, n - decode_tail + i, n - decode_tail + i + 1) for s, n in enumerate(lengths)]
                      for i in range(decode_tail)], lengths, shape, data)
    for other in (wide, chunks, decode):
        for name in ("o", "dq", "dk", "dv"):
            assert _same_bits(full[name], other[name]), name
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    for s, n in enumerate(lengths):
        sl = slice(starts[s], starts[s] + n)
        alone = _step([[(0, 0, n)]], [n], shape, tuple(t[sl] for t in data))
        for name in ("o", "dq", "dk", "dv"):
            assert _same_bits(full[name][sl], alone[name]), (s, name)
    infer = _step([[(s, 0, n) for s, n in enumerate(lengths)]], lengths, shape, data, grad=False)
    assert _same_bits(infer["o"], full["o"])


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize("shape", [RELEASE, {"heads": 6, "kv_heads": 2, "head_dim": 96}])
@pytest.mark.parametrize("fp32_grads", [True, False])
def test_wgmma_fold_equals_the_mma_sync_fold_bit_for_bit(shape, fp32_grads, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Hopper at head_dim 65 .. 128 the dK / dV fold runs on wgmma (csrc/attention_dkdv_sm90.cu), elsewhere on
    mma.sync: the two must give the same bits, or the GPU would pick a gradient. Both launched on the stores of
    one step when its fold is due (partial tiles, GQA, a sample of one token), from zero and from main grads."""
    if not runtime.ext().hopper_gemm(torch.cuda.current_device()):
        pytest.skip("the wgmma fold needs an sm_90 GPU")
    seen: dict[tuple[bool, int], tuple[torch.Tensor, torch.Tensor]] = {}
    real_fold = attn._launch_dkdv

    def both_paths(cache) -> None:
        g = torch.Generator(device="cuda")
        shape_acc = (cache.total, cache.kv_heads, cache.head_dim)
        for load_acc in (False, True):
            for path in (1, 2):  # mma.sync, wgmma
                dk = torch.randn(shape_acc, generator=g.manual_seed(7), device="cuda")
                dv = torch.randn(shape_acc, generator=g.manual_seed(8), device="cuda")
                attn.fold_kv(cache, dk, dv, load_acc, path)
                seen[load_acc, path] = (dk, dv)
        real_fold(cache)

    monkeypatch.setattr(attn.AttentionCache, "_launch_dkdv", staticmethod(both_paths))
    lengths = [300, 70, 129, 1, 64]
    _step([[(s, 0, n) for s, n in enumerate(lengths)]], lengths, shape, _qkv(lengths, shape),
          attn.AttnConfig(fp32_grads=fp32_grads))
    torch.cuda.synchronize()
    assert len(seen) == 4
    for load_acc in (False, True):
        (dk1, dv1), (dk2, dv2) = seen[load_acc, 1], seen[load_acc, 2]
        assert torch.isfinite(dk2).all() and torch.isfinite(dv2).all()
        assert not torch.equal(dk2, torch.randn(dk2.shape, generator=torch.Generator(device="cuda").manual_seed(7),
                                                device="cuda"))  # the fold wrote
        assert _same_bits(dk1, dk2), ("dK", load_acc)
        assert _same_bits(dv1, dv2), ("dV", load_acc)


def _on_both_paths(launch, args: tuple, outputs: list[torch.Tensor]) -> tuple[list, list]:
    """``launch(*args, path)`` for path 1 (mma.sync), then path 2 (wgmma; raises where it does not apply), each
    from the same state of ``outputs``; the outputs each left. The second path's stay in place for the step."""
    before = [t.clone() for t in outputs]
    launch(*args, 1)
    first = [t.clone() for t in outputs]
    for t, b in zip(outputs, before):
        t.copy_(b)
    launch(*args, 2)
    return first, [t.clone() for t in outputs]


def _packed_chunked_decode(lengths, shape, data, config, grad: bool) -> None:
    """Three steps over the same samples: one packed call; calls cut at 37, 64 and 200 (programs that start
    mid-block); a prefill of all but the last two tokens, then two decode calls of one token per sample."""
    cuts = [[0, 37, 64, 200, n] if n > 200 else [0, n] for n in lengths]
    _step([[(s, 0, n) for s, n in enumerate(lengths)]], lengths, shape, data, config, grad)
    _step([[(s, c[i], c[i + 1]) for s, c in enumerate(cuts) if i + 1 < len(c)] for i in range(4)], lengths, shape,
          data, config, grad)
    _step([[(s, 0, n - 2 if n > 2 else n) for s, n in enumerate(lengths)]]
          + [[(s, n - 2 + i, n - 1 + i) for s, n in enumerate(lengths) if n > 2] for i in range(2)], lengths, shape,
          data, config, grad)


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize("shape", [RELEASE, {"heads": 6, "kv_heads": 2, "head_dim": 96},
                                   {"heads": 40, "kv_heads": 2, "head_dim": 128}])
def test_wgmma_forward_equals_the_mma_sync_forward_bit_for_bit(shape, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Hopper at head_dim 65 .. 128 the wide forward programs run on wgmma (csrc/attention_fwd_sm90.cu), elsewhere
    on mma.sync: the two must give the same o and lse bits, or the GPU would pick a log-prob. Both launched from the
    same state on every call of a packed step, a chunked one (programs that start mid-block) and a decode one, with
    an Inf planted in V at a later token: rows a masked block lies wholly after must keep their state exactly."""
    if not runtime.ext().hopper_gemm(torch.cuda.current_device()):
        pytest.skip("the wgmma forward needs an sm_90 GPU")
    real_launch = attn._launch_fwd
    seen: list[tuple[torch.Tensor, ...]] = []

    def both_paths(q, o, plan, cache, path=0) -> None:
        seen.append((*_on_both_paths(real_launch, (q, o, plan, cache), [o, cache.lse]), plan.fwd.wide.shape[0]))

    monkeypatch.setattr(attn, "_launch_fwd", both_paths)
    lengths = [300, 70, 129, 1, 64]
    q, k, v, do = _qkv(lengths, shape)
    v = v.clone()
    v[250, 0, 3] = float("inf")  # sample 0, position 250: past the rows of every program that ends before it
    data = (q, k, v, do)
    _packed_chunked_decode(lengths, shape, data, attn.DEFAULT_CONFIG, grad=False)
    torch.cuda.synchronize()
    assert sum(w for *_, w in seen) > 0  # wide programs ran on both paths
    for i, ((o1, lse1), (o2, lse2), _) in enumerate(seen):
        assert _same_bits(o1, o2), ("o", i)
        assert _same_bits(lse1, lse2), ("lse", i)


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize("shape", [RELEASE, {"heads": 6, "kv_heads": 2, "head_dim": 96}])
@pytest.mark.parametrize("fp32_grads", [True, False])
def test_wgmma_dq_equals_the_mma_sync_dq_bit_for_bit(shape, fp32_grads, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Hopper at head_dim 65 .. 128 the wide dQ programs run on wgmma (csrc/attention_dq_sm90.cu), elsewhere on
    mma.sync: the two must give the same dq and delta bits (the exact delta with fp32 grads, delta_o without). Both
    launched from the same state on every backward call of a packed step, a chunked one and a decode one, with an Inf
    planted in K and V at a later token: rows a masked block lies wholly after must keep dq exactly."""
    if not runtime.ext().hopper_gemm(torch.cuda.current_device()):
        pytest.skip("the wgmma dQ needs an sm_90 GPU")
    real_launch = attn._launch_dq
    seen: list[tuple[torch.Tensor, ...]] = []

    def both_paths(q, o, do, dq, plan, cache, path=0) -> None:
        seen.append((*_on_both_paths(real_launch, (q, o, do, dq, plan, cache), [dq, cache.delta]),
                     plan.dq.wide.shape[0]))

    monkeypatch.setattr(attn, "_launch_dq", both_paths)
    lengths = [300, 70, 129, 1, 64]
    q, k, v, do = _qkv(lengths, shape)
    k, v = k.clone(), v.clone()
    k[250, 0, 3] = float("inf")  # sample 0, position 250: past the rows of every program that ends before it
    v[250, 0, 5] = float("inf")
    data = (q, k, v, do)
    config = attn.AttnConfig(fp32_grads=fp32_grads)
    _packed_chunked_decode(lengths, shape, data, config, grad=True)
    torch.cuda.synchronize()
    assert sum(w for *_, w in seen) > 0  # wide programs ran on both paths
    for i, ((dq1, delta1), (dq2, delta2), _) in enumerate(seen):
        assert _same_bits(dq1, dq2), ("dq", i)
        assert _same_bits(delta1, delta2), ("delta", i)


@pytest.mark.gpu
@needs_cuda_kernels
def test_signed_zero_of_a_masked_key_never_reaches_o() -> None:
    """Row BN + 4 of one sample: block 0 gives acc[:, 0] < 0, key BN scores ~255 (log2) so the rescale underflows
    acc to -0; keys BN..row hold v[:, 0] = -0, keys after it (masked for the row) -1: a masked key adds 0 * -1 = -0
    when its slot was written (one call) and 0 * (+0) when it was not (the row ends the first of two calls)."""
    bn = 64
    n, r, heads, kvh, d = 2 * bn, bn + 4, 4, 2, 32
    q = torch.zeros(n, heads, d, device="cuda")
    q[:, :, 0] = 1.0
    g = torch.Generator(device="cuda").manual_seed(5)
    k = torch.randn(n, kvh, d, device="cuda", generator=g) * 0.1
    k[:, :, 0] = 0.0
    k[bn, :, 0] = 1000.0
    v = torch.randn(n, kvh, d, device="cuda", generator=g)
    v[:bn, :, 0] = -1e-30
    v[bn:r + 1, :, 0] = -0.0
    v[r + 1:, :, 0] = -1.0
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()

    def run(calls):
        cache = attn.AttentionCache([n], heads, d, "cuda", kv_heads=kvh)
        with torch.no_grad():
            return torch.cat([attn.attention(q[a:b], k[a:b], v[a:b], RowIdentity.packed([b - a], [0], [a]), cache)
                              for a, b in calls])

    one, two = run([(0, n)]), run([(0, r + 1), (r + 1, n)])
    assert _same_bits(one, two)
    assert not torch.signbit(one[one == 0]).any()


@pytest.mark.gpu
@needs_cuda_kernels
def test_cuda_chain_runs_on_the_cuda_attention() -> None:
    """The Qwen3-shaped chain in the CUDA family (every op its own family's kernel), the default manifest's shape."""
    base = load_manifest(DEFAULT_MANIFEST)
    layouts = base.ops["chain"].layouts or None
    report = check_kernel("chain", "cuda.chain", device="cuda", layouts=layouts)
    assert report.ok, report.first_failure
    report = check_kernel("chain", "cuda.chain", device="cuda", lengths=[12, 1, 7], layouts=["decode"])
    assert report.ok, report.first_failure


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        attn.DEFAULT_CONFIG.narrow = False  # type: ignore[misc]
