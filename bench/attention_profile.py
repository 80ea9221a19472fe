import time, torch
from torch.profiler import profile, ProfilerActivity
from gradsweep.canonical import RowIdentity
from gradsweep.triton_kernels import attention as attn
b, s, h, d = 8, 1024, 32, 128
q, k, v, do = (torch.randn(b * s, h, d, device="cuda").to(torch.bfloat16) for _ in range(4))
lengths = [s] * b
rows = RowIdentity.packed(lengths)
def fwd():
    return attn.attention(q, k, v, rows, attn.AttentionCache(lengths, h, d, "cuda"))
def fb():
    qq = q.detach().requires_grad_(True)
    c = attn.AttentionCache(lengths, h, d, "cuda")
    attn.attention(qq, k, v, rows, c).backward(do); c.finish()
for fn in (fwd, fb):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10): fn()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t) / 10 * 1e3
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        fn(); torch.cuda.synchronize()
    print(f"== {fn.__name__}: wall {wall:.3f} ms per call")
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
