"""The ``numba`` backend: fused masked attention on the CPU, parallel over Numba's threads.

- :mod:`.config`: block sizes and thresholds (what tests patch);
- :mod:`.choose`: which path a call takes (micro-kernel or tiles, serial or parallel);
- :mod:`.tiles`, :mod:`.backward_tiles`: the tile pieces of the kernels;
- :mod:`.forward`: the forward kernel (mod functions optional) and ``run``;
- :mod:`.mods`: what the kernels take for a ``score_mod`` or ``mask_mod`` (cell classes);
- :mod:`.backward`: the backward kernel and ``run``;
- :mod:`.micro`, :mod:`.planner`: the register-blocked micro-kernel path and its planner.

The dispatch (:mod:`kernels._dispatch`) imports :mod:`.forward` and :mod:`.backward`.
"""
