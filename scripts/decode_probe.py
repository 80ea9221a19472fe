"""The CUDA decode step's program shapes on the device (a diagnostic; the bench's signed figures are the evidence):
the bench's decode case (64 sequences x 1 token over a 4096-token cache, 32 / 8 heads x 128) timed with the narrow
programs (the default) and with every program wide (``AttnConfig(narrow=False)``), beside the Triton kernel and
SDPA on the same cache; each CUDA output compared bit for bit with the training forward (a full prefill) at those
tokens. (The A/B of 2026-12-02 that chose the narrow program's shape, bench/results/decode_probe_h200_2026-12-02/,
ran this probe on a build whose launcher read a variable; the shipped launcher reads nothing.)

    python3 scripts/decode_probe.py --json out/decode_probe.json
"""

from __future__ import annotations

import argparse
import json

import torch

from gradsweep.bench.catalog.attention import DecodeSubject, decode
from gradsweep.bench.checks import compare_logical
from gradsweep.canonical import RowIdentity
from gradsweep.cuda_kernels.attention import AttnConfig
from gradsweep.families import KERNEL_FAMILIES
from gradsweep.ops.registry import get_op


def _ms_per_step(step, iters: int) -> float:
    """Device time per step, steps issued back to back (the host's issue hides behind the device's work)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(iters):
            step()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / iters)
    return best


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return not compare_logical({"o": a}, {"o": b})  # the bench's raw-bit comparison


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--past", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    device = torch.device("cuda")
    op = get_op("attention")
    case = decode(args.batch, args.past, {"heads": 32, "head_dim": 128, "kv_heads": 8})
    cands = {c.family: c for c in op.candidates.values() if c.family in KERNEL_FAMILIES}
    subject = DecodeSubject(case, op, cands, device, 0)
    i = subject.data.inputs
    with torch.no_grad():
        mod = subject._kernel("cuda")
        full = mod.attention(i["q"], i["k"], i["v"], RowIdentity.packed([subject.total] * subject.batch),
                             subject._new_cache("cuda"))[subject.last]
    step = subject._step("cuda")
    out = step()
    rows: list[dict] = [{"impl": "cuda narrow programs", "ms": _ms_per_step(step, args.iters),
                         "bits_equal_prefill": _same_bits(out, full)}]
    wide = DecodeSubject(case, op, cands, device, 0)
    base_cache = wide._new_cache
    wide._new_cache = lambda family: base_cache(family) if family != "cuda" else mod.AttentionCache(
        [wide.total] * wide.batch, 32, 128, device, kv_heads=8, config=AttnConfig(narrow=False))
    step = wide._step("cuda")
    out = step()
    rows.append({"impl": "cuda all wide", "ms": _ms_per_step(step, args.iters),
                 "bits_equal_prefill": _same_bits(out, full)})
    if "triton" in cands:
        rows.append({"impl": "triton", "ms": _ms_per_step(subject._step("triton"), args.iters)})
    rows.append({"impl": "sdpa", "ms": _ms_per_step(subject.reference("sdpa", "fwd").calls[0], args.iters)})
    sdpa = rows[-1]["ms"]
    for r in rows:
        r["vs_sdpa"] = r["ms"] / sdpa
        print(f"{r['impl']:28s} {r['ms'] * 1e3:8.1f} us  {r['vs_sdpa']:5.2f}x sdpa  "
              f"bits={r.get('bits_equal_prefill', '-')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"batch": args.batch, "past": args.past, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
