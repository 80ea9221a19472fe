# Unsigned A/B: does a thread without a current CUDA context break the Hopper GEMM / fold (TMA encode, CUresult 201),
# and does the DeviceGuard patch (csrc/common.cuh) mend it? old = the signed build, new = the patched build.
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $HOME/site .whl/*.whl
export PYTHONPATH=$HOME/site:$PWD PYTHONUNBUFFERED=1
D=.devtmp/ctx
cp $D/_fold_plan.cpython-*.so gradsweep/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T=tests/test_cuda_ops.py::test_gpu_first_call_on_a_thread_without_a_context
host_us() {  # host microseconds per small-M Hopper GEMM call (the guard's added cost), median of 5 x 2000 calls
python3 - <<'PY'
import time, statistics, torch
from gradsweep.cuda_kernels import runtime
ext = runtime.load(); dev = 0; s = torch.cuda.current_stream().cuda_stream
x = torch.randn(1, 4096, device="cuda").bfloat16(); w = torch.randn(4096, 4096, device="cuda").bfloat16()
y = torch.empty(1, 4096, device="cuda", dtype=torch.bfloat16)
a = (x.data_ptr(), w.data_ptr(), y.data_ptr(), 1, 4096, 4096, 4096, 4096, 4096, dev, s, 2)
for _ in range(200): ext.gemm_nt(*a)
torch.cuda.synchronize(); r = []
for _ in range(5):
    t = time.perf_counter()
    for _ in range(2000): ext.gemm_nt(*a)
    r.append((time.perf_counter() - t) / 2000 * 1e6); torch.cuda.synchronize()
print("host us per gemm_nt M=1 call:", [round(v, 2) for v in r], "median", round(statistics.median(r), 2))
PY
}
for b in old new; do
  cp $D/$b/_C.cpython-*.so gradsweep/
  echo "=== $b: $(md5sum gradsweep/_C.cpython-*.so | cut -c1-8)"
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider "$T" 2>&1 | grep -E "passed|failed|Error|error:|assert" | head -6
  timeout 120 python3 scripts/bits_dump.py dump $OUT/$b.pt --op det_gemm --op linear_logp --family cuda --case dw_t4096 --case fwd_bwd_t4096 > $OUT/$b.dump.txt 2>&1; echo "bits_dump rc=$?"; tail -3 $OUT/$b.dump.txt
  host_us
done
cp $D/new/_C.cpython-*.so gradsweep/
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py tests/test_cuda_attention.py 2>&1 | tail -3
[ -f $OUT/old.pt ] && [ -f $OUT/new.pt ] && python3 scripts/bits_dump.py compare $OUT/old.pt $OUT/new.pt 2>&1 | tail -4
rm -f $OUT/*.pt
echo "done at $SECONDS s"
