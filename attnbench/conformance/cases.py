"""The battery's problems: the case table, the features each case needs, the probes.

Cases are :class:`~attnbench.measure.problems.ProblemSpec` rows drawn by the harness's one
input generator (:func:`~attnbench.measure.problems.make_inputs`): odd L and D, Lq ≠ Lk
both ways, GQA and MQA, Dv ≠ D, and every mask kind (causal in both alignments, bool
masks shared and per head, an additive float mask, key lengths, padding, combinations).
Tiny on purpose: the battery runs in seconds, and an implementation's bugs show on 13
keys as on 13,000.

A *feature* is what a case asks of an implementation beyond plain attention
(:func:`features`); :func:`probe_problem` is a tiny valid problem with that feature
alone, tried once per implementation to find what it supports
(:mod:`attnbench.conformance.capabilities`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnbench.measure.problems import ProblemSpec, make_inputs

__all__ = ["CASES", "DTYPES", "FEATURES", "GRADIENT_CASES", "Case", "features", "inputs",
           "probe_problem"]

#: Input dtypes of the agreement properties.
DTYPES = ("float32", "float64")

#: Features a case may need, each probed on a tiny problem.
FEATURES = ("float64", "cross", "gqa", "dv", "causal", "bottom-right", "bool-mask",
            "float-mask", "key-lengths", "dropout")


@dataclass(frozen=True)
class Case:
    """One named problem of the table."""

    name: str
    spec: ProblemSpec


def _case(name, **fields) -> Case:
    return Case(name, ProblemSpec(name=name, **fields))


#: The agreement table (each run in float32 and float64).
CASES = (
    _case("odd", B=2, H=3, Lq=13, D=11),  # odd L and D: tails of every tile
    _case("short-queries", H=2, Lq=5, Lk=17, D=8),  # Lq < Lk (cross-attention, decoding)
    _case("long-queries", H=2, Lq=17, Lk=5, D=8),  # Lq > Lk
    _case("gqa", B=2, H=4, Hkv=2, Lq=9, D=8),  # two query heads per kv head
    _case("mqa", H=4, Hkv=1, Lq=9, D=8),  # one kv head
    _case("dv", H=2, Lq=9, D=8, Dv=5),  # v's head size differs from q's
    _case("causal", B=2, H=2, Lq=11, D=8, causal=True),
    _case("causal-cross", H=2, Lq=7, Lk=13, D=8, causal=True),  # top-left, Lq < Lk
    _case("bottom-right", H=2, Lq=7, Lk=13, D=8, causal="bottom-right"),
    _case("bool-mask", B=2, H=2, Lq=9, Lk=11, D=8, mask="bool-shared"),  # (B, 1, Lq, Lk)
    _case("bool-mask-heads", B=2, H=2, Lq=9, D=8, mask="bool"),  # (B, H, Lq, Lk)
    _case("float-mask", H=2, Lq=9, Lk=11, D=8, mask="float"),  # additive, some -inf
    _case("key-lengths", B=3, H=2, Lq=9, Lk=12, D=8, key_lengths="random"),
    _case("padding", B=2, H=2, Lq=8, D=8, key_lengths="quarter"),
    _case("causal+key-lengths", B=3, H=2, Lq=10, D=8, causal=True, key_lengths="random"),
    _case("gqa+bool-mask", B=2, H=4, Hkv=1, Lq=7, Lk=12, D=8, mask="bool-shared"),
    _case("scale", H=2, Lq=9, Lk=11, D=8, scale=0.3),  # an explicit scale, not 1/sqrt(D)
)

#: The gradient table (float32; "odd" in float64 too).
GRADIENT_CASES = tuple(c for c in CASES if c.name in (
    "odd", "short-queries", "gqa", "causal", "bool-mask", "key-lengths"))


def features(spec: ProblemSpec, dtype) -> frozenset:
    """The :data:`FEATURES` a problem needs."""
    B, H, Hkv, Lq, Lk, D, Dv = spec.sizes
    needed = set()
    if np.dtype(dtype) == np.float64:
        needed.add("float64")
    if Lq != Lk:
        needed.add("cross")
    if Hkv != H:
        needed.add("gqa")
    if Dv != D:
        needed.add("dv")
    if spec.causal is True or spec.causal == "top-left":
        needed.add("causal")
    elif spec.causal == "bottom-right":
        needed.add("bottom-right")
    if spec.mask is not None:
        needed.add("float-mask" if spec.mask == "float" else "bool-mask")
    if spec.key_lengths is not None:
        needed.add("key-lengths")
    if spec.dropout_p:
        needed.add("dropout")
    return frozenset(needed)


def inputs(spec: ProblemSpec, dtype, seed: int = 0):
    """``q, k, v, kwargs`` of ``spec`` (:func:`~attnbench.measure.problems.make_inputs`)."""
    return make_inputs(spec, np.dtype(dtype), seed)


def probe_problem(feature: str):
    """A tiny valid problem with ``feature`` alone: ``q, k, v, kwargs``.

    Every query sees at least one key (a probe asks "do you accept this", not "what do
    you do with an empty row").
    """
    dtype = np.float64 if feature == "float64" else np.float32
    B, H, Hkv, Lq, Lk, D, Dv = 1, 2, 2, 4, 4, 4, 4
    kwargs = {}
    if feature == "cross":
        Lq, Lk = 3, 5
    elif feature == "gqa":
        Hkv = 1
    elif feature == "dv":
        Dv = 3
    elif feature == "causal":
        kwargs["causal"] = True
    elif feature == "bottom-right":
        Lq, Lk = 3, 5
        kwargs["causal"] = "bottom-right"
    elif feature == "bool-mask":
        mask = np.ones((B, 1, Lq, Lk), bool)
        mask[..., 1:, 0] = False
        kwargs["mask"] = mask
    elif feature == "float-mask":
        kwargs["mask"] = np.full((1, H, Lq, Lk), -0.5, dtype)
    elif feature == "key-lengths":
        kwargs["key_lengths"] = np.array([3])
    elif feature == "dropout":
        kwargs.update(dropout_p=0.1, seed=1)
    elif feature not in ("plain", "float64"):
        raise ValueError(f"feature {feature!r} is unknown; expected one of {FEATURES}")
    rng = np.random.default_rng(7)
    q = rng.standard_normal((B, H, Lq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Lk, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Lk, Dv)).astype(dtype)
    return q, k, v, kwargs
