"""The Triton family's launch path: a compiled specialisation called through Triton's own C launcher directly.

Why: on the H200's host a launch through ``kernel[grid](...)`` or ``compiled[grid](...)`` costs ~50-80 us of
Python (argument binding and hashing, a runner closure per call, device and stream lookups through the driver
proxy, two scratch allocators, ``data_ptr()`` and ``cuPointerGetAttribute`` per tensor inside the launcher),
against ~7 us for a CUDA C++ launch through pybind11; a small-M GEMM or a norm backward is host-bound by it.

``FastLaunch`` compiles a specialisation through the jit function once (Triton's normal path: compilation,
caching, checks), keeps the compiled kernel, and from then on calls its C launcher with the same arguments
Triton would pass, resolved once: the function handle, the packed metadata, the cooperative / PDL flags; the
stream is torch's current raw stream; tensors go in as their device addresses (read once per call, also for the
specialisation key). Same kernel, same grid, same arguments: the same bits. The direct call is taken only where
it is exactly what Triton would do: no launch hooks set (profilers such as proton set them), no global or
profile scratch to allocate; otherwise the compiled kernel's own runner runs. Under the interpreter, or with
GRADSWEEP_FAST_LAUNCH=0, every launch is a plain ``kernel[grid](...)``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import triton

# Read once, before any kernel is decorated: TRITON_INTERPRET must be set before import (the family's one reading
# of it: _common re-exports INTERPRET).
INTERPRET: bool = os.environ.get("TRITON_INTERPRET") == "1"
FAST_LAUNCH = os.environ.get("GRADSWEEP_FAST_LAUNCH", "1") == "1" and not INTERPRET


def _bind(args) -> tuple[tuple, list]:
    """(specialisation key, launcher arguments): a tensor becomes its device address (once per call). The key is
    what Triton specialises a launch on: tensor dtype and 16-byte alignment; ints == 1, % 16, width; a TMA
    descriptor's dtype, block shape and padding."""
    spec: list = []
    out: list = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if not a.is_cuda:
                raise ValueError(f"a Triton kernel got a tensor on {a.device}; its arguments must be on the GPU")
            ptr = a.data_ptr()
            spec.append((a.dtype, ptr % 16 == 0))
            out.append(ptr)
            continue
        if isinstance(a, bool) or a is None:
            spec.append(a)
        elif hasattr(a, "block_shape") and hasattr(a, "base"):  # a host TMA descriptor: Triton specialises on these
            spec.append((type(a), a.base.dtype, tuple(a.block_shape), getattr(a, "padding", None)))
        elif isinstance(a, int):
            spec.append((a == 1, a % 16 == 0, -(2 ** 31) <= a < 2 ** 31, a < 2 ** 63))
        else:
            spec.append(type(a))
        out.append(a)
    return tuple(spec), out


class Direct:
    """One compiled specialisation and everything its C launcher needs except grid, stream and arguments.

    ``launch`` is None where the direct call would not be what Triton does (scratch to allocate, or a Triton
    without the attributes read here): then the compiled kernel's runner launches. For a kernel with host TMA
    descriptors, ``launch`` is the C launcher inside Triton's descriptor wrapper and ``descs`` says where the
    descriptors stand: each is expanded as the wrapper would (``_tensormap_args``), its encoded tensor map kept.
    """

    __slots__ = ("compiled", "descs", "expand", "head", "launch", "tail")

    def __init__(self, compiled, const_values: tuple) -> None:
        self.compiled, self.tail = compiled, const_values
        self.descs: tuple | None = None
        self.expand = None
        run = compiled.run  # Triton's CudaLauncher (loads the module and function handles on first access)
        try:
            plain = run.global_scratch_size == 0 and run.profile_scratch_size == 0
            self.launch = run.launch if plain else None
            self.head = (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                         compiled.packed_metadata, None, None, None)
        except AttributeError:  # another Triton's launcher: its runner only
            self.launch, self.head = None, ()
        if self.launch is not None:
            unwrapped = _unwrap_tensordesc(self.launch, 4 + len(self.head))
            if unwrapped is not None:
                self.launch, self.descs, self.expand = unwrapped

    def __call__(self, grid: tuple[int, int, int], args: list, bound: list, hooks: bool, device: int) -> None:
        """``args`` as given (what a hook's launch metadata may read), ``bound`` with tensors as addresses."""
        if self.launch is None or hooks:
            self.compiled[grid](*args, *self.tail)
            return
        self.launch(grid[0], grid[1], grid[2], _raw_stream(device), *self.head, *self.expanded(bound), *self.tail)

    def expanded(self, bound: list) -> list:
        """The C launcher's arguments for ``bound``: each host descriptor expanded as Triton's wrapper would."""
        if self.descs is None:
            return bound
        bound = list(bound)
        for pos, meta, meta_key in reversed(self.descs):  # from the last: earlier positions stay put
            bound[pos:pos + 1] = _tensormap_args(bound[pos], meta, meta_key, self.expand)
        return bound


# Host TMA descriptors, expanded. Triton 3.6 wraps the C launcher of a kernel with tensor-descriptor parameters in
# a Python function (``wrap_handle_tensordesc``) that loops over every argument and encodes each descriptor's
# CUtensorMap (``make_tensordesc_arg`` -> ``fill_tma_descriptor``) at every launch: three encodes and the loop per
# TMA GEMM, which a small-M step pays on the host. The expansion is a pure function of the descriptor's base
# address, shape, strides and padding and of the kernel's descriptor metadata (swizzle, element type and size,
# block, fp4 padding), so its result for the same inputs is kept and reused: the same bytes reach the kernel.
_TENSORMAPS: dict[tuple, list] = {}
_TENSORMAPS_MAX = 4096  # entries (~200 bytes each); the whole table is dropped when full
_MEMO_MAX = 4096  # memoised launches per kernel (``FastLaunch.memo``), dropped together when full


def _unwrap_tensordesc(launch, base_len: int) -> tuple | None:
    """(C launcher, ((position, metadata, metadata key), ...), expansion) when ``launch`` is Triton's
    descriptor wrapper with metadata for every descriptor and the argument layout read here; None otherwise (a
    plain C launcher, or a wrapper of another shape: it stays as it is)."""
    code, cells = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
    if code is None or cells is None:
        return None
    free = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
    glob = getattr(launch, "__globals__", {})
    raw, where, metas = free.get("launcher"), free.get("tensordesc_indices"), free.get("tensordesc_meta")
    expand = glob.get("make_tensordesc_arg")
    if raw is None or expand is None or glob.get("_BASE_ARGS_FORMAT_LEN") != base_len:
        return None
    if not isinstance(where, (set, frozenset)) or not isinstance(metas, list) or len(where) != len(metas):
        return None
    descs = []
    for pos, meta in zip(sorted(where), metas):
        if meta is None:  # Triton passes the tensor itself for these: nothing to keep, leave the wrapper
            return None
        descs.append((pos, meta, (meta["swizzle"], meta["elem_size"], meta["elem_type"],
                                  tuple(meta["block_size"]), meta["fp4_padded"])))
    return raw, tuple(descs), expand


def _tensormap_args(desc, meta: dict, meta_key: tuple, expand) -> list:
    """Triton's expansion of one host descriptor (``[tensor map, *shape, *strides]``), kept per input."""
    key = (desc.base.data_ptr(), tuple(desc.shape), tuple(desc.strides), desc.padding, meta_key)
    hit = _TENSORMAPS.get(key)
    if hit is None:
        hit = expand(desc, meta)
        if len(_TENSORMAPS) >= _TENSORMAPS_MAX:
            _TENSORMAPS.clear()
        _TENSORMAPS[key] = hit
    return hit


def _device() -> int:
    return torch._C._cuda_getDevice()


def _raw_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)


def _hook_set(hook) -> bool:
    """A launch hook that would run: Triton 3.6 keeps an always-present HookChain (set = it holds calls);
    older releases keep None or a function."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or len(calls) > 0


def _hooks_set() -> bool:
    rt = triton.knobs.runtime
    return _hook_set(rt.launch_enter_hook) or _hook_set(rt.launch_exit_hook)


class FastLaunch:
    """Launches of one jit kernel (see the module docstring). Constexpr parameters must come after every
    runtime parameter (they are passed positionally)."""

    def __init__(self, fn) -> None:
        self.fn = fn
        params = getattr(fn, "params", None) or []
        self.const_names = [p.name for p in params if p.is_constexpr]
        flags = [p.is_constexpr for p in params]
        if flags and flags != sorted(flags):
            raise ValueError(f"FastLaunch: {getattr(fn, '__name__', fn)} has a runtime parameter after a constexpr")
        self.compiled: dict[tuple, Direct] = {}
        self._memo: dict[tuple, tuple] = {}  # (device, caller's key) -> (Direct, grid, the launcher's arguments)

    def __call__(self, grid: tuple[int, ...], args: list, consts: dict, num_warps: int, num_stages: int = 3) -> None:
        if not FAST_LAUNCH:
            self.fn[grid](*args, **consts, num_warps=num_warps, num_stages=num_stages)
            return
        g = (*grid, 1, 1)[:3]
        spec, bound = _bind(args)
        device = _device()  # a compiled kernel's function handle belongs to the device it was loaded on
        key = (device, tuple(consts.items()), num_warps, num_stages, spec)
        direct = self.compiled.get(key)
        if direct is None:
            compiled = self.fn[g](*args, **consts, num_warps=num_warps, num_stages=num_stages)
            self.compiled[key] = Direct(compiled, tuple(consts[n] for n in self.const_names))
            return
        direct(g, args, bound, _hooks_set(), device)

    def replay_all(self, keys: tuple[tuple, ...]) -> bool:
        """Launch the memoised launches of ``keys`` (``memo``'s keys), in order, and return True; or launch none and
        return False where any of them is not memoised on the current device (never seen, or the memo was dropped),
        launch hooks are set or there is no fast launch. All or none: a caller replaying a fold split over several
        launches must never run part of it and then the whole of it again."""
        if not FAST_LAUNCH or _hooks_set():
            return False
        device = _device()
        hits = [self._memo.get((device, key)) for key in keys]
        if not all(hits):
            return False
        stream = _raw_stream(device)
        for direct, g, expanded in hits:
            direct.launch(g[0], g[1], g[2], stream, *direct.head, *expanded, *direct.tail)
        return True

    def memo(self, key: tuple, build: Callable[[], tuple[tuple[int, ...], list, dict, int, int]]) -> None:
        """Launch ``build()``'s ``(grid, args, consts, num_warps, num_stages)``, built only the first time ``key`` is
        seen on the current device: later calls with the key reuse the C launcher's whole argument list (bound,
        descriptors expanded). For launches whose arguments are host TMA descriptors: building three of them, binding
        and looking up their kept maps cost ~10 us a GEMM on the H200's host, more than the launch. ``key`` must
        determine the arguments exactly (every address, shape, stride, dtype, integer and config they depend on):
        the same key gives the same launch, hence the same bits. Hooks set, the runner's path, or no fast launch:
        ``build()`` and the ordinary call, every time."""
        if not FAST_LAUNCH:
            grid, args, consts, warps, stages = build()
            self.fn[grid](*args, **consts, num_warps=warps, num_stages=stages)
            return
        device = _device()
        hit = self._memo.get((device, key))
        if hit is not None and not _hooks_set():
            direct, g, expanded = hit
            direct.launch(g[0], g[1], g[2], _raw_stream(device), *direct.head, *expanded, *direct.tail)
            return
        grid, args, consts, warps, stages = build()
        self(grid, args, consts, warps, stages)
        spec, bound = _bind(args)
        direct = self.compiled.get((device, tuple(consts.items()), warps, stages, spec))
        if direct is not None and direct.launch is not None:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[(device, key)] = (direct, (*grid, 1, 1)[:3], direct.expanded(bound))
