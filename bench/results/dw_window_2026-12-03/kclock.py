"""Kernels-only time of a GPU-bound step measured four ways against its sustained end-to-end time."""
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from gradsweep.bench.timing import device_spans, merged_busy_ns
from scripts.host_probe import rotate
from scripts.probe_cases import case_steps


def busy_ms(prof, n):
    return merged_busy_ns(device_spans(prof, DeviceType.CUDA)) / 1e6 / n


def heat(step, ms):
    t_end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < t_end:
        step()


def main():
    n = 4
    for found in case_steps("manifests/h200.yaml", ["det_gemm"], sys.argv[1:], torch.device("cuda")):
        for name, ref in found.refs:
            with ref.context():
                step = rotate(ref.calls)
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                time.sleep(0.5)  # cool
                # (a) as the bench: sync, profile n calls
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(n):
                        step()
                    torch.cuda.synchronize()
                a = busy_ms(prof, n)
                # (b) 300 ms of steps, sync, then profile n calls
                heat(step, 300)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(n):
                        step()
                    torch.cuda.synchronize()
                b = busy_ms(prof, n)
                # (c) profiler warm-up step holds 300 ms of steps (synced), the active step n calls
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                             schedule=schedule(wait=0, warmup=1, active=1, repeat=1)) as prof:
                    heat(step, 300)
                    torch.cuda.synchronize()
                    prof.step()
                    for _ in range(n):
                        step()
                    torch.cuda.synchronize()
                    prof.step()
                c = busy_ms(prof, n)
                # (d) profile 300 ms of steps plus n, all counted
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    k = 0
                    t_end = time.perf_counter() + 0.3
                    while time.perf_counter() < t_end:
                        step()
                        k += 1
                    torch.cuda.synchronize()
                d = busy_ms(prof, k)
                # (e) sustained end to end: 1 s of steps, then 20-step event samples
                heat(step, 1000)
                per = []
                for _ in range(10):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for _ in range(10):
                        step()
                    e.record()
                    e.synchronize()
                    per.append(s.elapsed_time(e) / 10)
                per.sort()
                print(f"{found.case.id} {found.mode} [{name}]: kernels (a) bench {a:.3f}  (b) heat+sync {b:.3f}  "
                      f"(c) warm-up step {c:.3f}  (d) 300 ms profiled {d:.3f} ({k} steps)  |  sustained e2e "
                      f"{per[5]:.3f} ms/step", flush=True)


main()
