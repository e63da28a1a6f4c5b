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
import math
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
# config.json keys the families read the layer count from, and the most layers a config may
# state (released models have at most a few hundred; 2^40 would make gigabyte-long tuples)
_LAYER_KEYS = ("num_hidden_layers", "n_layer")
MAX_LAYERS = 1 << 16


class SafetensorsError(ValueError):
    """A safetensors file that is truncated, corrupted, or holds a dtype sinklab does not read."""


def _table_entry(path: str, name: str, info: object, data_len: int) -> Tuple[str, Tuple[int, ...], int, int]:
    """(dtype, shape, lo, hi) of one header entry, every field type- and bounds-checked (JSON
    can hold floats, strings, bools, lists or 1e999 anywhere)."""
    if not isinstance(info, dict):
        raise SafetensorsError(f"{path}: malformed header entry for {name!r} (not a JSON object)")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or (dtype not in _DTYPES and dtype not in _OTHER_ITEMSIZE):
        raise SafetensorsError(f"{path}: tensor {name} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise SafetensorsError(f"{path}: tensor {name} has an invalid shape {shape!r} (non-negative integers)")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets):
        raise SafetensorsError(f"{path}: tensor {name} has invalid data_offsets {offsets!r} (two integers)")
    itemsize = _DTYPES[dtype][1] if dtype in _DTYPES else _OTHER_ITEMSIZE[dtype]
    lo, hi = offsets
    # Python integers: a product of huge dims cannot wrap around to match the offsets.
    if not (0 <= lo <= hi <= data_len) or hi - lo != math.prod(shape) * itemsize:
        raise SafetensorsError(f"{path}: tensor {name} (shape {tuple(shape)}, {dtype}) has offsets {lo}..{hi} "
                               f"inconsistent with its size or past the end of the file ({data_len} data bytes)")
    return dtype, tuple(shape), lo, hi


def read_safetensors(path: str) -> Dict[str, Tuple[str, Tuple[int, ...], np.ndarray]]:
    """Maps a .safetensors file: {name: (dtype, shape, raw 1-D uint8 view into the file)}.

    Nothing is allocated from a length in the file before it is checked against the file's size
    (the header is at most 100 MiB).

    Raises:
        SafetensorsError: (a ValueError) the file is truncated, its header is not a JSON object of
            well-formed entries, or an entry's dtype, shape or offsets are invalid or past the end.
        OSError: the file cannot be opened or read.
    """
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
        except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: also 5000-digit ints
            raise SafetensorsError(f"{path}: header is not valid JSON ({type(e).__name__}: {str(e)[:100]})") from None
    if not isinstance(table, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    entries = {name: _table_entry(path, name, info, data_len) for name, info in table.items() if name != "__metadata__"}
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start, shape=(data_len,)) if data_len else np.zeros(0, np.uint8)
    return {name: (dtype, shape, mm[lo:hi]) for name, (dtype, shape, lo, hi) in entries.items()}


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
        index_json = _read_json(index)
        weight_map = index_json.get("weight_map", {}) if isinstance(index_json, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(x, str) for x in weight_map.values()):
            raise ValueError(f"{index}: weight_map is not an object of tensor name -> file name")
        files = sorted(set(weight_map.values()))
        if any(os.path.basename(x) != x or x in ("", ".", "..") for x in files):
            raise ValueError(f"{index}: shard names must be plain file names in the folder, got {files[:5]}")
        missing = [x for x in files if not os.path.isfile(os.path.join(folder, x))]
        if missing:
            raise FileNotFoundError(f"{folder}: shards named in model.safetensors.index.json are missing: {missing}")
        return [os.path.join(folder, x) for x in files]
    files = sorted(x for x in os.listdir(folder) if x.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    return [os.path.join(folder, x) for x in files]


def _read_json(path: str) -> object:
    """A JSON file's value; ValueError (never RecursionError) for text that is not JSON."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # ValueError: also bad UTF-8 and 5000-digit ints
        raise ValueError(f"{path} is not valid JSON ({type(e).__name__}: {str(e)[:100]})") from None


def read_config(folder: str) -> ModelConfig:
    """The ModelConfig of a Hugging Face folder's config.json (read by its family module).

    Raises:
        FileNotFoundError: no config.json.
        ValueError: config.json is not a JSON object, names an unsupported ``model_type``
            (:class:`sinklab.families.UnsupportedArchitecture`), or holds a value of the wrong
            type or range (sizes must be positive integers below 2^31, at most
            :data:`MAX_LAYERS` layers, RoPE bases and epsilons positive finite numbers, RoPE
            scaling one sinklab computes).
        KeyError: a required key (``hidden_size`` …) is missing.
    """
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{folder} has no config.json")
    c = _read_json(path)
    if not isinstance(c, dict):
        raise ValueError(f"{path} is not a JSON object")
    fam = families.for_hf_type(c.get("model_type"), path)
    for key in _LAYER_KEYS:  # families build per-layer tuples (windows) before ModelConfig checks
        n = c.get(key)
        if isinstance(n, (int, float)) and not isinstance(n, bool) and not n <= MAX_LAYERS:
            raise ValueError(f"{path}: {key}={n!r} is not a layer count sinklab loads (at most {MAX_LAYERS})")
    try:
        return fam.config_from_hf(c, path)
    except (TypeError, AttributeError, OverflowError, ZeroDivisionError, IndexError, RecursionError) as e:
        # a value of the wrong JSON type (a list where a size goes, a dict for rope_theta, 1e308
        # layers): the family reads config.json trusting its types; the user gets one ValueError
        raise ValueError(f"{path}: a config value has the wrong type or is out of range "
                         f"({type(e).__name__}: {str(e)[:200]})") from None


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
    (fp32 files are not copied), F16/BF16 matrices as QuantizedTensor. ValueError when the
    config states more layers than the files hold tensors (checked before the canonical names
    of every layer are listed: 2^31 layers would take hours)."""
    src = HFSource(folder)
    check_layer_count(cfg, len(src.names), folder)
    return families.family_of(cfg.family).weights(cfg, src)


def check_layer_count(cfg: ModelConfig, n_tensors: int, where: str) -> None:
    """ValueError unless ``n_tensors`` can hold ``cfg.n_layers`` layers (each has an attention
    and an MLP matrix at least)."""
    if 2 * cfg.n_layers > n_tensors:
        raise ValueError(f"{where}: the config states {cfg.n_layers} layers, but the files hold only "
                         f"{n_tensors} tensors (each layer has an attention and an MLP matrix at least)")


def rope_layout(cfg: ModelConfig) -> int:
    """Hugging Face files keep the half-split RoPE layout (0)."""
    return families.family_of(cfg.family).rope_layout("hf")
