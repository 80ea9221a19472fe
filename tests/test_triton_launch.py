"""The Triton family's direct launch path (``triton_kernels._launch``): after the first launch of a specialisation
the compiled kernel's C launcher gets exactly the arguments Triton's runner would give it; the runner runs
instead where the direct call would differ (launch hooks set, scratch to allocate); a new specialisation
compiles again. CPU tests drive it with a fake jit function and compiled kernel; the GPU test compares its
bits with a plain launch of a real kernel."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from gradsweep.triton_kernels import _launch
from tests.helpers import run_compiled


@dataclass
class _Param:
    name: str
    is_constexpr: bool


@dataclass
class _Launcher:
    calls: list
    global_scratch_size: int = 0
    profile_scratch_size: int = 0
    launch_cooperative_grid: bool = False
    launch_pdl: bool = True

    def launch(self, *args) -> None:
        self.calls.append(("direct", args))


@dataclass
class _Compiled:
    calls: list
    scratch: int = 0
    function: int = 0xF00
    packed_metadata: tuple = (4, 1, 2048)
    run: _Launcher = field(init=False)

    def __post_init__(self) -> None:
        self.run = _Launcher(self.calls, global_scratch_size=self.scratch)

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(("runner", grid, args))


class _Jit:
    """A jit function with two runtime parameters and one constexpr; ``fn[grid](...)`` compiles."""

    params = (_Param("a", False), _Param("n", False), _Param("BLOCK", True))

    def __init__(self, scratch: int = 0) -> None:
        self.calls: list = []
        self.scratch = scratch

    def __getitem__(self, grid):
        def compile_and_launch(*args, **kwargs):
            self.calls.append(("compile", grid, args, kwargs))
            return _Compiled(self.calls, self.scratch)
        return compile_and_launch


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(_launch, "FAST_LAUNCH", True)
    monkeypatch.setattr(_launch, "_device", lambda: 3)
    monkeypatch.setattr(_launch, "_raw_stream", lambda device: 1000 + device)
    monkeypatch.setattr(_launch, "_hooks_set", lambda: False)


def test_second_launch_calls_the_c_launcher_with_the_runners_arguments(fast) -> None:
    fn = _Jit()
    launch = _launch.FastLaunch(fn)
    launch((5,), [7.5, 32], {"BLOCK": 64}, num_warps=4)
    launch((6, 2), [2.5, 48], {"BLOCK": 64}, num_warps=4)
    assert fn.calls[0] == ("compile", (5, 1, 1), (7.5, 32), {"BLOCK": 64, "num_warps": 4, "num_stages": 3})
    # grid, stream of the current device, function, cooperative, pdl, two scratch, metadata, launch metadata,
    # two hooks, then the arguments and the constexpr values in parameter order
    assert fn.calls[1] == ("direct", (6, 2, 1, 1003, 0xF00, False, True, None, None, (4, 1, 2048), None, None, None,
                                      2.5, 48, 64))
    assert len(fn.calls) == 2


def test_a_new_specialisation_compiles_again(fast) -> None:
    fn = _Jit()
    launch = _launch.FastLaunch(fn)
    launch((1,), [1.0, 32], {"BLOCK": 64}, num_warps=4)
    launch((1,), [1.0, 1], {"BLOCK": 64}, num_warps=4)        # n == 1: Triton specialises on it
    launch((1,), [1.0, 33], {"BLOCK": 64}, num_warps=4)       # n % 16 != 0
    launch((1,), [1.0, 32], {"BLOCK": 128}, num_warps=4)      # another constexpr
    launch((1,), [1.0, 32], {"BLOCK": 64}, num_warps=8)       # other warps
    assert [c[0] for c in fn.calls] == ["compile"] * 5
    launch((1,), [2.0, 64], {"BLOCK": 64}, num_warps=4)       # the first specialisation again
    assert fn.calls[-1][0] == "direct"


def test_another_device_compiles_its_own(fast, monkeypatch) -> None:
    """A compiled kernel's function handle belongs to the device it was loaded on: a launch with another current
    device compiles (loads) again, and each device's launches use that device's stream."""
    fn = _Jit()
    launch = _launch.FastLaunch(fn)
    launch((1,), [1.0, 32], {"BLOCK": 64}, num_warps=4)
    monkeypatch.setattr(_launch, "_device", lambda: 5)
    launch((1,), [1.0, 32], {"BLOCK": 64}, num_warps=4)
    assert [c[0] for c in fn.calls] == ["compile", "compile"]
    launch((1,), [1.0, 32], {"BLOCK": 64}, num_warps=4)
    assert fn.calls[-1][0] == "direct" and fn.calls[-1][1][3] == 1005


def test_hooks_or_scratch_take_the_runner(fast, monkeypatch) -> None:
    fn = _Jit(scratch=256)
    launch = _launch.FastLaunch(fn)
    launch((2,), [1.0, 16], {"BLOCK": 64}, num_warps=4)
    launch((2,), [1.0, 16], {"BLOCK": 64}, num_warps=4)
    assert fn.calls[-1] == ("runner", (2, 1, 1), (1.0, 16, 64))
    fn = _Jit()
    launch = _launch.FastLaunch(fn)
    launch((2,), [1.0, 16], {"BLOCK": 64}, num_warps=4)
    # the bound arguments marked: the runner gets the arguments as given (a hook's metadata may read tensors),
    # the C launcher the bound ones
    real_bind = _launch._bind
    monkeypatch.setattr(_launch, "_bind", lambda args: (real_bind(args)[0], ["address", *args[1:]]))
    monkeypatch.setattr(_launch, "_hooks_set", lambda: True)
    launch((2,), [1.0, 16], {"BLOCK": 64}, num_warps=4)
    assert fn.calls[-1] == ("runner", (2, 1, 1), (1.0, 16, 64))
    monkeypatch.setattr(_launch, "_hooks_set", lambda: False)
    launch((2,), [1.0, 16], {"BLOCK": 64}, num_warps=4)
    assert fn.calls[-1][0] == "direct" and fn.calls[-1][1][13:] == ("address", 16, 64)


def test_host_descriptors_are_expanded_as_tritons_wrapper_does_and_kept(fast, monkeypatch) -> None:
    """A kernel with host TMA descriptors: the direct path calls the C launcher inside Triton's descriptor wrapper
    with exactly the arguments the wrapper would give it (Triton's own wrapper, a recording C launcher and a fake
    encoder as the driver's), encodes each (address, shape, strides, metadata) once, and encodes again for a new
    address. A plain C launcher (the other tests) is left as it is."""
    import triton
    from triton.backends.nvidia import driver as nvd
    from triton.tools.tensor_descriptor import TensorDescriptor

    fills: list = []

    class _Utils:
        def fill_tma_descriptor(self, *a):
            fills.append(a)
            return ("tensormap", *a[:2], tuple(a[4]), tuple(a[5]), tuple(a[6]))

    monkeypatch.setattr(triton.runtime.driver, "_active", type("_Driver", (), {"utils": _Utils()})())
    meta_a = {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": [64, 64], "fp4_padded": False}
    meta_c = {"swizzle": 2, "elem_size": 2, "elem_type": 10, "block_size": [64, 32], "fp4_padded": False}
    signature = {"a": "tensordesc<bf16[64, 64]>", "n": "i32", "c": "tensordesc<bf16[64, 32]>", "BLOCK": "constexpr"}
    raw_calls: list = []
    compiled = _Compiled([])
    compiled.run.launch = nvd.wrap_handle_tensordesc(lambda *a: raw_calls.append(a), signature, [meta_a, meta_c])
    direct = _launch.Direct(compiled, (128,))
    if direct.descs is None and not triton.__version__.startswith("3.6."):
        pytest.skip(f"triton {triton.__version__}'s descriptor wrapper has another shape: FastLaunch leaves it be")
    assert direct.descs is not None and [d[0] for d in direct.descs] == [0, 2]
    x, y, z = (torch.zeros(128, 256, dtype=torch.bfloat16) for _ in range(3))

    def descs(base_a, base_c):
        return [TensorDescriptor(base_a, [128, 256], [256, 1], [64, 64]), 77,
                TensorDescriptor(base_c, [128, 256], [256, 1], [64, 32])]

    for args in (descs(x, y), descs(x, y), descs(z, y)):  # the third: a new address for the first descriptor
        direct((2, 1, 1), args, list(args), False, 3)
        ours = raw_calls.pop()
        compiled.run.launch(2, 1, 1, 1003, *direct.head, *args, 128)  # Triton's own expansion, for reference
        assert ours == raw_calls.pop()
    assert len(fills) == 2 + 2 + 2 + 1 + 2  # ours: 2, 0, 1; Triton's wrapper: 2 every launch


def test_a_memoised_launch_builds_its_arguments_once_per_key_and_device(fast, monkeypatch) -> None:
    """``FastLaunch.memo``: the first call of a key builds, compiles and launches; later calls with the key call the
    C launcher with the same arguments without building them; another key or another device builds again; hooks
    set take the ordinary path (built anew, the runner launches); without fast launch every call is a plain one."""
    fn = _Jit()
    launch = _launch.FastLaunch(fn)
    built: list = []

    def build(x: float):
        def make():
            built.append(x)
            return (4,), [x, 32], {"BLOCK": 64}, 4, 3
        return make

    launch.memo(("k", 1), build(1.0))  # built, compiled (the first launch) and kept
    launch.memo(("k", 1), build(9.9))  # the key determines the arguments: the kept ones, nothing built
    launch.memo(("k", 1), build(9.9))
    assert built == [1.0] and [c[0] for c in fn.calls] == ["compile", "direct", "direct"]
    assert fn.calls[1] == fn.calls[2] and fn.calls[2][1][13:] == (1.0, 32, 64)
    launch.memo(("k", 2), build(2.0))  # another key: built (the specialisation is compiled already)
    assert built[-1] == 2.0 and fn.calls[-1][1][13:] == (2.0, 32, 64)
    monkeypatch.setattr(_launch, "_device", lambda: 5)
    launch.memo(("k", 1), build(5.0))  # another device: its own compile and its own entry
    assert built[-1] == 5.0 and fn.calls[-1][0] == "compile"
    monkeypatch.setattr(_launch, "_device", lambda: 3)
    monkeypatch.setattr(_launch, "_hooks_set", lambda: True)
    launch.memo(("k", 1), build(7.0))
    assert built[-1] == 7.0 and fn.calls[-1] == ("runner", (4, 1, 1), (7.0, 32, 64))
    monkeypatch.setattr(_launch, "FAST_LAUNCH", False)
    launch.memo(("k", 1), build(8.0))
    assert built[-1] == 8.0 and fn.calls[-1][0] == "compile"


def test_replay_all_launches_every_memoised_key_in_order_or_none(fast, monkeypatch) -> None:
    """``FastLaunch.replay_all``: every key memoised on this device: each launched with its kept arguments, in the
    order given; one key missing (never memoised, or on another device), hooks set or no fast launch: nothing
    launched and False (a caller replaying a split fold must never run part of it)."""
    fn = _Jit()
    launch = _launch.FastLaunch(fn)
    for key, x in (("a", 1.0), ("b", 2.0)):
        launch.memo(key, lambda x=x: ((4,), [x, 32], {"BLOCK": 64}, 4, 3))
    n = len(fn.calls)
    assert launch.replay_all(("b", "a")) is True
    assert [c[1][13:] for c in fn.calls[n:]] == [(2.0, 32, 64), (1.0, 32, 64)]
    n = len(fn.calls)
    assert launch.replay_all(("a", "c")) is False and len(fn.calls) == n  # "c" never memoised: nothing launched
    monkeypatch.setattr(_launch, "_device", lambda: 5)
    assert launch.replay_all(("a",)) is False and len(fn.calls) == n  # memoised on device 3 only
    monkeypatch.setattr(_launch, "_device", lambda: 3)
    monkeypatch.setattr(_launch, "_hooks_set", lambda: True)
    assert launch.replay_all(("a",)) is False and len(fn.calls) == n
    monkeypatch.setattr(_launch, "_hooks_set", lambda: False)
    monkeypatch.setattr(_launch, "FAST_LAUNCH", False)
    assert launch.replay_all(("a",)) is False and len(fn.calls) == n


def test_hook_detection_reads_tritons_hook_chains() -> None:
    class Chain:
        def __init__(self, calls):
            self.calls = calls
    assert not _launch._hook_set(None)
    assert not _launch._hook_set(Chain([]))
    assert _launch._hook_set(Chain([print]))
    assert _launch._hook_set(print)  # a plain hook function (older Triton)


def test_a_tma_descriptor_is_keyed_by_dtype_block_and_padding() -> None:
    """Triton specialises a host TMA descriptor argument on its dtype, block shape and padding (the kernel's
    signature is ``tensordesc<bf16[64, 128]>``): a descriptor of another dtype or block must not reuse the compiled
    kernel of the first. The descriptor itself goes to the launcher (Triton's wrapped launcher encodes it)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    base = torch.zeros(256, 128, dtype=torch.bfloat16)
    desc = TensorDescriptor(base, [256, 128], [128, 1], [64, 128])
    key, bound = _launch._bind([desc, 7])
    assert bound[0] is desc
    others = [TensorDescriptor(base, [256, 128], [128, 1], [32, 128]),
              TensorDescriptor(base.half(), [256, 128], [128, 1], [64, 128]),
              TensorDescriptor(base, [256, 128], [128, 1], [64, 128], padding="nan")]
    assert all(_launch._bind([d, 7])[0] != key for d in others)
    same = TensorDescriptor(torch.ones(512, 128, dtype=torch.bfloat16), [512, 128], [128, 1], [64, 128])
    assert _launch._bind([same, 7])[0] == key  # shape and address are runtime values, not the specialisation


def test_a_tensor_off_the_gpu_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="tensor on cpu"):
        _launch._bind([torch.zeros(2), 3])


def test_runtime_parameter_after_a_constexpr_is_refused() -> None:
    class Bad(_Jit):
        params = (_Param("BLOCK", True), _Param("n", False))
    with pytest.raises(ValueError, match="runtime parameter after a constexpr"):
        _launch.FastLaunch(Bad())


_GPU_SCRIPT = r"""
import torch, triton
from gradsweep.triton_kernels import _launch
from gradsweep.triton_kernels._common import FOLD_BLOCK, _fold_kernel
assert _launch.FAST_LAUNCH
gen = torch.Generator(device="cuda").manual_seed(5)
part = torch.randn(37, 1000, generator=gen, device="cuda")
start = torch.randn(1000, generator=gen, device="cuda")
grid = ((1000 + FOLD_BLOCK - 1) // FOLD_BLOCK,)
plain = start.clone()
_fold_kernel[grid](part, plain, 37, 1000, BLOCK=FOLD_BLOCK, UNROLL=8, num_warps=1)
launch = _launch.FastLaunch(_fold_kernel)
seen = []
def hook(meta):
    seen.append(meta)
outs = []
for k in range(4):  # compile, two direct launches, then one with a launch hook set (the runner's path)
    if k == 3:
        triton.knobs.runtime.launch_enter_hook.add(hook)
    acc = start.clone()
    launch(grid, [part, acc, 37, 1000], {"BLOCK": FOLD_BLOCK, "UNROLL": 8}, num_warps=1)
    outs.append(acc)
triton.knobs.runtime.launch_enter_hook.remove(hook)
torch.cuda.synchronize()
(direct,) = launch.compiled.values()
assert direct.launch is not None, "the direct path was not taken"
assert len(seen) == 1, seen
for acc in outs:
    assert torch.equal(acc.view(torch.int32), plain.view(torch.int32))
print("GPU-OK")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_direct_launch_bits_equal_a_plain_launch() -> None:
    """Compiled kernels (no interpreter, so in a clean process): direct launches give a plain launch's bits, and a
    launch hook set later runs (the runner's path)."""
    res = run_compiled(_GPU_SCRIPT, timeout=300, drop=("TRITON_INTERPRET", "GRADSWEEP_FAST_LAUNCH"))
    assert "GPU-OK" in res.stdout, res.stdout + res.stderr


_GPU_TMA_SCRIPT = r"""
import torch
from gradsweep.triton_kernels import _launch, gemm
assert _launch.FAST_LAUNCH
gen = torch.Generator(device="cuda").manual_seed(6)
w = torch.randn(1024, 512, generator=gen, device="cuda").bfloat16()
x = torch.randn(4096, 512, generator=gen, device="cuda").bfloat16()
ms = (4096, 256, 4096, 700, 256, 16, 1, 100)  # the TMA kernel from 256 rows, the pointer kernel below
fast = []
for m in ms:  # new outputs each call: kept tensor maps hit for x and w, miss for outputs
    fast.append(gemm.matmul_invariant(x[:m], w))
torch.cuda.synchronize()
directs = list(gemm._MM_TMA.compiled.values())
assert directs and all(d.descs is not None for d in directs), "the descriptors were not expanded here"
again = {}
for m in ms * 3:  # outputs freed between calls: the same buffers again, the memoised launches
    again[m] = gemm.matmul_invariant(x[:m], w).clone()
acc = torch.zeros(64, 1024, device="cuda")
for _ in range(4):  # the accumulating pointer GEMM on one accumulator: memoised after its first launches
    gemm.matmul_accumulate(x[:64], w.t(), acc)
torch.cuda.synchronize()
assert gemm._MM_TMA._memo and gemm._MM.launch._memo and gemm._MM_SWAP.launch._memo, "no launch was memoised"
_launch.FAST_LAUNCH = False  # Triton's own launch path: its wrapper encodes every descriptor
for m, out in zip(ms, fast):
    plain = gemm.matmul_invariant(x[:m], w)
    assert torch.equal(out.view(torch.int16), plain.view(torch.int16)), m
    assert torch.equal(again[m].view(torch.int16), plain.view(torch.int16)), m
plain_acc = torch.zeros(64, 1024, device="cuda")
for _ in range(4):
    gemm.matmul_accumulate(x[:64], w.t(), plain_acc)
assert torch.equal(acc.view(torch.int32), plain_acc.view(torch.int32))
print("GPU-OK")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kept_tensor_maps_give_a_plain_launchs_bits() -> None:
    """The family's GEMMs through the direct path (TMA descriptors expanded and kept, launches memoised): the bits of
    Triton's own launch path at several M, with kept maps and memoised launches reused across calls and new output
    addresses, and for the accumulating GEMM over repeated launches on one accumulator."""
    res = run_compiled(_GPU_TMA_SCRIPT, timeout=300, drop=("TRITON_INTERPRET", "GRADSWEEP_FAST_LAUNCH"))
    assert "GPU-OK" in res.stdout, res.stdout + res.stderr


def test_host_grid_arithmetic_equals_tritons() -> None:
    """``_common.cdiv`` / ``pow2`` (plain integers, ~0.1 us) give what ``triton.cdiv`` / ``next_power_of_2``
    (ConstexprFunctions, ~5 us a call) give: the same grids and block sizes, so the same launches."""
    import triton

    from gradsweep.triton_kernels._common import cdiv, pow2

    values = [*range(0, 1100), *(2 ** k + d for k in range(10, 40) for d in (-1, 0, 1))]
    for a in values:
        for b in (1, 2, 3, 7, 16, 64, 128, 1000):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
        assert pow2(a) == int(triton.next_power_of_2(max(a, 1))), a
    assert pow2(-5) == 1


def _plain_gpu_launches(source: str) -> list[int]:
    """Lines of ``name_kernel[grid](...)`` calls outside the body of an ``if INTERPRET`` (the interpreter's path)."""
    tree = ast.parse(source)
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        if any(isinstance(n, ast.Name) and n.id == "INTERPRET" for n in ast.walk(node.test)):
            allowed |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
            and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("_kernel")
            and id(node) not in allowed]


def test_every_gpu_launch_of_the_family_goes_through_fastlaunch() -> None:
    """On the GPU every Triton kernel of the family launches through ``FastLaunch`` (directly or through a
    ``Tuner``): Triton's own ``kernel[grid]`` costs ~50-80 us of Python a launch on the lent H200 hosts. A plain
    launch is allowed only on the interpreter's path (``if INTERPRET:``)."""
    root = Path(_launch.__file__).parent
    found = {p.name: _plain_gpu_launches(p.read_text()) for p in sorted(root.glob("*.py"))}
    assert not {name: lines for name, lines in found.items() if lines}
    planted = "def f():\n    _x_kernel[(1,)](a)\n    if INTERPRET:\n        _y_kernel[(1,)](a)\n"
    assert _plain_gpu_launches(planted) == [2]  # the audit sees a plain launch, and lets the interpreter's pass
