"""Fake manifests and cell functions: let sweep/evidence tests run without the real harness."""
