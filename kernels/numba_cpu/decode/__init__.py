"""The ``numba`` backend's decoding: few queries against a long, possibly paged, KV cache.

- :mod:`.attend`: the decode kernel (tasks per sequence, key/value head and key split;
  paged reads; the splits merged);
- :mod:`.plan`: how a step is divided into tasks;
- :mod:`.chunks`: a chunk of fully visible keys through the register-blocked products.
"""
