"""The battery's problems: the case table, the drawn cases, the values, the probes.

Cases are :class:`~attnbench.measure.problems.ProblemSpec` rows whose values come from the
harness's one input generator (:func:`~attnbench.measure.problems.make_inputs`).  The
named table (:data:`CASES`) is the readable part: odd L and D, Lq ≠ Lk both ways, GQA and
MQA, Dv ≠ D, every mask kind (causal in both alignments, bool masks shared and per head,
an additive float mask, key lengths, padding, combinations) and an explicit scale.
:func:`drawn_cases` adds problems drawn from the run's seed: shapes, a masking and a scale
that no table fixes, so an implementation that learned the table's answers fails them.
Tiny on purpose: the battery runs in seconds, and an implementation's bugs show on 13
keys as on 13,000.

Every value comes from the run's seed through :func:`case_seed` (the same seed, the same
problems: a run is replayed from the seed its JSON records), and :func:`inputs` makes a
wrong answer visible: values with a non-zero mean, some rows with large logits (so a row's
answer lies far from the mean of V), and every query seeing at least one key.

A *feature* is what a case asks of an implementation beyond plain attention
(:func:`features`); :func:`probe_problem` is a tiny valid problem with that feature
alone, tried once per implementation to find what it supports
(:mod:`attnbench.conformance.capabilities`).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass

import numpy as np

from attnbench.measure.problems import ProblemSpec, make_inputs

__all__ = ["CASES", "DRAWN", "DTYPES", "FEATURES", "GRADIENT_CASES", "Case", "case_seed",
           "describe", "drawn_cases", "features", "inputs", "probe_problem"]

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


#: Problems drawn from each run's seed beside the named table (each in both dtypes): this
#: many small ones, and one large (L 65-320, D up to 128), so that an implementation that
#: is correct only on small problems fails.
DRAWN = 8

#: The maskings a drawn problem takes (each run draws :data:`DRAWN` of them, no repeats).
_MASKINGS = ({}, {"causal": True}, {"causal": "bottom-right"}, {"mask": "bool-shared"},
             {"mask": "bool"}, {"mask": "float"}, {"key_lengths": "random"},
             {"causal": True, "key_lengths": "random"},
             {"causal": "bottom-right", "mask": "bool-shared"},
             {"mask": "float", "key_lengths": "random"})


def case_seed(seed: int, *labels) -> int:
    """The seed of one check's values: the run's ``seed`` and the check's ``labels``
    (the same pair, the same values; another label, unrelated values)."""
    words = [int(seed) % 2**32, *(zlib.crc32(str(label).encode()) for label in labels)]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


def describe(spec: ProblemSpec) -> str:
    """``"B2 H6/3 L13x7 D9/5 causal=bottom-right scale=0.41"``: a problem in one line."""
    B, H, Hkv, Lq, Lk, D, Dv = spec.sizes
    words = [f"B{B}", f"H{H}/{Hkv}", f"L{Lq}x{Lk}", f"D{D}/{Dv}"]
    if spec.causal is not False:
        words.append("causal" if spec.causal is True else f"causal={spec.causal}")
    if spec.mask is not None:
        words.append(f"mask={spec.mask}")
    if spec.key_lengths is not None:
        words.append(f"key_lengths={spec.key_lengths}")
    if spec.scale is not None:
        words.append(f"scale={spec.scale:.3g}")
    return " ".join(words)


def _drawn(rng, number: int, masking: dict, large: bool) -> Case:
    if large:
        Hkv, group, B = int(rng.integers(1, 3)), int(rng.integers(1, 3)), 1
        Lq, Lk = (int(x) for x in rng.integers(65, 321, size=2))
        D = int(rng.choice([32, 48, 64, 80, 96, 128]))
        Dv = D if rng.random() < 0.5 else int(rng.choice([32, 64, 128]))
    else:
        Hkv, group, B = (int(x) for x in rng.integers(1, 4, size=3))
        Lq, Lk = (int(x) for x in rng.integers(1, 41, size=2))
        D = int(rng.integers(2, 41))
        Dv = D if rng.random() < 0.5 else int(rng.integers(2, 41))
    if masking.get("causal") == "bottom-right":
        Lq = min(Lq, Lk)  # bottom-right: query 0 sees key Lk - Lq
    scale = round(float(rng.uniform(0.05, 1.5)), 4) if rng.random() < 0.5 else None
    spec = ProblemSpec(B=B, H=Hkv * group, Hkv=Hkv, Lq=Lq, Lk=Lk, D=D, Dv=Dv, scale=scale,
                       **masking)
    name = f"drawn-{number} ({describe(spec)})"
    return Case(name, dataclasses.replace(spec, name=name))


def drawn_cases(seed: int, count: int = DRAWN) -> tuple[Case, ...]:
    """``count`` small problems drawn from ``seed`` and one large: B 1-3, Hkv 1-3 with 1-3
    query heads each, Lq and Lk 1-40, D 2-40, Dv = D or 2-40 (the large one: B 1, 1-2 kv
    heads with 1-2 query heads each, Lq and Lk 65-320, D 32-128), a masking of
    :data:`_MASKINGS` each (no two small ones alike), and half of them an explicit scale.
    Each query sees at least one key."""
    rng = np.random.default_rng(case_seed(seed, "drawn"))
    order = rng.permutation(len(_MASKINGS))
    found = [_drawn(rng, number, _MASKINGS[which], large=False)
             for number, which in enumerate(order[:count], start=1)]
    found.append(_drawn(rng, count + 1, _MASKINGS[int(rng.integers(len(_MASKINGS)))],
                        large=True))
    return tuple(found)


def _every_row_sees_a_key(kwargs: dict) -> dict:
    """``kwargs`` with key 0 visible to every query through the mask (key 0 is inside any
    key length and any causal alignment the drawn and named problems use), so that an
    implementation's convention for a query that sees nothing is never what is judged."""
    mask = kwargs.get("mask")
    if mask is None:
        return kwargs
    mask = mask.copy()
    if mask.dtype == np.bool_:
        mask[..., 0] = True
    else:
        mask[..., 0] = np.where(np.isfinite(mask[..., 0]), mask[..., 0], 0.0)
    return {**kwargs, "mask": mask}


def inputs(spec: ProblemSpec, dtype, seed: int = 0):
    """``q, k, v, kwargs`` of ``spec`` from ``seed``
    (:func:`~attnbench.measure.problems.make_inputs`), with a wrong answer made visible:
    v shifted by a mean of 1-3 per column, a third of the query rows four times larger
    (peaked attention), key 0 visible to every query."""
    dtype = np.dtype(dtype)
    q, k, v, kwargs = make_inputs(spec, dtype, seed)
    rng = np.random.default_rng(case_seed(seed, "visible"))
    v = (v + rng.uniform(1.0, 3.0, size=v.shape[:-2] + (1, v.shape[-1]))).astype(dtype)
    peaked = rng.random(q.shape[:-1] + (1,)) < 1 / 3
    q = np.where(peaked, q * 4, q).astype(dtype)
    return q, k, v, _every_row_sees_a_key(kwargs)


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
