"""The micro-kernel path's planner, and its choices persisted ("wisdom", as FFTW says).

:func:`plan` picks the register block of :data:`kernels.numba_cpu.dense.micro.CONFIGS`
(the candidates for the vector registers of the target Numba compiles for:
:func:`kernels.numba_cpu.dense.micro.register_blocks`), :func:`choice` whether that block
beats the BLAS tile kernel; both time one thread by CPU time and persist what they chose.
Forcing a replan: delete the entry (or the file) in every location :func:`locations`
lists, or point ``NUMBA_CACHE_DIR`` at a new directory where the per-user one has none.

A choice is stored per key (the CPU name and features Numba compiles for, and the dtype)
in one small JSON file, ``microkernel-plan.json``, next to Numba's on-disk cache: in
``NUMBA_CACHE_DIR`` when set, else in this package's ``__pycache__``.  Where that cannot
be written (a read-only install) the file goes to a per-user cache directory
(``$XDG_CACHE_HOME/attnbench`` or ``~/.cache/attnbench``); where neither can, the choice
lives in memory only.  A file that cannot be read or parsed, of another format version,
or whose entry does not pass the caller's check, is ignored (and replaced at the next
store).  Writes are atomic (a temporary file renamed over the old one).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
import warnings
from pathlib import Path

import numba
import numpy as np

from .._dtypes import compute_dtype
from .._jit import isa
from .._problems.checks import check_attention_args
from ..stats import median_interval
from .dense import forward
from .dense.micro import CONFIGS, run
from .products.pairs import NATIVE

__all__ = ["FILENAME", "NOT_PLANNED", "PLAN_WORK_LIMIT", "VERSION", "PlanningWarning",
           "block_for", "choice", "forms", "load", "locations", "machine_key", "plan",
           "plan_all", "record", "store", "stored_choice"]

FILENAME = "microkernel-plan.json"
#: Format version: a file of another version is ignored.
VERSION = 1


def locations() -> list[Path]:
    """Directories tried for the file, in order: beside Numba's cache, then per user."""
    from numba.core import config

    primary = (Path(config.CACHE_DIR) if config.CACHE_DIR
               else Path(__file__).resolve().parent / "__pycache__")
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnbench"
    return [primary, user]


def machine_key(dtype) -> str:
    """``cpu name|features|dtype``: Numba's target (:func:`kernels._jit.isa.target`), and
    the dtype."""
    target = isa.target()
    return f"{target.cpu}|{target.feature_string}|{dtype}"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def load(key: str, valid=lambda entry: True) -> dict | None:
    """The stored entry for ``key`` from the first location that has a valid one, or None."""
    for directory in locations():
        entry = _read(directory / FILENAME).get(key)
        if isinstance(entry, dict):
            try:
                if valid(entry):
                    return entry
            except (KeyError, TypeError, ValueError):
                pass
    return None


def store(key: str, entry: dict) -> Path | None:
    """Merge ``entry`` under ``key`` into the first writable location; its path, or None."""
    for directory in locations():
        path = directory / FILENAME
        try:
            directory.mkdir(parents=True, exist_ok=True)
            entries = _read(path)
            entries[key] = entry
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".microkernel-plan-")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump({"version": VERSION, "entries": entries}, f, indent=1)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
            return path
        except OSError:
            continue
    return None


#: The planner's representative problem (B, H, L, D) and its interleaved rounds.
PLAN_SHAPE = (1, 4, 1024, 64)
PLAN_ROUNDS = 9
_PLANS: dict = {}  # this process's choices, per dtype (plan, then choice)
_CHOICES: dict = {}
#: What :func:`record` says for a dtype with no stored choice (and ``_CHOICES`` holds
#: after looking for one in vain).
NOT_PLANNED = "not planned"


def _cpu_clock():
    """The clock that sees one Numba thread's work: the calling thread's CPU time.

    Numba's OpenMP and TBB layers run a one-thread launch on the calling thread; its
    workqueue layer hands it to a worker, so there the process's CPU time is used.
    """
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel launch yet
        layer = None
    return time.thread_time if layer in ("omp", "tbb") else time.process_time


def _time_calls(calls: dict, rounds: int) -> dict:
    """CPU seconds of each call per round, on one Numba thread, interleaved.

    Every call runs once untimed (compilation, first touch); then each round times every
    call once, starting one further along the list each round (so that a drift of the
    machine's speed does not fall on one call).  CPU time, not wall time: on a shared
    machine it counts the work, not the waits for a core.
    """
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        for call in calls.values():
            call()
        clock = _cpu_clock()
        names = list(calls)
        samples = {name: [] for name in names}
        for i in range(rounds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                start = clock()
                calls[name]()
                samples[name].append(clock() - start)
    finally:
        numba.set_num_threads(threads)
    return samples


def _summary(samples: dict) -> dict:
    """``{"mrxnr" or name: [median, low, high]}``: medians and their 95% intervals (s)."""
    def label(name):
        return name if isinstance(name, str) else "x".join(map(str, name))

    return {label(name): list(median_interval(s)) for name, s in samples.items()}


def _plan_problem(dtype, shape):
    rng = np.random.default_rng(0)
    return check_attention_args(*(rng.standard_normal(shape).astype(dtype) for _ in range(3)))


def _valid_plan(dtype):
    return lambda entry: tuple(entry["plan"]) in CONFIGS[dtype]


def _valid_choice(dtype):
    def valid(entry):
        return _valid_plan(dtype)(entry) and (entry["choice"] == "blas"
                                              or tuple(entry["choice"]) == tuple(entry["plan"]))
    return valid


def plan(dtype, *, shape=PLAN_SHAPE, rounds: int = PLAN_ROUNDS) -> tuple[int, int]:
    """The fastest register block of :data:`CONFIGS` for ``dtype`` on this machine.

    Like FFTW's planner with its wisdom: the choice is looked up in memory, then in the
    persisted file (:func:`load`: per CPU name, features and dtype); only
    where neither has one is every candidate compiled and timed (:func:`_time_calls`:
    one thread, CPU time, ``rounds`` interleaved rounds on random inputs of ``shape``
    (B, H, L, D)), the block with the lowest median kept, and the choice persisted with
    the medians and their 95% intervals.
    """
    dtype = np.dtype(dtype)
    if dtype not in _PLANS:
        key = machine_key(dtype.name)
        entry = load(key, _valid_plan(dtype))
        if entry is None:
            problem = _plan_problem(dtype, shape)
            samples = _time_calls({c: functools.partial(run, problem, c) for c in CONFIGS[dtype]},
                                  rounds)
            best = min(samples, key=lambda c: median_interval(samples[c])[0])
            entry = {"plan": list(best), "plan_seconds": _summary(samples),
                     "shape": list(shape), "rounds": rounds}
            store(key, entry)
        _PLANS[dtype] = tuple(entry["plan"])
    return _PLANS[dtype]


def choice(dtype, *, shape=PLAN_SHAPE, rounds: int = PLAN_ROUNDS) -> tuple[int, int] | None:
    """The planned register block if it beats the BLAS tile kernel here, else None.

    What the numba backend consults per machine and dtype (see :func:`block_for`) and
    the machine record reports (:func:`record`): the micro-kernel path at :func:`plan`'s
    block against the BLAS tiles of :func:`kernels.numba_cpu.choose.run`, timed as :func:`plan`
    times, the lower median winning; remembered and persisted as :func:`plan` is
    (``"choice"``: the block or ``"blas"``).
    """
    dtype = np.dtype(dtype)
    if _CHOICES.get(dtype, NOT_PLANNED) == NOT_PLANNED:  # none yet, or none stored
        config = plan(dtype, shape=shape, rounds=rounds)
        key = machine_key(dtype.name)
        entry = load(key, _valid_choice(dtype))
        if entry is None or tuple(entry["plan"]) != config:
            problem = _plan_problem(dtype, shape)
            samples = _time_calls({"micro": functools.partial(run, problem, config),
                                   "blas": functools.partial(forward.run_tiles, problem,
                                                             parallel=True)}, rounds)
            med = {name: median_interval(s)[0] for name, s in samples.items()}
            entry = dict(load(key, _valid_plan(dtype)) or {"plan": list(config)},
                         choice=list(config) if med["micro"] < med["blas"] else "blas",
                         choice_seconds=_summary(samples))
            store(key, entry)
        _CHOICES[dtype] = None if entry["choice"] == "blas" else tuple(entry["choice"])
    return _CHOICES[dtype]


# --- what the numba backend and the machine record ask -------------------------------------

#: Problems with at least this many multiply-adds (B·H·Lq·Lk·(D+Dv); e.g. B=1, H=12,
#: L=4096, D=64) plan at first use when no choice is stored: a call that long makes the
#: planner's one-off cost (compiling the candidates, ~20-45 s on a cold cache) worth
#: announcing and paying.  Smaller problems take the BLAS path until a plan exists.
PLAN_WORK_LIMIT = 1 << 34
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class PlanningWarning(UserWarning):
    """The numba backend is about to plan (once per machine and dtype; seconds)."""


def stored_choice(dtype):
    """The choice made earlier (in this process or persisted), without planning.

    Returns
    -------
    tuple of int, "blas" or None
        The register block, ``"blas"``, or None where no choice is stored for ``dtype``.
    """
    dtype = np.dtype(dtype)
    if dtype not in _CHOICES:  # looked up once per process: a miss is remembered too
        entry = load(machine_key(dtype.name), _valid_choice(dtype))
        if entry is None:
            _CHOICES[dtype] = NOT_PLANNED
        else:
            _PLANS[dtype] = tuple(entry["plan"])
            _CHOICES[dtype] = None if entry["choice"] == "blas" else tuple(entry["choice"])
    stored = _CHOICES[dtype]
    return None if stored == NOT_PLANNED else stored or "blas"


def stored_block(dtype, *, default: bool = False):
    """The register block stored for ``dtype`` where the planner chose the micro-kernel
    (:func:`stored_choice`); else the dtype's default block (the first of :data:`CONFIGS`)
    if ``default``, else None.  Never plans."""
    dtype = np.dtype(dtype)
    stored = stored_choice(dtype)
    if isinstance(stored, tuple):
        return stored
    return CONFIGS[dtype][0] if default else None


def block_for(problem):
    """The register block the numba backend should use for ``problem``, or None (BLAS).

    The stored choice where there is one; else, for a problem of at least
    :data:`PLAN_WORK_LIMIT` multiply-adds, :func:`choice` now, announced by a
    :class:`PlanningWarning`; else None, without planning.
    """
    dtype = compute_dtype(problem.dtype)  # half inputs: float32's choice
    stored = stored_choice(dtype)
    if stored is None:
        if problem.work < PLAN_WORK_LIMIT:
            return None
        warnings.warn(PlanningWarning(
            f"kernels: timing the numba backend's two tile-product paths for "
            f"{dtype.name} on this machine (once; the choice is stored in "
            f"{FILENAME} beside Numba's cache). This first call takes ~20-45 s longer; "
            f"kernels.plan() does it ahead of time."), stacklevel=4)
        return choice(dtype)
    return None if stored == "blas" else stored


def plan_all(dtypes=_DTYPES) -> dict:
    """Plan and choose for each dtype now (:func:`choice`); :func:`record` of them."""
    for dtype in dtypes:
        choice(dtype)
    return record(dtypes)


def record(dtypes=_DTYPES) -> dict:
    """``{dtype name: "8x16" (the block), "blas" or "not planned"}``; never plans."""
    def label(stored):
        if stored is None:
            return NOT_PLANNED
        return stored if stored == "blas" else "x".join(map(str, stored))

    return {np.dtype(d).name: label(stored_choice(d)) for d in dtypes}


def forms() -> dict:
    """The forms the numba backend compiles for this target; never compiles or plans.

    Returns
    -------
    dict
        ``target`` (Numba's CPU and its vector registers, :func:`kernels._jit.isa.target`),
        ``micro_blocks`` (per dtype, the register blocks ``"8x16"`` the planner chooses
        among) and ``bfloat16_products`` (``"vdpbf16ps"``, or ``"emulated"``: two fused
        multiply-adds per pair where the target lacks AVX512-BF16).
    """
    return {"target": isa.target().describe(),
            "micro_blocks": {np.dtype(d).name: ["x".join(map(str, block)) for block in CONFIGS[d]]
                             for d in _DTYPES},
            "bfloat16_products": "vdpbf16ps" if NATIVE else "emulated"}
