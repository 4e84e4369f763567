"""Launching the numba CPU kernels safely: the threading-layer guard and the single-threaded
BLAS inside Numba's threads.  Used by every parallel CPU kernel of the package.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager, nullcontext

import numba

# Numba's 'workqueue' threading layer aborts the process if two Python threads launch
# parallel kernels at once; 'omp' and 'tbb' are thread-safe.  Numba picks tbb > omp >
# workqueue.  Launches are serialised only when the layer in use is workqueue (or not yet
# chosen: the first launch picks it).
launch_lock = threading.Lock()


def launch_guard():
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel has run yet
        layer = None
    return nullcontext() if layer in ("omp", "tbb") else launch_lock


# The BLAS must run single-threaded inside Numba's threads: a multi-threaded OpenBLAS
# (pthreads build, as SciPy's wheels ship) called from Numba's OpenMP threads
# oversubscribes the cores and prints "OpenBLAS Warning : Detect OpenMP Loop and this
# application may hang".  OpenBLAS runs a GEMM on the calling thread when its thread
# count is 1, so every parallel launch sets SciPy's BLAS (the one Numba's np.dot calls)
# to 1 thread and restores it when the last concurrent launch ends.
_blas_lock = threading.Lock()
#: Largest M·N·K that OpenBLAS runs on one thread whatever its setting (interface/gemm.c:
#: SMP_THRESHOLD_MIN 65536 x GEMM_MULTITHREAD_THRESHOLD 4).
BLAS_SINGLE_THREADED_WORK = 65536 * 4
_blas_state = {"users": 0, "saved": [], "controllers": None}


def _numba_blas_controllers():
    """threadpoolctl controllers of the BLAS libraries that SciPy (so Numba's np.dot) uses."""
    if _blas_state["controllers"] is None:
        import scipy.linalg.cython_blas  # noqa: F401  (loads SciPy's BLAS)
        from threadpoolctl import ThreadpoolController

        blas = [lib for lib in ThreadpoolController().lib_controllers
                if lib.user_api == "blas"]
        scipy_own = [lib for lib in blas if "scipy" in lib.filepath.replace("scipy_openblas", "")]
        _blas_state["controllers"] = scipy_own or blas
    return _blas_state["controllers"]


@contextmanager
def single_threaded_blas():
    """Hold SciPy's BLAS at one thread while at least one launch runs."""
    with _blas_lock:
        if _blas_state["users"] == 0:
            controllers = _numba_blas_controllers()
            _blas_state["saved"] = [(lib, lib.num_threads) for lib in controllers]
            for lib in controllers:
                if lib.num_threads != 1:
                    lib.set_num_threads(1)
        _blas_state["users"] += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_state["users"] -= 1
            if _blas_state["users"] == 0:
                for lib, n in _blas_state["saved"]:
                    if n != 1:
                        lib.set_num_threads(n)
