"""Batch-invariant CUDA C++ kernels (gradsweep._C) behind thin autograd wrappers, one module per op.

Importing this package never needs CUDA: a missing extension or driver shows up in
``runtime.cuda_status()`` and as a RuntimeError when an op is called.
"""

from gradsweep.cuda_kernels.runtime import NOT_BUILT, cuda_status

__all__ = ["NOT_BUILT", "cuda_status"]
