"""What a backend receives, and the checks that build it.

Each problem is a dataclass of validated, contiguous arrays; every user-facing error is
raised while building one, before any kernel runs.

- :mod:`.arrays`: the first step of every array check (NumPy, never a device array);
- :mod:`.dense`, :mod:`.checks`: :class:`~kernels.AttentionProblem` and the checks of
  the forward's and backward's arguments;
- :mod:`.decode`, :mod:`.decode_checks`: the decode step's problem, its checks and the
  in-place append to a cache;
- :mod:`.varlen`: the packed batch's problem;
- :mod:`.sinks`: attention sinks (their checks, and merging a sink into a result).
"""
