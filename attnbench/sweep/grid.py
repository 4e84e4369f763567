"""Sweep grids: which attention problems a sweep measures, from flags, a file or a name.

A :class:`Grid` is a cartesian product of values for each parameter of a point
(sequence length ``L``, head size ``d_k``, ``heads``, ``kv_heads``, ``batch``, mask kind,
dtype, backend, ``direction``, ``variant`` and ``kind``).  ``direction`` is ``forward`` (time
:func:`kernels.attention`) or ``backward`` (time :func:`kernels.attention_backward` with
the forward's ``out`` and ``lse`` passed in: the forward is not timed).  ``variant`` is an
attention variant of :mod:`kernels.mods` (:data:`VARIANT_FORMS`): ``none``, ``window-W``
(``sliding_window(W)``: query i sees keys i-W .. i), ``documents-N`` (N equal documents,
``document``), ``alibi``, ``softcap`` (``softcap(30.0)``) or ``sinks`` (one attention-sink
logit per head); see :mod:`attnbench.sweep.variants`.  ``kind`` is the entry point a
point calls (:data:`KINDS`, :mod:`attnbench.sweep.kinds`): ``dense`` (L queries against
L keys, :func:`kernels.attention`), ``decode`` (one new query per sequence against a
cache of L keys, :func:`kernels.attention_with_kvcache`: the time against the cache
length is O(L) and bound by memory bandwidth) or ``varlen`` (a packed batch of ``batch``
sequences of lengths L, L/2, L/4, ..., :func:`kernels.attention_varlen`).  A sweep runs
the union of one or more grids, so a file can ask for "L from 128 to 4096 for every
backend" and "d_k from 16 to 256 for numba only" without the full product of both.

Grid files are TOML (read with :mod:`tomllib`) or, if pyyaml is installed, YAML.  Either
the top level holds the parameters (one grid), or a list ``grid`` holds several::

    # grid.toml
    [[grid]]                      # time and memory against L
    L = [128, 256, 512, 1024]
    d_k = 64
    heads = 4
    mask = ["none", "causal"]
    backend = ["numba", "reference", "numpy", "torch"]
    direction = ["forward", "backward"]

    [[grid]]                      # time against L·W of causal sliding windows
    L = [1024, 2048, 4096]
    mask = "causal"
    variant = ["none", "window-64", "window-256"]
    backend = "numba"

    [[grid]]                      # time against d_k
    L = 512
    d_k = [16, 32, 64, 128]
    backend = "numba"

A parameter left out takes its default (:data:`DEFAULTS`); a scalar means a list of one.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from attnbench.measure import peers
from attnbench.measure.implementations import names

__all__ = ["BACKENDS", "DEFAULTS", "DIRECTIONS", "DTYPES", "GRIDS", "KINDS", "MASK_KINDS",
           "VARIANT_FORMS", "Grid", "Point", "check_variant", "expand", "grid_from_mapping",
           "load_grid_file", "parse_variant"]

#: Backends a sweep knows (the registry's, :mod:`attnbench.measure.implementations`): three
#: of kernels, two peers (see :mod:`attnbench.measure.peers`), and PyTorch's SDPA on the
#: GPU (``torch-cuda``, timed by :mod:`attnbench.measure.gpu_timing`).  Any implementation
#: spec is accepted too (``module:function``, or a name another package registered under
#: ``attnbench.implementations``: :func:`attnbench.measure.implementations.is_external`).
BACKENDS = names(swept=True)

#: Mask kinds a sweep point may have (all self-attention, Lq = Lk = L): those of
#: :data:`attnbench.measure.problems.MASK_KINDS` that every peer can express and that
#: differ when Lq = Lk.
MASK_KINDS = ("none", "causal", "padding", "bool")

DTYPES = ("float32", "float64", "float16", "bfloat16")  # half: computed in float32

#: What a point times: the forward call, or the backward call given the forward's out and lse.
DIRECTIONS = ("forward", "backward")

#: Spellings of the variant axis (W, N: positive integers; W may be 0).
VARIANT_FORMS = ("none", "window-W", "documents-N", "alibi", "softcap", "sinks")

#: The entry point a point calls: the dense prefill, one decode step against a KV cache,
#: or a packed batch of variable-length sequences (:mod:`attnbench.sweep.kinds`).
KINDS = ("dense", "decode", "varlen")


def parse_variant(name: str) -> tuple[str, int | None]:
    """``("window", 64)`` for ``"window-64"``, ``("alibi", None)`` for ``"alibi"``.

    Raises
    ------
    ValueError
        A name not of :data:`VARIANT_FORMS`.
    """
    if name in ("none", "alibi", "softcap", "sinks"):
        return name, None
    kind, _, size = str(name).partition("-")
    if kind in ("window", "documents") and size.isdigit():
        value = int(size)
        if kind == "window" or value >= 1:
            return kind, value
    raise ValueError(f"variant {name!r} is unknown; expected one of {', '.join(VARIANT_FORMS)} "
                     "(e.g. window-256, documents-8)")


def check_variant(name: str) -> str:
    """``name`` itself if :func:`parse_variant` accepts it (for argparse and grid files)."""
    parse_variant(name)
    return name


@dataclass(frozen=True, order=True)
class Point:
    """One measurement of a sweep: an attention problem and the backend that solves it."""

    backend: str  # one of BACKENDS
    L: int  # sequence length (queries = keys = L)
    d_k: int  # head size of q, k and v
    heads: int  # query heads
    kv_heads: int  # key/value heads; heads must be a multiple (GQA/MQA)
    batch: int
    mask: str  # one of MASK_KINDS
    dtype: str  # one of DTYPES
    direction: str = "forward"  # one of DIRECTIONS
    variant: str = "none"  # of VARIANT_FORMS
    kind: str = "dense"  # one of KINDS

    def as_dict(self) -> dict:
        return asdict(self)

    def problem_key(self) -> tuple:
        """The problem without the backend: points with the same key share an oracle.

        Points that differ only in backend, direction or variant get the same inputs
        (:func:`attnbench.sweep.calls.make_inputs`), so their times compare side by side.
        """
        return (self.L, self.d_k, self.heads, self.kv_heads, self.batch, self.mask, self.dtype,
                self.direction, self.variant, self.kind)

    def label(self) -> str:
        gqa = f"/{self.kv_heads}" if self.kv_heads != self.heads else ""
        extra = "".join(f" {value}" for value, default in ((self.variant, "none"),
                        (self.direction, "forward"), (self.kind, "dense")) if value != default)
        return (f"{self.backend} L={self.L} d_k={self.d_k} H={self.heads}{gqa} "
                f"B={self.batch} {self.mask} {self.dtype}{extra}")


#: Value of each grid parameter when a grid does not give it.  kv_heads None: = heads.
DEFAULTS = {
    "L": (128, 256, 512), "d_k": (64,), "heads": (4,), "kv_heads": (None,), "batch": (1,),
    "mask": ("none",), "dtype": ("float32",), "backend": ("numba", "reference"),
    "direction": ("forward",), "variant": ("none",), "kind": ("dense",),
}
#: Other spellings accepted in files (the CLI's flag names).
ALIASES = {"dk": "d_k", "kv-heads": "kv_heads", "n_kv_heads": "kv_heads", "backends": "backend",
           "masks": "mask", "dtypes": "dtype", "n_heads": "heads", "directions": "direction",
           "variants": "variant", "kinds": "kind"}


@dataclass(frozen=True)
class Grid:
    """A cartesian product of point parameters; see :data:`DEFAULTS` for each default."""

    L: tuple = DEFAULTS["L"]  # sequence lengths
    d_k: tuple = DEFAULTS["d_k"]  # head sizes
    heads: tuple = DEFAULTS["heads"]  # query heads
    kv_heads: tuple = DEFAULTS["kv_heads"]  # key/value heads; None: as many as query heads
    batch: tuple = DEFAULTS["batch"]
    mask: tuple = DEFAULTS["mask"]  # from MASK_KINDS
    dtype: tuple = DEFAULTS["dtype"]  # from DTYPES
    backend: tuple = DEFAULTS["backend"]  # from BACKENDS
    direction: tuple = DEFAULTS["direction"]  # from DIRECTIONS
    variant: tuple = DEFAULTS["variant"]  # of VARIANT_FORMS
    kind: tuple = DEFAULTS["kind"]  # from KINDS

    def __post_init__(self):
        for name in ("L", "d_k", "heads", "batch"):
            _check_ints(name, getattr(self, name), allow_none=False)
        _check_ints("kv_heads", self.kv_heads, allow_none=True)
        for name, allowed in (("mask", MASK_KINDS), ("dtype", DTYPES), ("backend", BACKENDS),
                              ("direction", DIRECTIONS), ("kind", KINDS)):
            for value in getattr(self, name):
                if name == "backend" and value not in allowed and peers.is_external(value):
                    continue  # module:function or a registered implementation
                if value not in allowed:
                    raise ValueError(f"{name} {value!r} is unknown; expected one of "
                                     f"{', '.join(allowed)}")
        if not self.variant:
            raise ValueError("variant has no values; expected at least one")
        for value in self.variant:
            parse_variant(value)

    def points(self) -> list[Point]:
        """Every point of the product, kv_heads None replaced by heads."""
        points = []
        for kind, backend, direction, variant, L, d_k, heads, kv_heads, batch, mask, dtype in (
                itertools.product(self.kind, self.backend, self.direction, self.variant,
                                  self.L, self.d_k, self.heads, self.kv_heads, self.batch,
                                  self.mask, self.dtype)):
            points.append(Point(backend=backend, L=L, d_k=d_k, heads=heads,
                                kv_heads=heads if kv_heads is None else kv_heads,
                                batch=batch, mask=mask, dtype=dtype, direction=direction,
                                variant=variant, kind=kind))
        return points


def _check_ints(name: str, values: tuple, *, allow_none: bool) -> None:
    if not values:
        raise ValueError(f"{name} has no values; expected at least one")
    for value in values:
        if value is None and allow_none:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must hold positive integers; got {value!r}")


def grid_from_mapping(mapping: dict, *, where: str = "grid") -> Grid:
    """A :class:`Grid` from a dict of parameter -> value or list of values.

    Raises
    ------
    ValueError
        An unknown parameter (the message lists the known ones) or a bad value.
    """
    names = {field.name for field in fields(Grid)}
    values = {}
    for key, value in mapping.items():
        name = ALIASES.get(key, key)
        if name not in names:
            raise ValueError(f"{where}: unknown parameter {key!r}; expected some of "
                             f"{', '.join(sorted(names))}")
        values[name] = tuple(value) if isinstance(value, list | tuple) else (value,)
    try:
        return Grid(**values)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_grid_file(path) -> list[Grid]:
    """The grids of a TOML (or, with pyyaml installed, YAML) file; see the module docstring.

    Raises
    ------
    ValueError
        The file cannot be parsed, or holds unknown parameters or bad values.
    """
    path = Path(path)
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: reading YAML needs pyyaml (pip install pyyaml); "
                             "or write the grid as TOML") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a table of parameters or a list 'grid' of tables")
    if "grid" in data:
        tables = data["grid"]
        others = sorted(set(data) - {"grid"})
        if others:
            raise ValueError(f"{path}: parameters {others} outside the 'grid' list; put them "
                             "in each [[grid]] table")
        if isinstance(tables, dict):
            tables = [tables]
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise ValueError(f"{path}: 'grid' must be a list of tables ([[grid]] in TOML)")
        return [grid_from_mapping(table, where=f"{path} grid {index + 1}")
                for index, table in enumerate(tables)]
    return [grid_from_mapping(data, where=str(path))]


def expand(grids) -> list[Point]:
    """The union of the grids' points, without repeats, ordered backend by backend.

    Backends come in the order they are first named; within a backend, points keep the
    grids' order.  Timing one backend's points together, after a pause, keeps another
    library's busy-waiting threads (OpenBLAS, OpenMP) out of its timings.
    """
    seen, points = set(), []
    for grid in grids:
        for point in grid.points():
            if point not in seen:
                seen.add(point)
                points.append(point)
    order = {name: index for index, name in enumerate(dict.fromkeys(p.backend for p in points))}
    return sorted(points, key=lambda point: order[point.backend])  # stable: grid order kept


#: Sequence lengths of the quick grid's scaling series: 256 to 4096, ratio ~1.6.
LENGTHS = (256, 416, 640, 1024, 1600, 2560, 4096)
#: Sequence lengths of the window series: 1024 to 16384, ratio ~1.6.
WINDOW_LENGTHS = (1024, 1600, 2560, 4096, 6400, 10240, 16384)
#: Cache lengths of the decode series: 1024 to 65536, doublings (a step reads its cache
#: once: fast).
DECODE_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)

#: Named grids.  "quick" is what ``attnbench run`` sweeps (a minute or two on 2 quiet cores);
#: "tiny" is a smoke test of a few seconds, for the tests (no variant: each new mask
#: function structure compiles a kernel, ~10 s).
GRIDS = {
    "quick": (
        # Time, FLOP/s, error and memory against L, no mask and causal: 7 near-geometric
        # lengths (ratio ~1.6, multiples of 32) over 16x, enough for the scaling fits'
        # intervals (attnbench.studies.scaling).  The reference stops at 2048 (at 4096 it
        # needs ~2.7 GB and seconds per call), so its 16x starts at 128.
        Grid(L=LENGTHS, d_k=(64,), heads=(4,), mask=("none", "causal"),
             backend=("numba", "numpy", "torch")),
        Grid(L=tuple(length // 2 for length in LENGTHS), d_k=(64,), heads=(4,),
             mask=("none", "causal"), backend=("reference",)),
        # Padding and a bool mask at one length; GQA (4 query heads on 1 K/V head).
        Grid(L=(1024,), d_k=(64,), heads=(4,), mask=("padding", "bool"),
             backend=("numba", "reference", "numpy", "torch")),
        Grid(L=(1024,), d_k=(64,), heads=(4,), kv_heads=(1,), backend=("numba", "torch")),
        # Time against d_k, heads and batch, for the fused kernel: 5-7 doublings each
        # (their fits, 4-5 points over 8-16x before, straddled the band now and then).
        Grid(L=(1024,), d_k=(8, 16, 32, 64, 128, 256, 512), heads=(4,), backend=("numba",)),
        Grid(L=(1024,), d_k=(64,), heads=(1, 2, 4, 8, 16, 32), backend=("numba",)),
        Grid(L=(1024,), d_k=(64,), heads=(4,), batch=(1, 2, 4, 8, 16), backend=("numba",)),
        # The backward pass against L (out and lse given; forward not timed), numba and
        # torch's autograd: the O(L²) time and O(L) memory fits of the gradients.
        Grid(L=LENGTHS, d_k=(64,), heads=(4,), mask=("none", "causal"),
             backend=("numba", "torch"), direction=("backward",)),
        # Causal sliding windows (W = 64, 256): time against L·W, and against L at fixed
        # W over 16x (7 lengths from 4W = 1024 up: a window's work, L·W - W²/2 pairs, is
        # linear in L only once L >> W), and the block-skipping speed-up over the plain
        # causal call at the lengths the L series above has; 8 equal documents against
        # the plain non-causal call.
        Grid(L=WINDOW_LENGTHS, d_k=(64,), heads=(4,), mask=("causal",),
             variant=("window-64", "window-256"), backend=("numba",)),
        Grid(L=(1024, 4096), d_k=(64,), heads=(4,), variant=("documents-8",),
             backend=("numba",)),
        # Attention sinks against the plain call (the same lengths as the documents).
        Grid(L=(1024, 4096), d_k=(64,), heads=(4,), variant=("sinks",), backend=("numba",)),
        # Decoding: one query per sequence against caches of 1024 to 65536 keys (GQA 8/2,
        # D = 128, Llama's head size): time against Lk, O(Lk), and the K/V bytes read per
        # second against the read-bandwidth probe; the peers run the same step dense.
        Grid(L=DECODE_LENGTHS, d_k=(128,), heads=(8,), kv_heads=(2,), kind=("decode",),
             backend=("numba", "numpy", "torch")),
        # Packed batches: 4 sequences of L, L/2, L/4, L/8 (work ∝ L²), within each
        # sequence causal and not.
        Grid(L=LENGTHS, d_k=(64,), heads=(4,), batch=(4,), mask=("none", "causal"),
             kind=("varlen",), backend=("numba",)),
    ),
    "tiny": (
        Grid(L=(16, 32, 64), d_k=(8,), heads=(2,), mask=("none", "causal"),
             backend=("numba", "reference", "numpy", "torch")),
        Grid(L=(32,), d_k=(8,), heads=(2,), kv_heads=(1,), mask=("padding", "bool"),
             backend=("numba", "reference")),
        Grid(L=(16, 32, 64), d_k=(8,), heads=(2,), mask=("causal",),
             backend=("numba", "reference"), direction=("backward",)),
        Grid(L=(16, 32, 64), d_k=(8,), heads=(2,), kv_heads=(1,), kind=("decode",),
             backend=("numba", "reference")),
        Grid(L=(16, 32, 64), d_k=(8,), heads=(2,), batch=(3,), mask=("causal",),
             kind=("varlen",), backend=("numba", "reference")),
    ),
}
