"""Products of bfloat16 pairs: the decode kernel's two products for bfloat16 caches.

A bfloat16 step reads half the bytes of a float32 one, but with its loads widened to
float32 (:mod:`kernels.numba_cpu.products`) it does the same arithmetic, one fused
multiply-add per product: at GQA 32/8 on a 2-core AMD EPYC that arithmetic, not the
memory, set its time (docs/guide/decode.md).  Here both products take their operands as
**pairs** of bfloat16 (two in each 32-bit lane) and add two products per lane and step:

- :func:`pair_row_dots`: ``c[r] = a[r, :depth] · b[:depth]`` with ``a`` (the queries) and
  ``b`` (a key row) both bfloat16 bits; lane ``l`` of step ``t`` takes elements
  ``32t + 2l`` and ``32t + 2l + 1``; the 16 lanes are added pairwise at the end;
- :func:`pair_block_dots`: the same for a block of rows and key rows at once (as
  :func:`kernels.numba_cpu.block_products.block_dots`: each vector loaded once per step for the
  block, the sums folded together), the same sums bit for bit;
- :func:`pair_tile_product`: ``C[r, cols] += Σ_t w[r, t] · B[t, cols]`` over a run of
  keys, ``w`` the softmax weights rounded to bfloat16 (as FlashAttention feeds P to its
  second product) and ``B`` bfloat16 value rows, taken two keys at a time: the rows of keys
  ``2i`` and ``2i + 1`` interleaved into pairs, times the weight pair; an odd last key is
  paired with zeros (never with a row outside the run: a NaN there would reach the sum).

Each step of a lane is :func:`dot_pairs`: ``acc += x_odd · y_odd``, then ``acc += x_even ·
y_even``, each rounded to float32 — the two products are exact in float32 (8-bit
significands), so this is a fused multiply-add per product.  Where the machine has
AVX512-BF16 (and LLVM ≥ 17 types it) that is one ``vdpbf16ps``; elsewhere two fused
multiply-adds on the halves of each lane (a shift and a mask: cheaper than widening).  The
instruction, as Intel defines it, adds in that order and rounds each sum, so the two agree
bit for bit except where the instruction flushes subnormal inputs and results to zero
(``tests/test_pair_products.py`` compares them on the machine it runs on).

Compile-time constants (Numba literals): ``mr``, ``ncols`` and ``native``.  No bounds
checks: the caller guarantees every index is inside its array.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.registry import cpu_target
from numba.extending import intrinsic

from .._jit.half import is_bfloat16_bits
from .block_products import _block_literals, block_dots_ir, indices_ok, key_pointers
from .products import _accumulators, _int64_args, _lanes_added, _literal, _pointer

__all__ = ["LANES", "NATIVE", "PAIR_BLOCK", "pair_block_dots", "pair_row_dots",
           "pair_tile_product"]

#: float32 lanes of one step (a 512-bit vector: 32 bfloat16 in 16 pairs).
LANES = 16
#: bfloat16 elements per step, and the block of columns the products take.
PAIR_BLOCK = 2 * LANES

def _bfloat_type():
    """LLVM's ``bfloat``, the operand type of ``vdpbf16ps`` since LLVM 17, built on
    llvmlite's private float base (llvmlite has no such type); None where that is missing
    (then the kernels use the emulation)."""
    try:
        from llvmlite.ir.types import _BaseFloatType
    except ImportError:
        return None

    class BFloatType(_BaseFloatType):
        null = "0.0"
        intrinsic_name = "bf16"

        def __str__(self):
            return "bfloat"

    BFloatType._create_instance()
    return BFloatType()


_BFLOAT = _bfloat_type()


def _native_dot_available() -> bool:
    """Whether Numba's target machine has AVX512-BF16 and its LLVM takes ``<32 x bfloat>``
    operands for ``vdpbf16ps`` (LLVM 17 and later)."""
    if llvm.llvm_version_info < (17,) or _BFLOAT is None:
        return False
    features = getattr(cpu_target.target_context.codegen(), "_tm_features", "") or ""
    return "+avx512bf16" in features.split(",")


#: Whether the kernels use the ``vdpbf16ps`` instruction (else its emulation).
NATIVE = _native_dot_available()


def dot_pairs(builder, acc, x, y, native):
    """LLVM IR: ``acc`` (``<16 x float>``) plus, in each lane, the products of the lane's
    two bfloat16 of ``x`` and ``y`` (``<16 x i32>``, the even element in the low half):
    the odd pair's product added first, then the even pair's."""
    f32v = acc.type
    if native:
        bfv = ir.VectorType(_BFLOAT, 2 * LANES)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(f32v, [f32v, bfv, bfv]),
            "llvm.x86.avx512bf16.dpbf16ps.512")
        return builder.call(fn, [acc, builder.bitcast(x, bfv), builder.bitcast(y, bfv)])
    i32v = x.type
    high = ir.Constant(i32v, [0xFFFF0000] * LANES)
    shift = ir.Constant(i32v, [16] * LANES)
    fma = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(f32v, [f32v, f32v, f32v]), "llvm.fma.v16f32")

    def odd(v):
        return builder.bitcast(builder.and_(v, high), f32v)

    def even(v):
        return builder.bitcast(builder.shl(v, shift), f32v)

    acc = builder.call(fma, [odd(x), odd(y), acc])
    return builder.call(fma, [even(x), even(y), acc])


def _bits_ok(*arrays) -> bool:
    return all(isinstance(a, types.Array) and is_bfloat16_bits(a.dtype) for a in arrays)


def _blocks(*literals):
    values = [_literal(x, kind) for x, kind in literals]
    return None if None in values else values


def _vector_at(builder, base, offset, vec, align=2):
    return builder.load(builder.bitcast(builder.gep(base, [offset]), vec.as_pointer()),
                        align=align)


@intrinsic
def pair_row_dots(typingctx, a, a0, lda, b, b0, c, c0, ldc, depth, mr, native):
    """``pair_row_dots(a, a0, lda, b, b0, c, c0, ldc, depth, mr, native)``.

    Sets ``c[c0 + r·ldc]`` to ``Σ_t a[a0 + r·lda + t] · b[b0 + t]`` (``t < depth``) for
    ``r < mr``: ``a`` and ``b`` bfloat16 bits (``uint16``), ``c`` float32.  ``depth`` a
    multiple of :data:`PAIR_BLOCK`; ``mr`` and ``native`` compile-time constants."""
    blocks = _blocks((mr, types.IntegerLiteral), (native, types.BooleanLiteral))
    if blocks is None or not _bits_ok(a, b) or not isinstance(c, types.Array):
        return None
    if c.dtype != types.float32:
        return None
    if not all(isinstance(n, types.Integer) for n in (a0, lda, b0, c0, ldc, depth)):
        return None
    sig = types.void(a, a0, lda, b, b0, c, c0, ldc, depth, mr, native)
    return sig, functools.partial(_row_dots_codegen, *blocks)


def _row_dots_codegen(mr, native, context, builder, signature, args):
    i64 = ir.IntType(64)
    ty = signature.args
    a0_, lda_, b0_, c0_, ldc_, depth_ = _int64_args(context, builder, signature, args,
                                                    (1, 2, 4, 6, 7, 8))
    pa = _pointer(context, builder, ty[0], args[0], a0_)
    pb = _pointer(context, builder, ty[3], args[3], b0_)
    pc = _pointer(context, builder, ty[5], args[5], c0_)
    f32v = ir.VectorType(ir.FloatType(), LANES)
    i32v = ir.VectorType(ir.IntType(32), LANES)
    rows_a = [builder.gep(pa, [builder.mul(lda_, ir.Constant(i64, r))]) for r in range(mr)]
    accs = _accumulators(builder, f32v, mr)
    with cgutils.for_range(builder, builder.udiv(depth_, ir.Constant(i64, PAIR_BLOCK))) as loop:
        t = builder.mul(loop.index, ir.Constant(i64, PAIR_BLOCK))
        bv = _vector_at(builder, pb, t, i32v)
        for r in range(mr):
            av = _vector_at(builder, rows_a[r], t, i32v)
            builder.store(dot_pairs(builder, builder.load(accs[r]), av, bv, native), accs[r])
    for r in range(mr):
        scalar = _lanes_added(builder, builder.load(accs[r]), LANES)
        builder.store(scalar, builder.gep(pc, [builder.mul(ldc_, ir.Constant(i64, r))]))
    return context.get_dummy_value()


@intrinsic
def pair_block_dots(typingctx, a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk,
                    native):
    """``pair_block_dots(a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk, native)``.

    Sets ``c[c0 + r·ldc + k]`` to ``Σ_t a[a0 + r·lda + t] · b[rows[j0 + k]·ldb + t]``
    (``t < depth``) for ``r < mr``, ``k < nk``: :func:`pair_row_dots` for ``nk`` key rows at
    once, the same sums bit for bit.  ``a`` and ``b`` bfloat16 bits, ``c`` float32;
    ``depth`` a multiple of :data:`PAIR_BLOCK`; ``mr``, ``nk`` and ``native`` compile-time
    constants, ``mr·nk`` a power of two ``<=`` :data:`LANES`."""
    blocks = _block_literals(mr, nk, types.IntegerLiteral(LANES))
    native_ = _literal(native, types.BooleanLiteral)
    if blocks is None or native_ is None or not _bits_ok(a, b):
        return None
    if not isinstance(c, types.Array) or c.dtype != types.float32:
        return None
    if not indices_ok(rows, (a0, lda, j0, ldb, c0, ldc, depth)):
        return None
    sig = types.void(a, a0, lda, b, rows, j0, ldb, c, c0, ldc, depth, mr, nk, native)
    return sig, functools.partial(_block_dots_codegen, blocks[0], blocks[1], native_)


def _block_dots_codegen(mr, nk, native, context, builder, signature, args):
    i64 = ir.IntType(64)
    ty = signature.args
    a0_, lda_, j0_, ldb_, c0_, ldc_, depth_ = _int64_args(context, builder, signature, args,
                                                          (1, 2, 5, 6, 8, 9, 10))
    pa = _pointer(context, builder, ty[0], args[0], a0_)
    pb = _pointer(context, builder, ty[3], args[3], ir.Constant(i64, 0))
    pc = _pointer(context, builder, ty[7], args[7], c0_)
    f32 = ir.FloatType()
    f32v = ir.VectorType(f32, LANES)
    i32v = ir.VectorType(ir.IntType(32), LANES)
    rows_a = [builder.gep(pa, [builder.mul(lda_, ir.Constant(i64, r))]) for r in range(mr)]
    rows_b = key_pointers(context, builder, ty[4], args[4], j0_, ldb_, pb, nk)
    accs = _accumulators(builder, f32v, mr * nk)
    with cgutils.for_range(builder, builder.udiv(depth_, ir.Constant(i64, PAIR_BLOCK))) as loop:
        t = builder.mul(loop.index, ir.Constant(i64, PAIR_BLOCK))
        bvs = [_vector_at(builder, row, t, i32v) for row in rows_b]
        for r in range(mr):
            av = _vector_at(builder, rows_a[r], t, i32v)
            for k in range(nk):
                acc = accs[r * nk + k]
                builder.store(dot_pairs(builder, builder.load(acc), av, bvs[k], native), acc)
    block_dots_ir(builder, accs, mr, nk, LANES, pc, ldc_, f32, 4)
    return context.get_dummy_value()


@intrinsic
def pair_tile_product(typingctx, w, w0, ldw, b, b0, ldb, c, c0, ldc, run, mr, ncols, native):
    """``pair_tile_product(w, w0, ldw, b, b0, ldb, c, c0, ldc, run, mr, ncols, native)``.

    Adds to ``c[c0 + r·ldc + j]`` the sum over ``t < run`` of ``w[w0 + r·ldw + t] ·
    b[b0 + t·ldb + j]`` for ``r < mr``, ``j < ncols``: ``w`` and ``b`` bfloat16 bits
    (``uint16``), ``c`` float32, columns in natural order.  Keys are taken in pairs (``2i``,
    ``2i + 1``), an odd last key paired with zeros.  ``ncols`` a multiple of :data:`LANES`;
    ``mr``, ``ncols`` and ``native`` compile-time constants."""
    blocks = _blocks((mr, types.IntegerLiteral), (ncols, types.IntegerLiteral),
                     (native, types.BooleanLiteral))
    if blocks is None or blocks[1] % LANES or not _bits_ok(w, b):
        return None
    if not isinstance(c, types.Array) or c.dtype != types.float32:
        return None
    if not all(isinstance(n, types.Integer) for n in (w0, ldw, b0, ldb, c0, ldc, run)):
        return None
    sig = types.void(w, w0, ldw, b, b0, ldb, c, c0, ldc, run, mr, ncols, native)
    return sig, functools.partial(_tile_codegen, *blocks)


#: Shuffle mask interleaving 16 columns of two rows into pairs (row 0's, row 1's).
_INTERLEAVE = [k for col in range(LANES) for k in (col, col + LANES)]


def _tile_codegen(mr, ncols, native, context, builder, signature, args):
    i64, i32, i16 = ir.IntType(64), ir.IntType(32), ir.IntType(16)
    ty = signature.args
    w0_, ldw_, b0_, ldb_, c0_, ldc_, run_ = _int64_args(context, builder, signature, args,
                                                        (1, 2, 4, 5, 7, 8, 9))
    pw = _pointer(context, builder, ty[0], args[0], w0_)
    pb = _pointer(context, builder, ty[3], args[3], b0_)
    pc = _pointer(context, builder, ty[6], args[6], c0_)
    f32v = ir.VectorType(ir.FloatType(), LANES)
    i32v = ir.VectorType(i32, LANES)
    row16 = ir.VectorType(i16, LANES)
    mask = ir.Constant(ir.VectorType(i32, 2 * LANES), _INTERLEAVE)
    n_vec = ncols // LANES
    c_rows = [builder.gep(pc, [builder.mul(ldc_, ir.Constant(i64, r))]) for r in range(mr)]
    c_ptrs = [[builder.bitcast(builder.gep(row, [ir.Constant(i64, LANES * v)]), f32v.as_pointer())
               for v in range(n_vec)] for row in c_rows]
    accs = [_accumulators(builder, f32v, n_vec, [builder.load(p, align=4) for p in ptrs])
            for ptrs in c_ptrs]
    w_rows = [builder.gep(pw, [builder.mul(ldw_, ir.Constant(i64, r))]) for r in range(mr)]
    zero_row = ir.Constant(row16, None)

    def step(t, second_row, weight_of):
        """One pair of keys: rows ``t`` and ``t + 1`` (``second_row`` False: zeros)."""
        first = builder.gep(pb, [builder.mul(t, ldb_)])
        pairs = []
        for v in range(n_vec):
            col = ir.Constant(i64, v * LANES)
            v0 = _vector_at(builder, first, col, row16)
            v1 = (_vector_at(builder, builder.gep(first, [ldb_]), col, row16)
                  if second_row else zero_row)
            pairs.append(builder.bitcast(builder.shuffle_vector(v0, v1, mask), i32v))
        for r in range(mr):
            wv = builder.insert_element(ir.Constant(i32v, ir.Undefined), weight_of(r, t),
                                        ir.Constant(i32, 0))
            wv = builder.shuffle_vector(wv, ir.Constant(i32v, ir.Undefined),
                                        ir.Constant(i32v, [0] * LANES))
            for v in range(n_vec):
                acc = accs[r][v]
                builder.store(dot_pairs(builder, builder.load(acc), wv, pairs[v], native), acc)

    def weight_pair(r, t):  # w[t] (low half) and w[t + 1] (high half), one 32-bit load
        ptr = builder.bitcast(builder.gep(w_rows[r], [t]), i32.as_pointer())
        return builder.load(ptr, align=2)

    def weight_alone(r, t):  # w[t] and a zero
        return builder.zext(builder.load(builder.gep(w_rows[r], [t])), i32)

    with cgutils.for_range(builder, builder.udiv(run_, ir.Constant(i64, 2))) as loop:
        step(builder.mul(loop.index, ir.Constant(i64, 2)), True, weight_pair)
    last = builder.sub(run_, ir.Constant(i64, 1))
    odd = builder.icmp_unsigned("==", builder.and_(run_, ir.Constant(i64, 1)), ir.Constant(i64, 1))
    with builder.if_then(odd):
        step(last, False, weight_alone)
    for r in range(mr):
        for v in range(n_vec):
            builder.store(builder.load(accs[r][v]), c_ptrs[r][v], align=4)
    return context.get_dummy_value()
