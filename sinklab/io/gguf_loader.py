"""Loading models from GGUF files, read with :mod:`sinklab.io.gguf_reader` (bounds-checked,
memory-mapped; ~30x faster than the reference `gguf` reader on a 262k-token vocabulary).

The file is memory-mapped and nothing is decoded at load except small tensors: F32 tensors are
read in place (zero copy); quantized and half-width matrices (embedding, LM head, attention and
MLP projections) stay in their file encoding as :class:`QuantizedTensor` views of the map,
decoded block by block inside the C core's products; norms, biases and position tables are
decoded to float32. The family module (:mod:`sinklab.families`) chosen by
``general.architecture`` reads the metadata and names the tensors. llama.cpp stores the Q and
K rows of *llama*-architecture files permuted for RoPE on adjacent pairs, so those run RoPE in
that layout (``rope_layout`` 1); q·k, and hence every attention probability, equals the Hugging
Face result with its half-split layout.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .. import families, runtime
from ..families.config import ModelConfig
from ..families.tensors import TYPE_NAMES, QuantizedTensor, Tensor, to_f32
from .gguf_reader import GGUFFile, GGUFFormatError, GGUFTensor

SUPPORTED_ARCHS = families.SUPPORTED_GGUF_ARCHS
SUPPORTED_TYPES = TYPE_NAMES  # ggml type ids the C core decodes (see csrc/quant.h)


class GGUFError(ValueError):
    """A GGUF file that is truncated, corrupted, or describes something sinklab cannot run."""


class UnsupportedGGUFArchitecture(GGUFError, families.UnsupportedArchitecture):
    """A GGUF file whose ``general.architecture`` no family reads."""


def _type_name(type_id: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(type_id).name
    except (ImportError, ValueError):
        return f"type {type_id}"


def open_gguf(path: str) -> GGUFFile:
    """Opens ``path`` (metadata parsed, tensor data memory-mapped), turning parse failures into GGUFError."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such GGUF file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        return GGUFFile(path)
    except GGUFFormatError as e:
        raise GGUFError(f"corrupted or truncated GGUF: {e}") from None


def _field(reader: GGUFFile, key: str, default: Any = KeyError) -> Any:
    """A metadata value: numbers and strings as such, arrays as lists."""
    if key not in reader.fields:
        if default is KeyError:
            raise GGUFError(f"GGUF metadata key {key!r} is missing")
        return default
    value = reader.fields[key]
    return value.tolist() if isinstance(value, np.ndarray) else value


class GGUFMeta:
    """A GGUF file's metadata as the family modules read it: ``arch``, ``tensor_names``,
    ``tensor_shape(name)`` (numpy order, None when absent) and ``get(key, default)``."""

    def __init__(self, reader) -> None:
        self.reader = reader
        self.arch = str(_field(reader, "general.architecture"))
        self._shapes = {t.name: t.shape for t in reader.tensors}
        self.tensor_names = frozenset(self._shapes)

    def get(self, key: str, default: Any = KeyError) -> Any:
        return _field(self.reader, key, default)

    def tensor_shape(self, name: str) -> Optional[Tuple[int, ...]]:
        return self._shapes.get(name)


def family_of(reader):
    """The family module for a GGUF file's ``general.architecture`` (GGUFError naming an
    unsupported one and the supported list)."""
    try:
        return families.for_gguf_arch(_field(reader, "general.architecture"))
    except families.UnsupportedArchitecture as e:
        raise UnsupportedGGUFArchitecture(str(e)) from None


def read_config(reader) -> ModelConfig:
    """The ModelConfig stated by a GGUF file's metadata (read by its family module)."""
    fam = family_of(reader)
    n = reader.fields.get(f"{_field(reader, 'general.architecture')}.block_count")
    # families build per-layer tuples (windows) from it before ModelConfig checks anything
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 2 * int(n) > len(reader.tensors):
        raise GGUFError(f"the metadata states {int(n)} layers, but the file holds only {len(reader.tensors)} "
                        "tensors (each layer has an attention and an MLP matrix at least)")
    try:
        return fam.config_from_gguf(GGUFMeta(reader))
    except GGUFError:
        raise
    except (ValueError, TypeError) as e:
        raise GGUFError(f"{e}") from None


class GGUFSource:
    """The tensors of a GGUF file as family modules fetch them (``fmt``, ``names``,
    ``shape(name)``, ``get(name, shape)``)."""

    fmt = "gguf"

    def __init__(self, reader) -> None:
        self.by_name = {t.name: t for t in reader.tensors}
        self.names = frozenset(self.by_name)

    def shape(self, name: str) -> Tuple[int, ...]:
        return self.by_name[name].shape

    def get(self, name: str, shape: Tuple[int, ...]) -> Tensor:
        if name not in self.by_name:
            raise GGUFError(f"GGUF file lacks tensor {name!r}")
        return read_tensor(self.by_name[name], shape)


def read_tensor(t: GGUFTensor, expected_shape: Tuple[int, ...]) -> Tensor:
    """A GGUF tensor of ``expected_shape`` (numpy order), checked against the file: F32 as a
    read-only float32 view of the memory map, other matrices as a :class:`QuantizedTensor`
    over their bytes, other vectors decoded to float32."""
    type_id = t.type
    if type_id not in SUPPORTED_TYPES:
        raise GGUFError(f"tensor {t.name}: unsupported tensor type {_type_name(type_id)} ({type_id}); "
                        f"supported: {', '.join(SUPPORTED_TYPES.values())}")
    shape = t.shape
    if shape != tuple(expected_shape):
        raise GGUFError(f"tensor {t.name} has shape {shape}, expected {tuple(expected_shape)}")
    n = int(np.prod(shape))
    raw = t.data
    block_elems, block_bytes = runtime.quant_block_size(type_id)
    if n % block_elems or shape[-1] % block_elems:
        raise GGUFError(f"tensor {t.name}: rows of {shape[-1]} values are not whole {SUPPORTED_TYPES[type_id]} blocks")
    if raw.nbytes != n // block_elems * block_bytes:
        raise GGUFError(f"tensor {t.name}: data holds {raw.nbytes} bytes, expected "
                        f"{n // block_elems * block_bytes} (file truncated or corrupted)")
    if type_id == 0:
        return raw.view(np.float32).reshape(shape)
    data = raw
    if len(shape) == 2:
        return QuantizedTensor(type_id, data, shape)
    return runtime.dequantize(type_id, data, n).reshape(shape)


def tensor_to_f32(t, expected_shape: Tuple[int, ...]) -> np.ndarray:
    """A GGUF tensor as a C-contiguous float32 array of ``expected_shape`` (numpy order):
    F32 data is a read-only view of the memory map, other types are decoded in C."""
    return to_f32(read_tensor(t, expected_shape))


def load_gguf_weights(reader, cfg: ModelConfig) -> Dict[str, Tensor]:
    """The canonical tensors (``tok_embd``, ``blk.N.attn_q`` …; :mod:`sinklab.families.base`),
    numpy order (out, in): float32 arrays, matrices possibly :class:`QuantizedTensor`."""
    fam = families.family_of(cfg.family)
    src = GGUFSource(reader)
    if 2 * cfg.n_layers > len(src.names):  # before every layer's names are listed (2^31 layers: hours)
        raise GGUFError(f"the metadata states {cfg.n_layers} layers, but the file holds only {len(src.names)} "
                        "tensors (each layer has an attention and an MLP matrix at least)")
    try:
        return fam.weights(cfg, src)
    except GGUFError:
        raise
    except ValueError as e:
        raise GGUFError(str(e)) from None


def rope_layout(cfg: ModelConfig) -> int:
    """0: half-split RoPE pairs; 1: adjacent pairs (llama.cpp's permuted llama-architecture Q/K)."""
    return families.family_of(cfg.family).rope_layout("gguf")


def llama3_rope_factors(reader, cfg: ModelConfig):
    """llama.cpp stores llama3 frequency scaling as a tensor of divisors, ``rope_freqs.weight``."""
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            return tensor_to_f32(t, (cfg.head_dim // 2,)).astype(np.float64)
    return None
