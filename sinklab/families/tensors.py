"""Weights kept in their file's encoding: :class:`QuantizedTensor`, a matrix of GGUF blocks
(Q4_0 … Q6_K) or half-width floats (F16, BF16) that stays memory-mapped and is decoded block by
block inside the C core's matrix products, and :func:`to_f32` for the code that needs floats."""
from __future__ import annotations

from typing import Any, Tuple, Union

import numpy as np

from .. import runtime

# ggml type ids the C core decodes (see csrc/quant.h)
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}
F32, F16, BF16 = 0, 1, 30


def block_size(type_id: int) -> Tuple[int, int]:
    """(elements, bytes) of one block of ggml type ``type_id``."""
    return runtime.quant_block_size(type_id)


class QuantizedTensor:
    """A (rows, cols) matrix in ggml type ``type``, its bytes ``data`` (1-D C-contiguous uint8,
    usually a view into the memory-mapped file), numpy shape ``shape`` (out, in).

    Rows are whole numbers of blocks, so :meth:`rows` slices without decoding. ``np.asarray(t)``
    and :meth:`dequantize` give the float32 matrix (a new array each call: ``rows*cols*4`` bytes).
    """

    __slots__ = ("type", "data", "shape")

    def __init__(self, type: int, data: np.ndarray, shape: Tuple[int, ...]) -> None:
        type, shape = int(type), tuple(int(s) for s in shape)
        if type not in TYPE_NAMES or type == F32:
            raise ValueError(f"ggml type {type} is not a quantized or half-width type the core decodes "
                             f"(supported: {', '.join(v for k, v in TYPE_NAMES.items() if k != F32)})")
        if len(shape) != 2:
            raise ValueError(f"a quantized tensor is a matrix, got shape {shape}")
        data = np.asarray(data)
        if data.dtype != np.uint8 or data.ndim != 1 or not data.flags.c_contiguous:
            raise ValueError(f"quantized data must be 1-D C-contiguous uint8, got {data.dtype} {data.shape}")
        elems, nbytes = block_size(type)
        if shape[1] % elems:
            raise ValueError(f"{TYPE_NAMES[type]} rows of {shape[1]} values are not whole {elems}-value blocks")
        if data.nbytes != shape[0] * (shape[1] // elems) * nbytes:
            raise ValueError(f"{TYPE_NAMES[type]} matrix {shape} needs {shape[0] * (shape[1] // elems) * nbytes} "
                             f"bytes, data holds {data.nbytes}")
        self.type, self.data, self.shape = type, data, shape

    @property
    def type_name(self) -> str:
        return TYPE_NAMES[self.type]

    @property
    def ndim(self) -> int:
        return 2

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    @property
    def row_bytes(self) -> int:
        elems, nbytes = block_size(self.type)
        return self.shape[1] // elems * nbytes

    def rows(self, lo: int, hi: int) -> "QuantizedTensor":
        """Rows lo..hi-1, sharing this tensor's bytes (fused QKV matrices are split this way)."""
        if not 0 <= lo <= hi <= self.shape[0]:
            raise ValueError(f"rows {lo}..{hi} outside a matrix of {self.shape[0]} rows")
        rb = self.row_bytes
        return QuantizedTensor(self.type, self.data[lo * rb:hi * rb], (hi - lo, self.shape[1]))

    def dequantize(self) -> np.ndarray:
        """The float32 matrix of ``shape``, decoded by the C core's own block decoder (the one
        its matrix products use)."""
        n = self.shape[0] * self.shape[1]
        return runtime.dequantize(self.type, self.data, n).reshape(self.shape)

    def core(self) -> Tuple[int, np.ndarray]:
        """The ``(ggml_type, raw bytes)`` tuple the C core takes."""
        return (self.type, self.data)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.dequantize()
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.type_name}, shape={self.shape}, {self.nbytes} bytes)"


Tensor = Union[np.ndarray, QuantizedTensor]


def to_f32(t: Tensor) -> np.ndarray:
    """``t`` as a C-contiguous float32 array: F32 arrays unchanged (no copy), others decoded."""
    if isinstance(t, QuantizedTensor):
        return t.dequantize()
    if t.dtype == np.float32 and t.flags.c_contiguous:
        return t
    return np.ascontiguousarray(t, dtype=np.float32)


def split_rows(t: Tensor, sizes: Tuple[int, ...]) -> Tuple[Tensor, ...]:
    """A fused matrix (or bias vector) cut into consecutive row blocks of ``sizes``
    (GPT-2's and BERT's fused QKV); quantized matrices are cut without decoding."""
    if sum(sizes) != t.shape[0]:
        raise ValueError(f"cannot split {t.shape[0]} rows into {sizes}")
    out, lo = [], 0
    for n in sizes:
        out.append(t.rows(lo, lo + n) if isinstance(t, QuantizedTensor) else np.ascontiguousarray(t[lo:lo + n]))
        lo += n
    return tuple(out)
