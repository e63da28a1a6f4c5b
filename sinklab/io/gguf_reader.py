"""A fast, bounds-checked reader of GGUF headers: metadata and tensor table, data memory-mapped.

The reference reader (`gguf.GGUFReader`) builds a NumPy view per array element, which takes
~25 s for Gemma 3's 262k-entry vocabulary; this one walks the same layout with ``struct`` on
the memory map itself (nothing but the values is copied) and takes about a second. It reads
only: every length and offset is checked against the file before use, so a truncated or hostile
file raises :class:`GGUFFormatError`, never an IndexError or a huge allocation. Layout (GGUF v2/v3,
little-endian, or big-endian throughout): magic ``GGUF``, version u32, n_tensors u64, n_kv u64, then n_kv (key, type, value)
entries, then n_tensors (name, n_dims u32, dims u64 x n_dims, ggml type u32, offset u64) entries,
then the data section at the next multiple of ``general.alignment`` (default 32).
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np

# GGUF value types
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)
_SCALAR = {_U8: "<B", _I8: "<b", _U16: "<H", _I16: "<h", _U32: "<I", _I32: "<i", _F32: "<f",
           _BOOL: "<?", _U64: "<Q", _I64: "<q", _F64: "<d"}
_NUMPY = {_U8: "<u1", _I8: "<i1", _U16: "<u2", _I16: "<i2", _U32: "<u4", _I32: "<i4", _F32: "<f4",
          _BOOL: "<u1", _U64: "<u8", _I64: "<i8", _F64: "<f8"}
_MAX_DIMS = 8


class GGUFFormatError(ValueError):
    """The file is not a well-formed GGUF file (truncated, corrupted, or inconsistent)."""


@dataclass(frozen=True)
class GGUFTensor:
    """One entry of the tensor table: ``shape`` in NumPy order (slowest axis first), ``data``
    the tensor's raw bytes (a read-only uint8 view of the memory map)."""

    name: str
    type: int
    shape: Tuple[int, ...]
    offset: int
    data: np.ndarray

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


def _type_sizes() -> Dict[int, Tuple[int, int]]:
    """(elements, bytes) per block of every ggml type the reference package knows."""
    from gguf.constants import GGML_QUANT_SIZES

    return {int(t): (int(e), int(b)) for t, (e, b) in GGML_QUANT_SIZES.items()}


class _Cursor:
    def __init__(self, buf: Any, path: str) -> None:
        self.buf, self.pos, self.path, self.order = buf, 0, path, "<"

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFFormatError(f"{self.path}: truncated GGUF header while reading {what} "
                                  f"(needs {n} bytes at offset {self.pos}, the file has {len(self.buf)})")

    def scalar(self, fmt: str, what: str) -> Any:
        fmt = self.order + fmt[1:]
        size = struct.calcsize(fmt)
        self.need(size, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALAR:
            return self.scalar(_SCALAR[vtype], what)
        if vtype == _STR:
            return self.string(what)
        if vtype != _ARR:
            raise GGUFFormatError(f"{self.path}: {what} has unknown value type {vtype}")
        if depth > 2:
            raise GGUFFormatError(f"{self.path}: {what} nests arrays too deeply")
        etype, n = self.scalar("<I", what), self.scalar("<Q", what)
        if etype in _NUMPY:
            dtype = np.dtype(self.order + _NUMPY[etype][1:])
            if n > len(self.buf):
                raise GGUFFormatError(f"{self.path}: {what} claims {n} elements, more than the file holds")
            self.need(n * dtype.itemsize, what)
            arr = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos).astype(dtype.newbyteorder("="))
            self.pos += n * dtype.itemsize
            return arr.astype(bool) if etype == _BOOL else arr
        if etype == _STR:
            out: List[str] = []
            for _ in range(n):  # each string is at least its 8-byte length: bounded by the file
                out.append(self.string(what))
            return out
        if etype == _ARR:
            return [self.value(_ARR, what, depth + 1) for _ in range(n)]
        raise GGUFFormatError(f"{self.path}: {what} is an array of unknown type {etype}")


class GGUFFile:
    """A GGUF file's metadata (``fields``: key -> Python value; arrays as NumPy arrays or lists of
    str) and tensor table (``tensors``, in file order), with tensor data memory-mapped.

    Raises:
        GGUFFormatError: (a ValueError) the file is not a well-formed GGUF: bad magic or version,
            truncated, a count, length, shape, type or offset inconsistent with the file. No
            length read from the file is allocated before it is checked against the file's size;
            this is the only exception a hostile file raises (checked by benchmarks/fuzz_parsers.py).
        OSError: the file cannot be opened or mapped.
    """

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        if size < 24:
            raise GGUFFormatError(f"{self.path}: {size} bytes is too short for a GGUF header")
        with open(self.path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(self._mm, self.path)  # parsed in place: only what is read gets paged in
        if cur.scalar("<4s", "magic") != b"GGUF":
            raise GGUFFormatError(f"{self.path} is not a GGUF file (bad magic)")
        self.version = cur.scalar("<I", "version")
        if self.version not in (2, 3) and struct.unpack("<I", struct.pack(">I", self.version))[0] in (2, 3):
            cur.order = ">"  # a big-endian file (ggml's byte-order flag): numbers, not tensor data, swapped
            self.version = struct.unpack("<I", struct.pack(">I", self.version))[0]
        self.byte_order = cur.order
        if self.version not in (2, 3):
            raise GGUFFormatError(f"{self.path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors, n_kv = cur.scalar("<Q", "tensor count"), cur.scalar("<Q", "metadata count")
        # Each entry takes at least 12 bytes: counts beyond that are lies, not allocations.
        if n_tensors > size // 12 or n_kv > size // 12:
            raise GGUFFormatError(f"{self.path}: {n_tensors} tensors / {n_kv} metadata entries cannot fit in {size} bytes")
        self.fields: Dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            if key in self.fields:  # as llama.cpp and gguf-py: which of the two would be meant?
                raise GGUFFormatError(f"{self.path}: metadata key {key!r} appears twice")
            vtype = cur.scalar("<I", f"type of {key!r}")
            self.fields[key] = cur.value(vtype, f"metadata {key!r}")
        infos = []
        for i in range(n_tensors):
            name = cur.string(f"tensor name #{i}")
            n_dims = cur.scalar("<I", f"dimensions of {name!r}")
            if n_dims > _MAX_DIMS:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} has {n_dims} dimensions")
            dims = [cur.scalar("<Q", f"shape of {name!r}") for _ in range(n_dims)]
            ttype, offset = cur.scalar("<I", f"type of {name!r}"), cur.scalar("<Q", f"offset of {name!r}")
            infos.append((name, ttype, tuple(reversed(dims)), offset))
        align = self.fields.get("general.alignment", 32)
        if not isinstance(align, (int, np.integer)) or not 0 < int(align) <= 1 << 20:
            raise GGUFFormatError(f"{self.path}: general.alignment={align!r} is invalid")
        align = int(align)
        start = (cur.pos + align - 1) // align * align
        self.data_offset = start
        sizes = _type_sizes()
        self.tensors: List[GGUFTensor] = []
        names = set()
        for name, ttype, shape, offset in infos:
            if name in names:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} appears twice")
            names.add(name)
            if ttype not in sizes:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} has unknown ggml type {ttype}")
            elems, block = sizes[ttype]
            n = 1
            for s in shape:
                if s <= 0 or s > size * elems:
                    raise GGUFFormatError(f"{self.path}: tensor {name!r} has an invalid shape {shape}")
                n *= s
            if n % elems or (shape and shape[-1] % elems):
                raise GGUFFormatError(f"{self.path}: tensor {name!r} of shape {shape} is not a whole number of blocks")
            nbytes = n // elems * block
            lo = start + offset
            if offset % align or lo + nbytes > size:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} ({nbytes} bytes at data offset {offset}) "
                                      f"lies past the end of the file ({size} bytes) or is misaligned")
            data = np.frombuffer(self._mm, dtype=np.uint8, count=nbytes, offset=lo)
            self.tensors.append(GGUFTensor(name, ttype, shape, offset, data))

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)
