"""The claims ledger: each claim of the source articles turned into a measured verdict.

- :mod:`~attnbench.claims.ledger`: the ledger (one row per claim) and ``attnbench verify``.
- :mod:`~attnbench.claims.rules`: the verdict vocabulary and the rules that decide one.
- :mod:`~attnbench.claims.softmax`, :mod:`~attnbench.claims.attention`,
  :mod:`~attnbench.claims.masking`, :mod:`~attnbench.claims.cost`: the checks behind the
  claims, by topic (softmax; what attention computes; masks and dropout; cost and
  parameter counts).
"""
