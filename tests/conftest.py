"""Test configuration shared by the whole suite.

Numba's CUDA simulator must be switched on before numba is imported, so it is
decided here, before any test module loads: without an NVIDIA device node the
cuda backend is tested in the simulator; with one, on the GPU.  Set
NUMBA_ENABLE_CUDASIM yourself to override.
"""

import os

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not os.path.exists("/dev/nvidiactl"):
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
