"""The C side of the simulated library: reading ctypes arguments, writing results, handles.

``pynvml`` calls each symbol the way it would call ``libnvidia-ml.so``: scalars as ints or
``c_uint``\\ s, out-parameters as ``byref(x)``, buffers and arrays as ctypes arrays, handles
as ``POINTER(opaque struct)``. These helpers accept all of those and write through them,
independent of the concrete ctypes types (so the simulator needs none of pynvml's).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .codes import NvmlFailure, Return

_POINTER_SIZE = ctypes.sizeof(ctypes.c_void_p)

HandleKey = tuple[str, int, int]
"""(kind, GPU index, serial): what a handle stands for, e.g. ``("gi", 0, 17)``."""


def invalid() -> NvmlFailure:
    return NvmlFailure(Return.ERROR_INVALID_ARGUMENT)


def address(handle: object) -> int | None:
    """The address a handle (``POINTER(struct)``, ``c_void_p`` or int) points at."""
    if handle is None:
        return None
    if isinstance(handle, int):
        return handle or None
    try:
        value: int | None = ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None
    return value


def target(ref: object) -> Any:
    """The ctypes object an out-parameter refers to; INVALID_ARGUMENT for NULL."""
    if ref is None:
        raise invalid()
    obj = getattr(ref, "_obj", None)  # byref(x)
    if obj is not None:
        return obj
    if isinstance(ref, ctypes._Pointer):
        if not ref:
            raise invalid()
        return ref.contents
    if isinstance(ref, ctypes.Structure | ctypes.Array | ctypes._SimpleCData):
        return ref  # arrays (and structs passed where C wants a pointer) are their own target
    raise invalid()


def as_int(arg: object) -> int:
    """A scalar argument passed as ``int`` or a ctypes integer."""
    if isinstance(arg, int):
        return arg
    if isinstance(arg, ctypes._SimpleCData):
        value = arg.value
        if isinstance(value, int):
            return value
    raise invalid()


def as_text(arg: object) -> str:
    """A ``const char *`` argument (``c_char_p``, bytes or str)."""
    if isinstance(arg, ctypes.c_char_p):
        arg = arg.value
    if isinstance(arg, bytes):
        return arg.decode(errors="replace")
    if isinstance(arg, str):
        return arg
    raise invalid()


def put(ref: object, value: int) -> None:
    """``*ref = value`` for an integer out-parameter."""
    target(ref).value = value


def put_text(buffer: object, length: object, text: str) -> None:
    """Copy ``text`` NUL-terminated into a ``char[length]`` buffer (INSUFFICIENT_SIZE if short)."""
    buf = target(buffer)
    data = text.encode()
    if len(data) + 1 > as_int(length):
        raise NvmlFailure(Return.ERROR_INSUFFICIENT_SIZE)
    buf.value = data


def put_handle(ref: object, addr: int) -> None:
    """``*ref = handle`` for a handle out-parameter of any pointer type."""
    ctypes.c_void_p.from_buffer(target(ref)).value = addr


def elements(array: object) -> Any:
    """A caller's array (ctypes array, ``byref`` of one, or a non-NULL typed pointer)."""
    obj = getattr(array, "_obj", array)
    if isinstance(obj, ctypes.Array) or (isinstance(obj, ctypes._Pointer) and obj):
        return obj
    raise invalid()


def put_handle_at(array: object, index: int, addr: int) -> None:
    """``array[index] = handle`` for a caller's array of handles (of any pointer type)."""
    obj = elements(array)
    base = address(obj) if isinstance(obj, ctypes._Pointer) else ctypes.addressof(obj)
    if base is None:
        raise invalid()
    ctypes.c_void_p.from_address(base + index * _POINTER_SIZE).value = addr


def put_pointer_field(struct: Any, name: str, addr: int) -> None:
    """Set a handle-typed field of a result struct (``info.device`` …)."""
    offset = getattr(type(struct), name).offset
    ctypes.c_void_p.from_buffer(struct, offset).value = addr


def capacity(array: object) -> int | None:
    """How many elements a caller's array holds; ``None`` when it is a bare pointer."""
    obj = elements(array)
    return len(obj) if isinstance(obj, ctypes.Array) else None


def struct_version(struct: Any) -> int:
    """The major version a versioned struct announces in its ``version`` field."""
    return int(struct.version) >> 24


class HandleTable:
    """Stable handles: each is the address of a small buffer the table keeps alive.

    Buffers are never freed, so an address is never reused for another object and a stale
    handle still maps to its own (now missing) object rather than to a newcomer.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[HandleKey, ctypes.Array[ctypes.c_char]] = {}
        self._keys: dict[int, HandleKey] = {}

    def address(self, key: HandleKey) -> int:
        buf = self._buffers.get(key)
        if buf is None:
            with self._lock:
                buf = self._buffers.get(key)
                if buf is None:
                    buf = ctypes.create_string_buffer(_POINTER_SIZE)
                    self._buffers[key] = buf
                    self._keys[ctypes.addressof(buf)] = key
        return ctypes.addressof(buf)

    def key(self, handle: object) -> HandleKey | None:
        addr = address(handle)
        return None if addr is None else self._keys.get(addr)
