"""Session-wide set-up read before any test module is imported.

Why: TRITON_INTERPRET is read when a Triton kernel is decorated, i.e. at the first import of a kernel module, so it
is set here, once, for every test module (the CI's tile sizes and the CPU tests' kernels are the interpreter's).
Set per module instead, a narrowed selection whose first module only imports the launcher (``pytest
tests/test_triton_launch.py tests/test_triton_gemm_vocab.py``) decorated every kernel for the GPU and failed by
test order. Compiled runs go through ``tests.helpers.run_compiled``, a clean process without the variable; the
Qwen3 HF tests' in-process GPU mode (GRADSWEEP_HF_DEVICE=cuda) keeps Triton compiling for the GPU.
"""

from __future__ import annotations

import os

if os.environ.get("GRADSWEEP_HF_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
