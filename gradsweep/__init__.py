"""gradsweep: batch-invariant LLM kernels and the sweep that proves it."""
