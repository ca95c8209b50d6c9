"""Benchmarks: ratios against a baseline run side by side (`make bench`, docs/performance.md)."""
