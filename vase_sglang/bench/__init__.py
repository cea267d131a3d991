"""Benchmarks: ``python -m vase_sglang.bench.kernels`` (kernels vs torch reference)."""
