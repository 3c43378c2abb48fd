"""The C side of the simulated library: reading ctypes arguments, writing results, handles.

``pynvml`` calls each symbol the way it would call ``libnvidia-ml.so``: scalars as ints or
``c_uint``\\ s, out-parameters as ``byref(x)``, buffers and arrays as ctypes arrays, handles
as ``POINTER(opaque struct)``. These helpers accept all of those and write through them,
independent of the concrete ctypes types (so the simulator needs none of pynvml's).
"""

from __future__ import annotations

import bisect
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
    """Stable handles: each is the address of an 8-byte cell that holds what it stands for.

    Cells are handed out in order from blocks the table keeps for the life of the process,
    so an address is never reused for another object, and a stale handle still maps to its
    own (now missing) object rather than to a newcomer. A cell is 8 bytes, not an object:
    a node that creates and destroys MIG devices all day stays flat, once ``forget`` has
    dropped the handles of what it destroyed from the lookup by key.
    """

    BLOCK_CELLS = 4096
    """Cells per block (32 KiB): a block lasts ~1,300 MIG device create/destroy cycles."""
    _KIND_BITS, _INDEX_BITS, _SERIAL_BITS = 4, 12, 48

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []  # block addresses, sorted
        self._blocks: dict[int, ctypes.Array[ctypes.c_uint64]] = {}  # by address
        self._newest: ctypes.Array[ctypes.c_uint64] | None = None
        self._used = 0  # cells handed out in the newest block
        self._addresses: dict[HandleKey, int] = {}
        self._kinds: list[str] = []  # a cell's kind is its index here, plus one

    def __len__(self) -> int:
        """Handles of objects not known to be gone."""
        return len(self._addresses)

    @property
    def cells(self) -> int:
        """Cells handed out so far (8 bytes each, kept for the life of the process)."""
        return (len(self._starts) - 1) * self.BLOCK_CELLS + self._used if self._starts else 0

    def address(self, key: HandleKey) -> int:
        addr = self._addresses.get(key)
        if addr is None:
            with self._lock:
                addr = self._addresses.get(key)
                if addr is None:
                    addr = self._addresses[key] = self._new_cell(key)
        return addr

    def forget(self, key: HandleKey) -> None:
        """The object is gone: its handle stays valid to :meth:`key` (a stale handle is
        still told apart), but :meth:`address` no longer has to find it."""
        with self._lock:
            self._addresses.pop(key, None)

    def key(self, handle: object) -> HandleKey | None:
        addr = address(handle)
        if addr is None:
            return None
        at = bisect.bisect_right(self._starts, addr) - 1
        if at < 0:
            return None
        start = self._starts[at]
        offset = addr - start
        if offset >= self.BLOCK_CELLS * 8 or offset % 8:
            return None
        return self._decode(self._blocks[start][offset // 8])

    def _new_cell(self, key: HandleKey) -> int:
        if self._newest is None or self._used == self.BLOCK_CELLS:
            block = (ctypes.c_uint64 * self.BLOCK_CELLS)()
            start = ctypes.addressof(block)
            self._blocks[start] = block  # before the start: readers look it up by start
            bisect.insort(self._starts, start)
            self._newest, self._used = block, 0
        cell = self._used
        self._newest[cell] = self._encode(key)
        self._used += 1
        return ctypes.addressof(self._newest) + cell * 8

    def _encode(self, key: HandleKey) -> int:
        kind, index, serial = key
        if kind not in self._kinds:
            self._kinds.append(kind)
        code = self._kinds.index(kind) + 1
        if not (code < 1 << self._KIND_BITS and 0 <= index < 1 << self._INDEX_BITS
                and 0 <= serial < 1 << self._SERIAL_BITS):
            raise ValueError(f"handle key out of range: {key}")
        return (code << (self._INDEX_BITS + self._SERIAL_BITS)
                | index << self._SERIAL_BITS | serial)

    def _decode(self, cell: int) -> HandleKey | None:
        code = cell >> (self._INDEX_BITS + self._SERIAL_BITS)
        if not 0 < code <= len(self._kinds):
            return None  # a cell not handed out yet
        index = (cell >> self._SERIAL_BITS) & ((1 << self._INDEX_BITS) - 1)
        return self._kinds[code - 1], index, cell & ((1 << self._SERIAL_BITS) - 1)
