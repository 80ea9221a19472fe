"""Device time of the CUDA family's forward / dX GEMMs at small M next to cuBLAS, and their bits, for an A/B of
extension builds (a diagnostic, never evidence).

Each call is captured 50 times into a CUDA graph and the graph replayed: the figure is device time per call,
host cost excluded (the bench's end-to-end rows carry that). The outputs are saved so two builds' bits can be
compared:

    python3 scripts/gemm_tile_probe.py run OUT/side.pt          # with one build's gradsweep/_C*.so in place
    python3 scripts/gemm_tile_probe.py run OUT/side.pt triton   # the Triton family's GEMM instead
    python3 scripts/gemm_tile_probe.py compare OUT/a.pt OUT/b.pt
"""

from __future__ import annotations

import sys

import torch

SHAPES = [(m, 4096, 4096) for m in (1, 16, 32, 64, 128, 256)] + [(16, 14336, 4096), (16, 151936, 4096),
                                                              (1, 4096, 14336)]
CALLS, REPLAYS = 50, 20


def graph_time_us(fn) -> float:
    """Median device microseconds per call of ``fn`` over REPLAYS replays of a graph of CALLS calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS)
    return sorted(times)[len(times) // 2]


def heat(fn, ms: float = 120.0) -> None:
    """``fn`` back to back for ``ms`` of device time: the clocks the device holds under sustained load (a round
    timed from an idle device reads a boosted one)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        fn()
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > ms:
            return


def run(path: str, family: str = "cuda") -> None:
    if family == "triton":
        from gradsweep.triton_kernels.gemm import matmul_invariant
    else:
        from gradsweep.cuda_kernels.gemm import matmul_invariant

    gen = torch.Generator(device="cuda").manual_seed(0)
    outputs = {}
    print(f"{'case':34} {'ours us':>9} {'cuBLAS us':>9} {'ratio':>6}")
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        w = torch.randn(n, k, device="cuda", generator=gen).bfloat16()
        dy = torch.randn(m, n, device="cuda", generator=gen).bfloat16()
        for name, ours, stock in (
            ("fwd", lambda x=x, w=w: matmul_invariant(x, w), lambda x=x, w=w: x @ w.t()),
            ("dX", lambda dy=dy, w=w: matmul_invariant(dy, w.t()), lambda dy=dy, w=w: dy @ w),
        ):
            t_ours, t_stock = graph_time_us(ours), graph_time_us(stock)
            outputs[f"{name} M={m} N={n} K={k}"] = ours().cpu()
            print(f"{name + f' M={m} N={n} K={k}':34} {t_ours:9.1f} {t_stock:9.1f} {t_ours / t_stock:6.2f}x",
                  flush=True)
    # M-invariance inside this build: row 0 at every M equals row 0 of the M = 256 product
    x = torch.randn(256, 4096, device="cuda", generator=gen).bfloat16()
    w = torch.randn(4096, 4096, device="cuda", generator=gen).bfloat16()
    full = matmul_invariant(x, w).view(torch.int16)
    for m in (1, 2, 16, 17, 64, 65, 128, 255):
        part = matmul_invariant(x[:m], w).view(torch.int16)
        same = torch.equal(part, full[:m])
        print(f"M-invariance M={m} vs 256: {'bits equal' if same else 'BITS DIFFER'}")
    torch.save(outputs, path)


def compare(a: str, b: str) -> int:
    left, right = torch.load(a), torch.load(b)
    bad = 0
    for key in left:
        same = torch.equal(left[key].view(torch.int16), right[key].view(torch.int16))
        bad += not same
        print(f"{key}: {'bits equal' if same else 'BITS DIFFER'}")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], *sys.argv[3:4])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
