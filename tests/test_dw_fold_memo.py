"""The Triton dW fold's TMA launches are memoised on what their arguments are made of (``gemm.dw_fold_tiles``,
``Tuner.memo`` with ``args_for``): a fold of the same plan from the same buffers builds no descriptor again, and any
change of a buffer, the plan's descriptors or the staging flag builds anew (a stale launch would fold the wrong
rows into the main grad). Run on the CPU with the kernels stubbed and the TMA route taken
(scripts/host_cpu_probe.py's ``Stubs``), counting the row-window descriptors built."""

from __future__ import annotations

from tests.helpers import run_compiled

SCRIPT = r"""
import numpy as np, torch
from scripts.host_cpu_probe import Stubs
from gradsweep.triton_kernels import gemm
Stubs(fake_tma=True)
built = []
window = gemm._window
gemm._window = lambda t, block: built.append(t.data_ptr()) or window(t, block)
host = np.array([[64, 64], [128, 64]], np.int32)  # two whole tiles read in place: one TMA stretch
host.flags.writeable = False
desc = torch.from_numpy(host.copy())
x, dy = torch.randn(256, 64).bfloat16(), torch.randn(256, 32).bfloat16()
g = torch.zeros(32, 64)
x2, g2, desc2 = x.clone(), g.clone(), desc.clone()
counts = []
for d, xx, gg in [(desc, x, g), (desc, x, g), (desc, x, g), (desc, x, g2), (desc, x2, g), (desc2, x, g),
                  (desc, x, g)]:
    gemm.dw_fold_tiles(d, xx, dy, gg, host_desc=host)
    counts.append(len(built))
print("COUNTS", counts)
"""


def test_the_dw_fold_builds_its_descriptors_once_per_set_of_buffers():
    res = run_compiled(SCRIPT, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("COUNTS"))
    # 1: tunes (the ordinary launch: two descriptors); 2: the memo's first build; 3: a hit; 4-6: main grad, X, the
    # plan's descriptors each changed: built anew; 7: the first buffers again: a hit
    assert line == "COUNTS [2, 4, 4, 6, 8, 10, 10]", line


REPLAY = r"""
import numpy as np, torch
from scripts.host_cpu_probe import Stubs
from gradsweep.triton_kernels import gemm
stubs = Stubs(fake_tma=True)
cut = []
stretches = gemm.stretches
gemm.stretches = lambda host, tile: cut.append(1) or stretches(host, tile)
# three tiles: two read in place, then one from the staging rows: two TMA stretches, two launches a call
host = np.array([[64, 64], [128, 64], [-1, 64]], np.int32)
host.flags.writeable = False
desc = torch.from_numpy(host.copy())
x, dy = torch.randn(256, 64).bfloat16(), torch.randn(256, 32).bfloat16()
xs, dys = torch.randn(64, 64).bfloat16(), torch.randn(64, 32).bfloat16()
g, g2 = torch.zeros(32, 64), torch.zeros(32, 64)
rows = []
def call(gg, host_desc=host):
    before = (stubs.launches, len(cut))
    gemm.dw_fold_tiles(desc, x, dy, gg, xs, dys, host_desc=host_desc)
    rows.append((stubs.launches - before[0], len(cut) - before[1]))
call(g)  # tunes
call(g)  # memoises both stretches, records the call
call(g)  # a replay: two launches, no stretches cut
call(g2)  # another main grad: the full path
gemm._DW_TMA.launch._memo.clear()  # the launch memo dropped (as when full): no partial replay
call(g)
call(g)
writable = host.copy()  # a caller's own (writable) descriptors: never replayed
call(g, writable)
call(g, writable)
print("ROWS", rows)
"""


def test_a_replayed_dw_fold_launches_its_memoised_stretches_all_or_none():
    """A fold of the same read-only plan from the same buffers replays its memoised launches (``_DW_CALLS``): the
    same two launches, no stretch cut again; another main grad takes the full path; when the launch memo was
    dropped, the call takes the full path and launches each stretch once (never a part replayed and then the whole
    launched again: that would fold tiles twice); a writable plan is never replayed."""
    res = run_compiled(REPLAY, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("ROWS"))
    # (launches, stretch cuts) per call; the writable plan is cut each time (``stretches`` keeps no answer for it)
    assert line == "ROWS [(2, 1), (2, 1), (2, 0), (2, 1), (2, 1), (2, 0), (2, 1), (2, 1)]", line
