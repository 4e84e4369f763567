"""The bits of a fixed set of calls of every entry point, as SHA-256 digests.

A change that should not change results (moving code, a new layout, a cleaner dispatch)
is checked against the digests of the commit before it::

    python -m tests.entry_point_bits > before.json      # at the old commit
    python -m tests.entry_point_bits --compare before.json

Digests depend on the machine (the vector ISA Numba compiles for, the BLAS), so they are
compared on one machine, never stored for all.  Every call is small: the whole set
compiles and runs in a minute or two on a cold cache.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np

from attnbench import kernels
from attnbench.kernels import mods


def _rng(seed: int):
    return np.random.default_rng(seed)


def _qkv(seed, B=2, H=4, Hkv=2, Lq=37, Lk=53, D=32, Dv=24, dtype=np.float32):
    rng = _rng(seed)
    return (rng.standard_normal((B, H, Lq, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, D)).astype(dtype),
            rng.standard_normal((B, Hkv, Lk, Dv)).astype(dtype))


def _forward_calls():
    q, k, v = _qkv(1)
    mask = _rng(2).random((2, 1, 37, 53)) < 0.7
    additive = np.where(_rng(3).random((1, 4, 37, 53)) < 0.8, 0.5, -np.inf).astype(np.float32)
    calls = {
        "plain": lambda b: kernels.attention(q, k, v, backend=b),
        "causal": lambda b: kernels.attention(q, k, v, causal=True, backend=b),
        "bottom-right+lse": lambda b: kernels.attention(q, k, v, causal="bottom-right",
                                                        return_lse=True, backend=b),
        "bool-mask": lambda b: kernels.attention(q, k, v, mask=mask, backend=b),
        "float-mask": lambda b: kernels.attention(q, k, v, mask=additive, backend=b),
        "key-lengths+scale": lambda b: kernels.attention(q, k, v, key_lengths=[20, 53],
                                                         scale=0.3, backend=b),
        "dropout": lambda b: kernels.attention(q, k, v, dropout_p=0.2, seed=7, backend=b),
        "sinks": lambda b: kernels.attention(q, k, v, sinks=np.float32([0.5, -1, 2, 0]),
                                             return_lse=True, backend=b),
        "softcap+window": lambda b: kernels.attention(
            q, k, v, score_mod=mods.softcap(20.0), mask_mod=mods.sliding_window(8),
            backend=b),
        "float64": lambda b: kernels.attention(*_qkv(4, dtype=np.float64), causal=True,
                                               backend=b),
    }
    for half in ("float16", "bfloat16"):
        dtype = kernels._dtypes.BFLOAT16 if half == "bfloat16" else np.float16
        calls[half] = lambda b, dtype=dtype: kernels.attention(
            *_qkv(5, dtype=dtype), causal=True, return_lse=True, backend=b)
    return calls


def _backward(b):
    q, k, v = _qkv(6)
    dout = _rng(7).standard_normal((2, 4, 37, 24)).astype(np.float32)
    out, lse = kernels.attention(q, k, v, causal=True, return_lse=True, backend=b)
    return kernels.attention_backward(q, k, v, dout, out=out, lse=lse, causal=True,
                                      backend=b)


def _decode(b, paged: bool):
    rng = _rng(8)
    B, H, Hkv, D, page, pages = 2, 8, 2, 64, 16, 12
    q = rng.standard_normal((B, H, 1, D)).astype(np.float32)
    new_k = rng.standard_normal((B, Hkv, 1, D)).astype(np.float32)
    new_v = rng.standard_normal((B, Hkv, 1, D)).astype(np.float32)
    if paged:
        k_cache = rng.standard_normal((pages, Hkv, page, D)).astype(np.float32)
        v_cache = rng.standard_normal((pages, Hkv, page, D)).astype(np.float32)
        table = rng.permutation(pages).reshape(B, pages // B)
        return kernels.attention_with_kvcache(q, k_cache, v_cache, new_k, new_v,
                                              cache_seqlens=[40, 77], block_table=table,
                                              return_lse=True, backend=b)
    k_cache = rng.standard_normal((B, Hkv, 128, D)).astype(np.float32)
    v_cache = rng.standard_normal((B, Hkv, 128, D)).astype(np.float32)
    return kernels.attention_with_kvcache(q, k_cache, v_cache, new_k, new_v,
                                          cache_seqlens=[40, 100], return_lse=True,
                                          backend=b)


def _varlen(b, backward: bool):
    rng = _rng(9)
    cu = np.array([0, 17, 17, 60])
    q = rng.standard_normal((60, 4, 32)).astype(np.float32)
    k = rng.standard_normal((60, 2, 32)).astype(np.float32)
    v = rng.standard_normal((60, 2, 16)).astype(np.float32)
    if not backward:
        return kernels.attention_varlen(q, k, v, cu, cu, causal=True, return_lse=True,
                                        backend=b)
    dout = rng.standard_normal((60, 4, 16)).astype(np.float32)
    return kernels.attention_varlen_backward(q, k, v, dout, cu, cu, causal=True, backend=b)


def _merge(b):
    q, k, v = _qkv(10)
    parts = [kernels.attention(q, k[:, :, s], v[:, :, s], return_lse=True, backend=b)
             for s in (slice(0, 20), slice(20, 53))]
    return kernels.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])


def calls() -> dict:
    """name -> function of the backend name, returning an array or a tuple of arrays."""
    found = {f"attention/{name}": call for name, call in _forward_calls().items()}
    found["attention_backward/causal"] = _backward
    found["attention_with_kvcache/contiguous"] = lambda b: _decode(b, False)
    found["attention_with_kvcache/paged"] = lambda b: _decode(b, True)
    found["attention_varlen/causal"] = lambda b: _varlen(b, False)
    found["attention_varlen_backward/causal"] = lambda b: _varlen(b, True)
    found["merge_attention_states"] = _merge
    return found


def digest(result) -> str:
    """SHA-256 over the dtype, shape and bytes of every array of ``result``."""
    sha = hashlib.sha256()
    for array in (result if isinstance(result, tuple) else (result,)):
        array = np.ascontiguousarray(array)
        sha.update(f"{array.dtype.str}{array.shape}".encode())
        sha.update(array.tobytes())
    return sha.hexdigest()


def digests(backends=("reference", "numba"), only=None) -> dict:
    """``"backend call" -> digest`` for every call (or those named in ``only``) on every
    backend."""
    return {f"{b} {name}": digest(call(b)) for b in backends
            for name, call in calls().items() if only is None or name in only}


def main(argv=None) -> int:
    """Print the digests as JSON, or (``--compare FILE``) compare them with FILE's;
    ``--numba-only`` leaves the reference backend out."""
    argv = list(sys.argv[1:] if argv is None else argv)
    backends = ("reference", "numba")
    if "--numba-only" in argv:
        argv.remove("--numba-only")
        backends = ("numba",)
    found = digests(backends)
    if argv[:1] == ["--compare"]:
        before = json.loads(open(argv[1]).read())
        changed = sorted(k for k in before if before[k] != found.get(k))
        for name in changed:
            print(f"differs: {name}")
        print(f"{len(before) - len(changed)} of {len(before)} calls bit-identical")
        return 1 if changed else 0
    print(json.dumps(found, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
