"""Measuring: local and endpoint benchmarks, tune-k, workloads, divergence and the self-check."""
