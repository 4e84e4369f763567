"""Measuring: everything a number in attnbench is taken with.

- :mod:`~attnbench.measure.timing`: the one CPU timer (calibrated batches, wall and CPU
  time, interleaved rounds, re-measurement while noisy), re-exporting:
  :mod:`~attnbench.measure.samples` (:class:`~attnbench.measure.samples.Timing`, the
  samples and their summary), :mod:`~attnbench.measure.intervals` (a median's and a
  ratio's 95% interval),
  :mod:`~attnbench.measure.probe` (the interference probe, the check for impossible
  figures) and :mod:`~attnbench.measure.memory` (peak extra memory).
- :mod:`~attnbench.measure.gpu_timing`: CUDA-event timing of the GPU backends, the device
  record and its FMA peak.
- :mod:`~attnbench.measure.machine`: the machine record (CPU, threads, BLAS, versions) and
  the GEMM peak (the best of its probes).
- :mod:`~attnbench.measure.flops`: FLOPs of one attention call, counting visible pairs.
- :mod:`~attnbench.measure.oracle`: the float64 oracle and the baseline-relative tolerance.
- :mod:`~attnbench.measure.peers`: implementations outside :mod:`kernels` (NumPy formula,
  PyTorch SDPA), one adapter each.
- :mod:`~attnbench.measure.problems`: the one input generator, the mask kinds, thread
  limits, the load average and the tuning constants every experiment shares.
"""
