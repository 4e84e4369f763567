"""Verify and benchmark any attention implementation: the conformance kit.

``attnbench conform IMPL ...`` (:mod:`attnbench.cli.conformance`) and this package run a
battery of properties on an attention implementation — attnbench's own backends, NumPy,
PyTorch's SDPA, JAX's ``dot_product_attention`` or a user's ``module:function`` — in one
of three calling conventions (:mod:`~attnbench.measure.adapters`):

- correctness: agreement with the float64 oracle under the project's tolerance policy on
  a named case table and on problems drawn from the run's seed
  (:mod:`~attnbench.conformance.cases`), hidden keys and values never read, future tokens
  never seen, large logits, output shape and dtype, gradients
  (:mod:`~attnbench.conformance.correctness`); inputs untouched, a fresh output, no
  result cached, correct after many calls and after being timed
  (:mod:`~attnbench.conformance.integrity`);
- determinism: repeated calls, thread counts, batch mates
  (:mod:`~attnbench.conformance.determinism`);
- conventions, observed: fully masked rows, causal alignment, dropout, LSE, float64
  compute (:mod:`~attnbench.conformance.conventions`);
- speed: time against L with the suite's timer, GFLOP/s, fitted exponent, ratio to numba
  (:mod:`~attnbench.conformance.speed`).

Features an implementation refuses on a tiny valid problem make the checks needing them
``unsupported`` (:mod:`~attnbench.conformance.capabilities`).  The runner
(:mod:`~attnbench.conformance.runner`) is the judge: it runs the battery in its own
process, and each implementation's calls in a worker process
(:mod:`~attnbench.conformance.worker`, through :mod:`~attnbench.conformance.remote`) with
a time limit, the two exchanging plain data (:mod:`~attnbench.conformance.wire`);
:mod:`~attnbench.conformance.render` prints the matrix and writes the HTML page.  For a
user's own test suite, :func:`pytest_cases` gives one ``pytest.param`` per (property, case)
(:mod:`~attnbench.conformance.testing`; see ``docs/conformance.md``).
"""

from __future__ import annotations

from attnbench.conformance.battery import PROPERTIES, all_checks
from attnbench.conformance.runner import conform, exit_status, verdict
from attnbench.conformance.testing import check, pytest_cases, subject
from attnbench.measure.specs import CONVENTIONS, Implementation, resolve

__all__ = ["CONVENTIONS", "PROPERTIES", "Implementation", "all_checks", "check", "conform",
           "exit_status", "pytest_cases", "resolve", "subject", "verdict"]
