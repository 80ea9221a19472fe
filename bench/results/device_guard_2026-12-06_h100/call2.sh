# The final device-guard-context.patch build (the DeviceGuard fix + the fold's named encode failure): its GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $HOME/site .whl/*.whl
export PYTHONPATH=$HOME/site:$PWD PYTHONUNBUFFERED=1
cp .devtmp/ctx2/*.so gradsweep/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
md5sum gradsweep/_C.cpython-*.so | cut -c1-8
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_ops.py tests/test_cuda_attention.py 2>&1 | grep -vE "^\s*$|warnings summary|Variable._execution|UserWarning|Docs:" | tail -15
echo "done at $SECONDS s"
