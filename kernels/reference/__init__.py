"""The ``reference`` backend: the literal formula in NumPy, float64 accumulation (the oracle).

- :mod:`.forward`: ``run`` (attention, weights and lse);
- :mod:`.backward`: ``run_backward`` and ``run`` (the gradients).
"""
