"""Session-wide set-up read before any test module is imported.

Why: TRITON_INTERPRET is read when a Triton kernel is decorated, i.e. at the first import of a kernel module. Each
module that runs kernels in-process sets it at its top, but a module that only imports the launcher (or runs
first in a narrowed selection, ``pytest tests/test_triton_launch.py tests/test_triton_gemm_vocab.py``) would
otherwise decorate every kernel for the GPU and make later modules' CPU tests fail by test order. Compiled runs go
through ``tests.helpers.run_compiled``, a clean process without the variable; the Qwen3 HF tests' in-process GPU
mode (GRADSWEEP_HF_DEVICE=cuda) is the one exception and is left as its module decides.
"""

from __future__ import annotations

import os

if os.environ.get("GRADSWEEP_HF_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
