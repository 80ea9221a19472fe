"""Batch-invariant Triton kernels (one module per op: kernels, launcher and autograd Function together)."""
