"""Studies: what the sweeps and kernels are used to find out.

- :mod:`~attnbench.studies.scaling`: power-law fits (time, FLOPs, memory against L, d_k,
  heads, batch, and sliding windows' time against L·W) with intervals, each stored with
  its verdict (the report shows it as stored).
- :mod:`~attnbench.studies.scaling_verdicts`: the one place a scaling verdict is decided:
  a fitted exponent's interval against the claimed one, and the words for both.
- :mod:`~attnbench.studies.scaling_claims`: the exponents the claims expect, per quantity,
  variable, backend and kind of point.
- :mod:`~attnbench.studies.fits`: the one fit behind them: c + a·x^p (with a lower-order
  term b·g where the claim needs one) with a bootstrap interval over the samples, and the
  complexity class of least residual.
- :mod:`~attnbench.studies.variants`: the speed-up of block skipping against the density
  of visible pairs (it builds on ``scaling``, never the other way round).
- :mod:`~attnbench.studies.stability`: softmax saturation with and without the 1/√d_k scale.
- :mod:`~attnbench.studies.params`: parameter arithmetic of published models.
"""
