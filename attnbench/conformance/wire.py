"""The messages between the judge and the process of the code under test: plain data only.

A message is JSON (dicts, lists, strings, numbers, booleans, None) whose NumPy arrays
travel beside it in NumPy's ``.npy`` format, read back with ``allow_pickle=False``: a
number array crosses as its dtype, shape and bytes, nothing else.  An array subclass, a
lazy array, a tensor or an object array cannot cross, so no code of the sender runs in
the receiver when it reads, compares or prints what it received.

A frame is an 8-byte length and the message's bytes: one ``header`` JSON line, then the
arrays it refers to (``{"__array__": i}``), each an ``.npy`` record.
"""

from __future__ import annotations

import io
import json
import os
import struct

import numpy as np

__all__ = ["Closed", "decode", "encode", "plain_array", "receive", "send", "send_encoded"]

_LENGTH = struct.Struct("<Q")


class Closed(EOFError):
    """The other end closed its side of the pipe (it exited or was killed)."""


def plain_array(value) -> np.ndarray:
    """``value`` as a base-class NumPy array of numbers or booleans (a view where it is
    one already: a subclass's own methods are left behind).

    Raises
    ------
    TypeError
        If ``value`` is not a numeric (or bool) array once converted.
    """
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"the output could not be read as an array of numbers "
                        f"(dtype {array.dtype}, from {type(value).__name__})")
    return array


def _flatten(value, arrays: list):
    if isinstance(value, np.ndarray):
        arrays.append(value)
        return {"__array__": len(arrays) - 1}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(key): _flatten(item, arrays) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return {"__tuple__": [_flatten(item, arrays) for item in value]} \
            if isinstance(value, tuple) else [_flatten(item, arrays) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{type(value).__name__} cannot cross between the judge and the worker")


def _restore(value, arrays: list):
    if isinstance(value, dict):
        if set(value) == {"__array__"}:
            return arrays[value["__array__"]]
        if set(value) == {"__tuple__"}:
            return tuple(_restore(item, arrays) for item in value["__tuple__"])
        return {key: _restore(item, arrays) for key, item in value.items()}
    if isinstance(value, list):
        return [_restore(item, arrays) for item in value]
    return value


def encode(message) -> bytes:
    """The bytes of ``message`` (plain data and base-class numeric NumPy arrays)."""
    arrays: list = []
    header = json.dumps(_flatten(message, arrays), allow_nan=True).encode()
    buffer = io.BytesIO()
    buffer.write(header + b"\n")
    for array in arrays:
        np.lib.format.write_array(buffer, plain_array(array), allow_pickle=False)
    return buffer.getvalue()


def decode(data: bytes):
    """The message of :func:`encode`'s bytes; arrays are read without pickle."""
    buffer = io.BytesIO(data)
    header = json.loads(buffer.readline())
    arrays = []
    while buffer.tell() < len(data):
        arrays.append(np.lib.format.read_array(buffer, allow_pickle=False))
    return _restore(header, arrays)


def send(fd: int, message) -> None:
    """Write one framed message to the file descriptor ``fd``."""
    send_encoded(fd, encode(message))


def send_encoded(fd: int, data: bytes) -> None:
    """Write one framed message, the bytes :func:`encode` gave, to ``fd``."""
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exactly(fd: int, size: int, wait) -> bytes:
    chunks, left = [], size
    while left:
        wait(fd)
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise Closed("the other end closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, wait=lambda fd: None):
    """Read one framed message from ``fd``; ``wait(fd)`` is called before each read (the
    judge's deadline: it raises when the time is up)."""
    (size,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size, wait))
    return decode(_read_exactly(fd, size, wait))
