"""Loading models from Hugging Face folders: config.json + *.safetensors.

The family module (:mod:`sinklab.families`) chosen by config.json's ``model_type`` reads the
config and names the tensors. F32 tensors are used in place (zero copy); F16 and BF16 matrices
stay half-width as :class:`QuantizedTensor` views of the file (decoded inside the C core's
products); other F16/BF16 tensors are widened to float32.

Safetensors files are memory-mapped and read through their JSON header directly: the format is
an 8-byte header length, a JSON table of {name: dtype, shape, data_offsets}, then raw data. The
`safetensors` package's numpy backend has no bfloat16 and always copies; reading the table
ourselves keeps fp32 weights zero-copy. Every offset and size is checked against the file.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Dict, Iterable, Tuple

import numpy as np

from .. import families
from ..families.config import ModelConfig
from ..families.tensors import BF16, F16, QuantizedTensor, Tensor

SUPPORTED_MODEL_TYPES = families.SUPPORTED_HF_TYPES
_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2)}
# Other safetensors dtypes: listed (and bounds-checked) so that buffers such as BERT's int64
# position_ids do not make a file unreadable; fetching one as a weight is an error.
_OTHER_ITEMSIZE = {"F64": 8, "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1,
                   "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    """A safetensors file that is truncated, corrupted, or holds a dtype sinklab does not read."""


def read_safetensors(path: str) -> Dict[str, Tuple[str, Tuple[int, ...], np.ndarray]]:
    """Maps a .safetensors file: {name: (dtype, shape, raw 1-D array view into the file)}."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path}: file too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, _MAX_HEADER):
            raise SafetensorsError(f"{path}: header length {n} exceeds the file size {size}")
        try:
            table = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(table, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start, shape=(data_len,)) if data_len else np.zeros(0, np.uint8)
    out = {}
    for name, info in table.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = info["dtype"], tuple(int(s) for s in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: malformed header entry for {name!r}") from None
        if dtype not in _DTYPES and dtype not in _OTHER_ITEMSIZE:
            raise SafetensorsError(f"{path}: tensor {name} has unknown dtype {dtype!r}")
        itemsize = _DTYPES[dtype][1] if dtype in _DTYPES else _OTHER_ITEMSIZE[dtype]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if any(s < 0 for s in shape) or not (0 <= lo <= hi <= data_len) or hi - lo != count * itemsize:
            raise SafetensorsError(f"{path}: tensor {name} (shape {shape}, {dtype}) has offsets {lo}..{hi} "
                                   f"inconsistent with its size or past the end of the file ({data_len} data bytes)")
        out[name] = (dtype, shape, mm[lo:hi])
    return out


def to_f32(dtype: str, shape: Tuple[int, ...], raw: np.ndarray) -> np.ndarray:
    """Raw safetensors bytes as float32 of ``shape``: a zero-copy view for aligned F32."""
    np_type, itemsize = _DTYPES[dtype]
    if dtype == "F32" and raw.ctypes.data % 4 == 0:
        return raw.view(np.float32).reshape(shape)
    arr = np.frombuffer(raw, dtype=np_type) if raw.ctypes.data % itemsize else raw.view(np_type)
    if dtype == "BF16":  # bfloat16 is the top half of a float32
        return (arr.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return arr.astype(np.float32).reshape(shape)


def _files(folder: str) -> Iterable[str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        missing = [x for x in files if not os.path.isfile(os.path.join(folder, x))]
        if missing:
            raise FileNotFoundError(f"{folder}: shards named in model.safetensors.index.json are missing: {missing}")
        return [os.path.join(folder, x) for x in files]
    files = sorted(x for x in os.listdir(folder) if x.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    return [os.path.join(folder, x) for x in files]


def read_config(folder: str) -> ModelConfig:
    """The ModelConfig of a Hugging Face folder's config.json (read by its family module)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder} has no config.json")
    with open(path) as f:
        c = json.load(f)
    if not isinstance(c, dict):
        raise ValueError(f"{path} is not a JSON object")
    fam = families.for_hf_type(c.get("model_type"), path)
    return fam.config_from_hf(c, path)


class HFSource:
    """The tensors of a folder's safetensors files as family modules fetch them (``fmt``,
    ``names``, ``shape(name)``, ``get(name, shape)``)."""

    fmt = "hf"

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.table: Dict[str, Tuple[str, Tuple[int, ...], np.ndarray]] = {}
        for path in _files(folder):
            self.table.update(read_safetensors(path))
        self.names = frozenset(self.table)

    def shape(self, name: str) -> Tuple[int, ...]:
        return self.table[name][1]

    def get(self, name: str, shape: Tuple[int, ...]) -> Tensor:
        """Tensor ``name`` of ``shape``: float32 (a view for aligned F32), or a QuantizedTensor
        for F16/BF16 matrices. KeyError when missing, ValueError for another shape."""
        if name not in self.table:
            raise KeyError(f"{self.folder}: missing tensor {name!r}")
        dtype, got, raw = self.table[name]
        if dtype not in _DTYPES:
            raise SafetensorsError(f"{self.folder}: tensor {name} has unsupported dtype {dtype} (supported: F32, F16, BF16)")
        if got != tuple(shape):
            raise ValueError(f"{self.folder}: tensor {name} has shape {got}, expected {tuple(shape)}")
        if dtype in ("F16", "BF16") and len(got) == 2:
            return QuantizedTensor(F16 if dtype == "F16" else BF16, raw, got)
        return to_f32(dtype, got, raw)


def load_hf_weights(folder: str, cfg: ModelConfig) -> Dict[str, Tensor]:
    """The canonical tensors (:mod:`sinklab.families.base`), numpy order (out, in): float32
    (fp32 files are not copied), F16/BF16 matrices as QuantizedTensor."""
    return families.family_of(cfg.family).weights(cfg, HFSource(folder))


def rope_layout(cfg: ModelConfig) -> int:
    """Hugging Face files keep the half-split RoPE layout (0)."""
    return families.family_of(cfg.family).rope_layout("hf")
