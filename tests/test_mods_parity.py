"""``kernels.mods`` built-ins against PyTorch's FlexAttention and JAX's local windows.

FlexAttention runs in eager mode on the CPU (no ``torch.compile``, no C++ toolchain):
slow but exact enough for parity.  Each built-in is written again as FlexAttention
functions on tensors; one user function is written once and given to both.  Skipped
where torch (or jax) is missing.  Every row sees a key here (FlexAttention and
attnbench both give 0 for a row that sees nothing, but that is not what is tested).
Gradients: FlexAttention has no backward on the CPU (torch 2.13 raises), so the same
FlexAttention functions are applied densely in torch ops and differentiated by autograd.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from attnbench import kernels
from attnbench.kernels import mods

from .backward_support import backward_oracle, make_dout
from .support import oracle, tolerance

B, H, HKV, LQ, LK, D = 2, 4, 2, 70, 70, 16
SLOPES = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
TABLE = np.random.default_rng(3).standard_normal((H, 2 * 5 + 1))
DOC_IDS = np.repeat(np.arange(5), 14)[None].repeat(B, 0)
DOC_IDS[1] = np.sort(np.random.default_rng(4).integers(0, 6, LQ))
PREFIX = np.array([9, 0])


def _same_parity(b, h, q_idx, kv_idx):
    """Written once: runs on NumPy-style scalars (Numba) and on tensors (FlexAttention)."""
    return (q_idx - kv_idx) % 2 == 0


def _flex_variants(torch):
    slopes = torch.tensor(SLOPES)
    table = torch.tensor(TABLE)
    doc = torch.tensor(DOC_IDS)
    prefix = torch.tensor(PREFIX)
    R = (TABLE.shape[1] - 1) // 2

    def window(left, right):
        return lambda b, h, qi, ki: (ki >= qi - left) & (ki <= qi + right)

    return [
        # (name, ours, flex score_mod, flex mask_mod)
        ("sliding_window", dict(mask_mod=mods.sliding_window(9, 2)), None, window(9, 2)),
        ("window 0", dict(mask_mod=mods.sliding_window(0)), None, window(0, 0)),
        ("alibi", dict(score_mod=mods.alibi(SLOPES)),
         lambda s, b, h, qi, ki: s + slopes[h].to(s.dtype) * (ki - qi), None),
        ("softcap", dict(score_mod=mods.softcap(0.8)),
         lambda s, b, h, qi, ki: 0.8 * torch.tanh(s / 0.8), None),
        ("relative_bias", dict(score_mod=mods.relative_bias(TABLE)),
         lambda s, b, h, qi, ki: s + table[h, (ki - qi).clamp(-R, R) + R].to(s.dtype), None),
        ("prefix_lm", dict(mask_mod=mods.prefix_lm(PREFIX)), None,
         lambda b, h, qi, ki: (ki < prefix[b]) | (ki <= qi)),
        ("document", dict(mask_mod=mods.document(DOC_IDS)), None,
         lambda b, h, qi, ki: doc[b, qi] == doc[b, ki]),
        ("user function", dict(mask_mod=_same_parity), None, _same_parity),
        ("window and document + softcap",
         dict(mask_mod=mods.and_masks(mods.sliding_window(20), mods.document(DOC_IDS)),
              score_mod=mods.softcap(1.5)),
         lambda s, b, h, qi, ki: 1.5 * torch.tanh(s / 1.5),
         lambda b, h, qi, ki: (ki >= qi - 20) & (ki <= qi) & (doc[b, qi] == doc[b, ki])),
    ]


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    q = torch.zeros(1, 1, 4, 4)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flex.flex_attention(q, q, q)
    except Exception as exc:  # an old torch, or eager mode not available on the CPU
        pytest.skip(f"flex_attention does not run here: {exc}")
    return torch


@pytest.mark.parametrize("dtype, backend", [(np.float32, "numba"), (np.float64, "numba"),
                                            (np.float64, "reference")],
                         ids=["float32-numba", "float64-numba", "float64-reference"])
def test_builtins_match_flex_attention(torch, dtype, backend):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, H, LQ, D)).astype(dtype)
    k = rng.standard_normal((B, HKV, LK, D)).astype(dtype)
    v = rng.standard_normal((B, HKV, LK, D)).astype(dtype)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    for name, ours_kwargs, flex_score, flex_mask in _flex_variants(torch):
        ours = kernels.attention(q, k, v, backend=backend, **ours_kwargs)
        block = None
        if flex_mask is not None:
            block = create_block_mask(flex_mask, B, H, LQ, LK, device="cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = flex_attention(tq, tk, tv, score_mod=flex_score, block_mask=block,
                                    enable_gqa=True).numpy()
        (exact, _), (plain, _) = oracle(q, k, v, **ours_kwargs)
        tol = tolerance(exact, plain, dtype)
        err = np.abs(ours - theirs).max()
        assert err <= 2 * tol, f"{name}: |ours - flex| = {err:.3g} > 2 x tolerance {tol:.3g}"


BACKWARD_VARIANTS = ("sliding_window", "alibi", "softcap", "relative_bias", "document",
                     "window and document + softcap")


def _torch_attention(torch, q, k, v, score_fn, mask_fn):
    """Attention in torch ops with FlexAttention's functions applied to broadcast index
    tensors: what ``flex_attention`` computes, differentiable by torch's autograd on the CPU
    (FlexAttention itself has no CPU backward in torch 2.13)."""
    B_, H_, Lq, D_ = q.shape
    group = H_ // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) / D_ ** 0.5
    b, h, qi, ki = (torch.arange(n).reshape([-1 if d == i else 1 for d in range(4)])
                    for i, n in enumerate((B_, H_, Lq, k.shape[2])))
    if score_fn is not None:
        s = score_fn(s, b, h, qi, ki)
    if mask_fn is not None:
        s = s.masked_fill(~mask_fn(b, h, qi, ki).expand_as(s), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("dtype, backend", [(np.float32, "numba"), (np.float64, "reference")],
                         ids=["float32-numba", "float64-reference"])
def test_builtin_gradients_match_torch_autograd(torch, dtype, backend):
    """dq, dk, dv of attention_backward against torch's autograd through the same
    FlexAttention functions, for windows, ALiBi, softcap, relative biases and documents."""
    rng = np.random.default_rng(5)
    Lq = Lk = 28
    q = rng.standard_normal((B, H, Lq, D)).astype(dtype)
    k = rng.standard_normal((B, HKV, Lk, D)).astype(dtype)
    v = rng.standard_normal((B, HKV, Lk, D)).astype(dtype)
    dout = make_dout(q, v)
    for name, ours_kwargs, flex_score, flex_mask in _flex_variants(torch):
        if name not in BACKWARD_VARIANTS:
            continue
        if "document" in name:  # the documents of the first Lq positions
            ours_kwargs = {**ours_kwargs, "mask_mod": _shorten_documents(ours_kwargs, Lq)}
        ours = kernels.attention_backward(q, k, v, dout, backend=backend, **ours_kwargs)
        tq, tk, tv = (torch.from_numpy(x).requires_grad_(True) for x in (q, k, v))
        _torch_attention(torch, tq, tk, tv, flex_score, flex_mask).backward(
            torch.from_numpy(dout))
        exact, plain = backward_oracle(q, k, v, dout, **ours_kwargs)
        for label, g, t, e, p in zip("qkv", ours, (tq, tk, tv), exact, plain, strict=True):
            err = np.abs(g - t.grad.numpy()).max()
            tol = tolerance(e, p, dtype)
            assert err <= 2 * tol, f"{name} d{label}: |ours - torch| = {err:.3g} > 2 x {tol:.3g}"


def _shorten_documents(kwargs, L):
    """The variant's mask with documents cut to the first ``L`` positions (ids alike)."""
    if "and_masks" in repr(kwargs["mask_mod"]):
        return mods.and_masks(mods.sliding_window(20), mods.document(DOC_IDS[:, :L]))
    return mods.document(DOC_IDS[:, :L])


@pytest.mark.parametrize("left, right", [(0, 0), (5, 0), (7, 3)])
def test_sliding_window_matches_jax_local_window_size(left, right):
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 33, 8)).astype(np.float32) for _ in range(3))
    ours = kernels.attention(q, k, v, mask_mod=mods.sliding_window(left, right),
                             backend="numba")
    # jax's layout is (B, T, N, H)
    theirs = jax.nn.dot_product_attention(
        *(np.swapaxes(x, 1, 2) for x in (q, k, v)), local_window_size=(left, right))
    theirs = np.swapaxes(np.asarray(theirs), 1, 2)
    (exact, _), (plain, _) = oracle(q, k, v, mask_mod=mods.sliding_window(left, right))
    assert np.abs(ours - theirs).max() <= 2 * tolerance(exact, plain, np.float32)
