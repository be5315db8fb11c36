"""Benchmarks: every figure measured beside a named peer in the same run, on the same server.

Run them with `make bench` (or `python -m bench`); `python -m bench --smoke` is the short
version the test suite runs to check the harness (no timing is asserted anywhere).
"""
