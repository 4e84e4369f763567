"""Register-blocked products in LLVM IR: the numba backend's micro-kernels.

LLVM does not keep loop-carried array accumulators in vector registers when Numba's loops
are vectorised, so the two products the fast paths need are written as Numba intrinsics
that hold ``mr`` accumulators of ``nr`` lanes (``<nr x float>``: LLVM splits them into the
machine's registers) across a whole depth, one fused multiply-add per accumulator and step:

- :func:`tile_product`: ``C[mr, nr] (+)= A[mr, depth] · B[depth, nr]``, one vector load of
  a B row and ``mr`` broadcasts of A per step (the forward micro-kernel's both products,
  :mod:`kernels.numba_cpu.dense.micro`; the decode kernel's ``P · V``);
- :func:`row_dots`: ``c[r] = A[r, :depth] · b`` for ``mr`` rows sharing one vector ``b``,
  ``nr`` lanes a step, the lanes added pairwise at the end (the decode kernel's scores,
  one key row at a time, in address order; a block of key rows at once:
  :mod:`kernels.numba_cpu.products.blocks`);
- :func:`ordered_sum`: ``Σ a[a0 : a0 + n]`` in vector lanes folded pairwise, then the tail
  in order (the softmax row sums of the micro-kernel, the tiles and decode).  Written out
  because a sum left to LLVM's loop vectoriser (``reassoc``) is added in the order the
  vectoriser picks for the loop in its module: the same Numba function compiled into two
  kernels summed in different orders, a few ulps apart, and which copy a call ran depended
  on which kernel a process compiled first.

In both products, B may hold half bits (``uint16`` bfloat16, ``int16`` float16) where A
and C are float32: each loaded vector is widened in registers
(:func:`kernels._jit.half.widen_vector_ir`), so a half cache is never copied.  ``mr``,
``nr`` (and ``accumulate``) are compile-time constants (Numba literals): they shape the
generated code, so the callers are ordinary module-level functions Numba caches on disk.
No bounds checks: the caller guarantees every index is inside its array.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..._jit.half import is_half_bits, widen_vector_ir

__all__ = ["SUM_LANES", "ordered_sum", "row_dots", "tile_product"]

#: Lanes of the softmax row sums (:func:`ordered_sum`) in every numba kernel: 16 float32
#: (one zmm, two ymm), the same order on every machine.
SUM_LANES = 16


def _literal(ty, kind):
    return ty.literal_value if isinstance(ty, kind) else None


def _operands_ok(a, b, c) -> bool:
    """A and C of one float dtype; B of it too, or half bits with float32 A and C."""
    if not all(isinstance(x, types.Array) for x in (a, b, c)):
        return False
    if a.dtype not in (types.float32, types.float64) or c.dtype != a.dtype:
        return False
    return b.dtype == a.dtype or (is_half_bits(b.dtype) and a.dtype == types.float32)


def _pointer(context, builder, ty, value, offset):
    """The address of flat element ``offset`` of array ``value`` (of Numba type ``ty``)."""
    return builder.gep(context.make_array(ty)(context, builder, value).data, [offset])


def _vector_loader(context, builder, b_type, nr, align):
    """``load(pointer)``: ``nr`` consecutive elements of B from ``pointer`` as a vector of
    the compute type (half bits widened in registers)."""
    if is_half_bits(b_type.dtype):
        bits = ir.VectorType(ir.IntType(16), nr)
        return lambda ptr: widen_vector_ir(
            builder, builder.load(builder.bitcast(ptr, bits.as_pointer()), align=2), b_type.dtype)
    vec = ir.VectorType(context.get_value_type(b_type.dtype), nr)
    return lambda ptr: builder.load(builder.bitcast(ptr, vec.as_pointer()), align=align)


def _fmuladd(context, builder, elem, nr, align):
    vec = ir.VectorType(elem, nr)
    return cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fmuladd.v{nr}f{8 * align}")


def _int64_args(context, builder, signature, args, positions):
    """The integer arguments at ``positions``, as int64 values."""
    return [context.cast(builder, args[k], signature.args[k], types.int64) for k in positions]


def _operands(context, builder, signature, args, c_pos, nr):
    """What both products start with: the vector of ``nr`` compute elements and the
    element's alignment, pointers to A (argument 0), B (3) and C (``c_pos``) at their
    offsets (the argument after each array), B's vector loader and ``llvm.fmuladd``."""
    ty = signature.args
    elem = context.get_value_type(ty[0].dtype)
    align = context.get_abi_sizeof(elem)
    offsets = _int64_args(context, builder, signature, args, (1, 4, c_pos + 1))
    pa, pb, pc = (_pointer(context, builder, ty[k], args[k], offset)
                  for k, offset in zip((0, 3, c_pos), offsets, strict=True))
    return (ir.VectorType(elem, nr), align, pa, pb, pc,
            _vector_loader(context, builder, ty[3], nr, align),
            _fmuladd(context, builder, elem, nr, align))


def _lanes_folded(builder, total, width, to):
    """Vector ``total`` of ``width`` lanes folded pairwise to ``to`` lanes: lanes
    ``[0, w/2) + [w/2, w)`` while ``w > to`` (halves, quarters, ...)."""
    i32 = ir.IntType(32)
    while width > to:
        width //= 2
        halves = [builder.shuffle_vector(total, total, ir.Constant(
            ir.VectorType(i32, width), list(range(lo, lo + width)))) for lo in (0, width)]
        total = builder.fadd(*halves)
    return total


def _lanes_added(builder, total, nr):
    """The ``nr`` lanes of vector ``total`` added pairwise (halves, quarters, ...): a scalar."""
    return builder.extract_element(_lanes_folded(builder, total, nr, 1),
                                   ir.Constant(ir.IntType(32), 0))


def _accumulators(builder, vec, mr, initial=None):
    """``mr`` entry-block allocas of ``vec`` (promoted to registers by mem2reg), zero or
    ``initial[r]``."""
    slots = []
    for r in range(mr):
        slot = cgutils.alloca_once(builder, vec)
        builder.store(initial[r] if initial else ir.Constant(vec, None), slot)
        slots.append(slot)
    return slots


@intrinsic
def tile_product(typingctx, a, a0, lda, b, b0, ldb, c, c0, ldc, depth, mr, nr, accumulate):
    """``tile_product(a, a0, lda, b, b0, ldb, c, c0, ldc, depth, mr, nr, accumulate)``.

    For 1-D arrays ``a``, ``b``, ``c`` of one float dtype (``b`` may hold half bits where
    the others are float32), it sets (``accumulate``: adds to) ``c[c0 + r·ldc + j]`` the
    sum over ``t < depth`` of ``a[a0 + r·lda + t] · b[b0 + t·ldb + j]`` for ``r < mr``,
    ``j < nr``, summing in order of ``t`` with one fused multiply-add per term
    (``llvm.fmuladd``).  ``mr``, ``nr`` and ``accumulate`` must be compile-time constants.
    """
    ints = (a0, lda, b0, ldb, c0, ldc, depth)
    blocks = (_literal(mr, types.IntegerLiteral), _literal(nr, types.IntegerLiteral),
              _literal(accumulate, types.BooleanLiteral))
    if not _operands_ok(a, b, c) or None in blocks:
        return None
    if not all(isinstance(n, types.Integer) for n in ints):
        return None
    sig = types.void(a, a0, lda, b, b0, ldb, c, c0, ldc, depth, mr, nr, accumulate)
    return sig, functools.partial(_product_codegen, *blocks)


def _product_codegen(mr, nr, accumulate, context, builder, signature, args):
    """LLVM IR of :func:`tile_product` for one register block.

    Each row of ``nr`` lanes is held as ``nr / w`` vectors of ``w`` lanes, ``w`` the largest
    power of two dividing ``nr``: LLVM splits a power-of-two vector into whole registers,
    but legalises ``<24 x float>`` lane by lane (inserts and extracts around every
    operation).  The arithmetic is per lane either way, so the split leaves the bits."""
    i64 = ir.IntType(64)
    width = nr & -nr
    parts = range(nr // width)
    lda_, ldb_, ldc_, depth_ = _int64_args(context, builder, signature, args, (2, 5, 8, 9))
    vec, align, pa, pb, pc, load_b, fmuladd = _operands(context, builder, signature, args, 6,
                                                         width)

    def at(base, ld, r, k):  # element r·ld + k·width of ``base`` (``r`` an int or a value)
        r = r if isinstance(r, ir.Value) else ir.Constant(i64, r)
        return builder.gep(base, [builder.add(builder.mul(ld, r), ir.Constant(i64, k * width))])

    rows_c = [builder.bitcast(at(pc, ldc_, r, k), vec.as_pointer())
              for r in range(mr) for k in parts]
    initial = [builder.load(row, align=align) for row in rows_c] if accumulate else None
    accs = _accumulators(builder, vec, len(rows_c), initial)  # row r, part k: r·parts + k
    rows_a = [builder.gep(pa, [builder.mul(lda_, ir.Constant(i64, r))]) for r in range(mr)]
    lanes = ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width)
    undef = ir.Constant(vec, ir.Undefined)
    with cgutils.for_range(builder, depth_) as loop:
        t = loop.index
        bvs = [load_b(at(pb, ldb_, t, k)) for k in parts]
        for r in range(mr):
            x = builder.load(builder.gep(rows_a[r], [t]))
            xs = builder.insert_element(undef, x, ir.Constant(ir.IntType(32), 0))
            xs = builder.shuffle_vector(xs, undef, lanes)
            for k, bv in zip(parts, bvs, strict=True):
                acc = accs[r * len(parts) + k]
                builder.store(builder.call(fmuladd, [xs, bv, builder.load(acc)]), acc)
    for row, acc in zip(rows_c, accs, strict=True):
        builder.store(builder.load(acc), row, align=align)
    return context.get_dummy_value()


@intrinsic
def row_dots(typingctx, a, a0, lda, b, b0, c, c0, ldc, depth, mr, nr):
    """``row_dots(a, a0, lda, b, b0, c, c0, ldc, depth, mr, nr)``.

    Sets ``c[c0 + r·ldc]`` to the sum over ``t < depth`` of ``a[a0 + r·lda + t] ·
    b[b0 + t]`` for ``r < mr``: ``mr`` dot products sharing the vector ``b`` (which may
    hold half bits where ``a`` and ``c`` are float32).  The sum runs in ``nr`` lanes (one
    fused multiply-add per ``nr`` terms and row), then the lanes are added pairwise
    (halves, quarters, ...).  ``depth`` must be a multiple of ``nr``, a power of two.
    """
    ints = (a0, lda, b0, c0, ldc, depth)
    blocks = (_literal(mr, types.IntegerLiteral), _literal(nr, types.IntegerLiteral))
    if not _operands_ok(a, b, c) or None in blocks or blocks[1] & (blocks[1] - 1):
        return None
    if not all(isinstance(n, types.Integer) for n in ints):
        return None
    sig = types.void(a, a0, lda, b, b0, c, c0, ldc, depth, mr, nr)
    return sig, functools.partial(_row_dots_codegen, *blocks)


def _row_dots_codegen(mr, nr, context, builder, signature, args):
    """LLVM IR of :func:`row_dots` for one block of rows."""
    i64 = ir.IntType(64)
    lda_, ldc_, depth_ = _int64_args(context, builder, signature, args, (2, 7, 8))
    vec, align, pa, pb, pc, load_b, fmuladd = _operands(context, builder, signature, args, 5,
                                                         nr)
    rows_a = [builder.gep(pa, [builder.mul(lda_, ir.Constant(i64, r))]) for r in range(mr)]
    accs = _accumulators(builder, vec, mr)
    with cgutils.for_range(builder, builder.udiv(depth_, ir.Constant(i64, nr))) as loop:
        t = builder.mul(loop.index, ir.Constant(i64, nr))
        bv = load_b(builder.gep(pb, [t]))
        for r in range(mr):
            av = builder.load(builder.bitcast(builder.gep(rows_a[r], [t]), vec.as_pointer()),
                              align=align)
            builder.store(builder.call(fmuladd, [av, bv, builder.load(accs[r])]), accs[r])
    for r in range(mr):
        scalar = _lanes_added(builder, builder.load(accs[r]), nr)
        builder.store(scalar, builder.gep(pc, [builder.mul(ldc_, ir.Constant(i64, r))]))
    return context.get_dummy_value()


@intrinsic
def ordered_sum(typingctx, a, a0, n, nr):
    """``ordered_sum(a, a0, n, nr)``: the sum of ``a[a0 : a0 + n]`` (``a`` a C-contiguous
    1-D float array) in one order whatever code surrounds it, fixed by ``n`` alone:

    1. the first ``n - n % (4·nr)`` elements into ``4·nr`` lanes (element ``t`` into lane
       ``t % (4·nr)``, in order: four independent chains of vector adds), the lanes then
       folded pairwise to ``nr`` (halves: lane ``l`` + lane ``l + 2·nr``, then ``+ nr``);
    2. the next whole vectors of ``nr`` elements into those ``nr`` lanes, in order;
    3. the ``nr`` lanes added pairwise (halves, quarters, ...);
    4. the last ``n % nr`` elements one by one.

    Plain ``fadd`` (no fast-math flags): LLVM may not reorder it.  ``nr`` must be a
    compile-time power of two, ``n >= 0``."""
    width = _literal(nr, types.IntegerLiteral)
    if (not isinstance(a, types.Array) or a.ndim != 1 or a.layout != "C"
            or a.dtype not in (types.float32, types.float64)
            or width is None or width & (width - 1)):
        return None
    if not all(isinstance(x, types.Integer) for x in (a0, n)):
        return None
    return a.dtype(a, a0, n, nr), functools.partial(_ordered_sum_codegen, width)


def _ordered_sum_codegen(nr, context, builder, signature, args):
    """LLVM IR of :func:`ordered_sum`."""
    i64 = ir.IntType(64)
    elem = context.get_value_type(signature.args[0].dtype)
    align = context.get_abi_sizeof(elem)
    a0_, n_ = _int64_args(context, builder, signature, args, (1, 2))
    pa = _pointer(context, builder, signature.args[0], args[0], a0_)

    def add_vectors(acc, lanes, first, count):
        """``acc += a[first + i·lanes : + lanes]`` for ``i < count``, in order."""
        vec = ir.VectorType(elem, lanes)
        with cgutils.for_range(builder, count) as loop:
            t = builder.add(first, builder.mul(loop.index, ir.Constant(i64, lanes)))
            av = builder.load(builder.bitcast(builder.gep(pa, [t]), vec.as_pointer()),
                              align=align)
            builder.store(builder.fadd(builder.load(acc), av), acc)

    wide = 4 * nr
    acc_wide = _accumulators(builder, ir.VectorType(elem, wide), 1)[0]
    n_wide = builder.udiv(n_, ir.Constant(i64, wide))
    add_vectors(acc_wide, wide, ir.Constant(i64, 0), n_wide)
    acc = cgutils.alloca_once_value(
        builder, _lanes_folded(builder, builder.load(acc_wide), wide, nr))
    done = builder.mul(n_wide, ir.Constant(i64, wide))
    n_vectors = builder.udiv(builder.sub(n_, done), ir.Constant(i64, nr))
    add_vectors(acc, nr, done, n_vectors)
    done = builder.add(done, builder.mul(n_vectors, ir.Constant(i64, nr)))
    total = cgutils.alloca_once_value(builder, _lanes_added(builder, builder.load(acc), nr))
    with cgutils.for_range(builder, builder.sub(n_, done)) as loop:
        x = builder.load(builder.gep(pa, [builder.add(done, loop.index)]))
        builder.store(builder.fadd(builder.load(total), x), total)
    return builder.load(total)
