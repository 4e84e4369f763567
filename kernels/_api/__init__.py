"""The API layer: every entry point runs the same four steps.

**check** the arguments and build the problem (:mod:`kernels._problems`), **resolve** the
backend through the one table and ``auto`` policy (:mod:`.dispatch`), **run** the
backend's module for the entry, **restore** the caller's shapes and dtypes.

- :mod:`.dispatch`: the backend table, the ``auto`` policy, which backends run here;
- :mod:`.dense`: :func:`kernels.attention`, :func:`kernels.attention_backward`,
  :func:`kernels.prepare` and the micro-kernel's planning;
- :mod:`.decode`: :func:`kernels.attention_with_kvcache`;
- :mod:`.varlen`: :func:`kernels.attention_varlen` and its backward.
"""
