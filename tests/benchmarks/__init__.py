"""Benchmarks, run with ``pytest --benchmark`` (deselected by plain ``pytest``)."""
