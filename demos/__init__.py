"""Demos that show the guarantees holding: `make demo` (loop/) and `make demo-smoke` (smoke.py)."""
